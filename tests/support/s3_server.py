"""A local S3-compatible server (`moto_server`) on loopback, for tests of the S3 store path.

The server process is started once per test session (it takes a second or two) and every
test makes its own bucket. Credentials are dummies, exported into the environment so that
brokers started by the tests inherit them. A first start that finds its port taken moves
to another free port (tests/support/ports.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from tests.support.ports import (
    PortInUse,
    ServerPort,
    listens_on,
    log_size,
    output_since,
    says_port_taken,
    start_retrying,
)

ACCESS_KEY = "testing-access-key"
SECRET_KEY = "testing-secret-key"
REGION = "us-east-1"


class S3Server:
    def __init__(self, log_dir: Path) -> None:
        self._port = ServerPort()
        self.log_path = log_dir / f"moto-{self._port.peek()}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return self._port.number

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        start_retrying(lambda: self._start_once(timeout), [self._port])

    def _start_once(self, timeout: float) -> None:
        port = self._port.peek()
        endpoint = f"http://127.0.0.1:{port}"
        offset = log_size(self.log_path)  # This start's output begins here.
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                output = output_since(self.log_path, offset)
                if says_port_taken(output):
                    raise PortInUse(f"{endpoint} was taken:\n{output[-2000:]}")
                raise RuntimeError(f"moto_server exited early:\n{self.log()}")
            # Ours listening, not another process that took the port (it would answer).
            if not listens_on(self.proc.pid, port):
                time.sleep(0.05)
                continue
            try:
                with urllib.request.urlopen(endpoint + "/", timeout=1):
                    return
            except urllib.error.HTTPError:
                return  # Listening (and answering S3 errors).
            except OSError:
                time.sleep(0.05)
        if says_port_taken(output_since(self.log_path, offset)):
            self.stop()
            raise PortInUse(f"{endpoint} was taken:\n{self.log()}")
        raise TimeoutError(f"moto_server did not come up:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"b-{uuid.uuid4().hex[:16]}"
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(req, timeout=10):
            pass
        return name

    def store_url(self, bucket: str, prefix: str = "", endpoint: str | None = None) -> str:
        path = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        return f"s3://{bucket}/{path}?endpoint={endpoint or self.endpoint}&region={REGION}"

    def object_keys(self, bucket: str) -> list[str]:
        """Every key in `bucket`, via the S3 API (boto3, which moto depends on)."""
        return sorted(o["Key"] for o in self._objects(bucket))

    def _objects(self, bucket: str) -> list[dict[str, object]]:
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )
        out: list[dict[str, object]] = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            out.extend(page.get("Contents", []))
        return out

    def get_object(self, bucket: str, key: str) -> tuple[bytes, str]:
        """(body, Content-Encoding) of an object, fetched without any decoding."""
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )
        obj = s3.get_object(Bucket=bucket, Key=key)
        return obj["Body"].read(), str(obj.get("ContentEncoding") or "")


def export_credentials() -> dict[str, str | None]:
    """Put dummy AWS credentials into the environment; returns what to restore."""
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
    os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
    return saved


def restore_environment(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
