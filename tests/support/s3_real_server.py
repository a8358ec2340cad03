"""A real S3 server process on loopback (versitygw's posix backend), for the S3 store path.

MinIO, what Gazette's own test environment uses, is AGPL-licensed and the Go module proxy
refuses it; versitygw (Apache-2.0) is built from the proxy instead, by
`interop/build-s3server` into `interop/bin/versitygw` (`make s3server-bin`; this module
builds it too when it is missing). Unlike moto it is a real server: it verifies SigV4
signatures of requests and of presigned URLs, keeps objects as files of a directory
(`root/<bucket>/<key>`) that survive a restart, and is stopped and started like any process.

Credentials are the server's root account, given to brokers through their environment
(`env()`), never exported into the test process's own environment. A first start that finds
its port taken moves to another free port (tests/support/ports.py); restarts keep it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.ports import (
    PortInUse,
    ServerPort,
    listens_on,
    log_size,
    output_since,
    says_port_taken,
    start_retrying,
)

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "interop" / "build-s3server"
ACCESS_KEY = "pygazette-real-s3"
SECRET_KEY = "real-s3-secret-key-for-tests-only"
REGION = "us-east-1"


def server_binary() -> Path:
    """interop/bin/versitygw, built (once, cached) if missing or out of date."""
    binary = Path(os.environ.get("INTEROP_BIN", REPO / "interop" / "bin")) / "versitygw"
    proc = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not binary.exists():
        raise RuntimeError(
            f"cannot build the S3 server ({BUILD_SCRIPT}): {proc.stderr.strip()[-2000:]}"
        )
    return binary


def _xattrs_supported(directory: Path) -> bool:
    probe = directory / ".xattr-probe"
    probe.touch()
    try:
        os.setxattr(probe, "user.pygazette-probe", b"1")
    except OSError:
        return False
    finally:
        probe.unlink()
    return True


def credentials_env() -> dict[str, str]:
    """The environment a broker (or obstore in this process) reaches the server with."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
    }


class RealS3Server:
    """One versitygw process serving `root` (its buckets are root's directories)."""

    def __init__(self, work_dir: Path, *, port: int | None = None) -> None:
        self.root = work_dir / "root"
        self.root.mkdir(parents=True, exist_ok=True)
        # Object metadata (Content-Encoding...) lives in extended attributes of the object
        # files; on a file system without user xattrs, in a sidecar directory instead.
        self.backend_args: list[str] = []
        if not _xattrs_supported(self.root):
            self.backend_args = ["--sidecar", str(work_dir / "meta")]
        self._port = ServerPort(port)
        self.log_path = work_dir / f"versitygw-{self._port.peek()}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._binary: Path | None = None

    @property
    def port(self) -> int:
        return self._port.number

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start serving (again, on the same port and data, after `stop` or `kill`)."""
        assert not self.running(), "already running"
        if self._binary is None:
            self._binary = server_binary()
        start_retrying(lambda: self._start_once(timeout), [self._port])

    def _start_once(self, timeout: float) -> None:
        assert self._binary is not None
        endpoint = f"http://127.0.0.1:{self._port.peek()}"
        offset = log_size(self.log_path)  # This start's output begins here.
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                str(self._binary),
                "--port",
                f"127.0.0.1:{self._port.peek()}",
                "--access",
                ACCESS_KEY,
                "--secret",
                SECRET_KEY,
                "--region",
                REGION,
                "--quiet",
                "posix",
                *self.backend_args,
                str(self.root),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "VGW_"))},
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                output = output_since(self.log_path, offset)
                if says_port_taken(output):
                    raise PortInUse(f"{endpoint} was taken:\n{output[-2000:]}")
                raise RuntimeError(
                    f"versitygw exited early ({self.proc.returncode}):\n{self.log()}"
                )
            # Ours listening, not another process that took the port (it would answer).
            if not listens_on(self.proc.pid, self._port.peek()):
                time.sleep(0.05)
                continue
            try:
                with urllib.request.urlopen(endpoint + "/", timeout=1):
                    return
            except urllib.error.HTTPError:
                return  # Listening, and refusing the unsigned request as it should.
            except OSError:
                time.sleep(0.05)
        if says_port_taken(output_since(self.log_path, offset)):
            self.kill()
            raise PortInUse(f"{endpoint} was taken:\n{self.log()}")
        raise TimeoutError(f"versitygw did not come up on {endpoint}:\n{self.log()}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, and wait for the process to exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL: the store vanishes mid-request, as a crashed server would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def env(self) -> dict[str, str]:
        return credentials_env()

    def store_url(self, bucket: str, prefix: str = "", endpoint: str | None = None) -> str:
        path = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        return f"s3://{bucket}/{path}?endpoint={endpoint or self.endpoint}&region={REGION}"

    def object_file(self, bucket: str, key: str) -> Path:
        """The file the posix backend keeps an object in."""
        return self.root / bucket / key

    # The S3 API, through boto3 (a dependency of moto, which the fast tests use).

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"b-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def object_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key in `bucket` under `prefix`, from the S3 API's listing."""
        keys: list[str] = []
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        for page in pages:
            keys.extend(str(o["Key"]) for o in page.get("Contents", []))
        return sorted(keys)

    def get_object(self, bucket: str, key: str) -> tuple[bytes, str]:
        """(body, Content-Encoding) of an object, fetched without any decoding."""
        obj = self.client().get_object(Bucket=bucket, Key=key)
        return obj["Body"].read(), str(obj.get("ContentEncoding") or "")


@contextmanager
def running_real_s3(work_dir: Path) -> Iterator[RealS3Server]:
    """A started server, stopped on exit (whatever state the test left it in)."""
    server = RealS3Server(work_dir)
    server.start()
    try:
        yield server
    finally:
        server.kill()
