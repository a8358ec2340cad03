"""A consumer process serving its Shard service over mTLS, reading and appending through an
mTLS broker, on an etcd that requires TLS client certificates; driven by the CLI's
`--consumer-*` and `--broker-*` TLS flags."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pygazette.auth.tls import ClientTLS
from pygazette.client.appender import append
from pygazette.client.journal_client import JournalClient
from pygazette.consumer.shard_client import ShardClient
from pygazette.protocol.pb import consumer_pb2 as cpb
from tests.cli.test_shards_cli import journalspace, shardspace
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess
from tests.support.etcd_process import EtcdProcess, etcd_binary
from tests.support.tls_material import TLSMaterial, generate_tls_material

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
APP = "tests.consumer.apps:Counter"
OUTPUT = "tls-shards/out"


def server_flags(m: TLSMaterial) -> list[str]:
    return [
        "--server-cert-file",
        str(m.server_cert),
        "--server-cert-key-file",
        str(m.server_key),
        "--server-ca-file",
        str(m.ca),
    ]


def client_flags(service: str, m: TLSMaterial, *, cert: bool = True) -> list[str]:
    flags = [f"--{service}-trusted-ca-file", str(m.ca)]
    if cert:
        flags += [
            f"--{service}-cert-file",
            str(m.client_cert),
            f"--{service}-cert-key-file",
            str(m.client_key),
        ]
    return flags


class TLSDeployment:
    def __init__(self, m: TLSMaterial, broker: BrokerProcess, consumer: ConsumerProcess) -> None:
        self.m = m
        self.broker = broker
        self.consumer = consumer
        self.tls = ClientTLS(m.ca, m.client_cert, m.client_key)

    def cli(
        self, *args: str, stdin: str = "", consumer_cert: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, CONSUMER_ADDRESS=self.consumer.url)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        root = [
            "--broker",
            self.broker.url,
            *client_flags("broker", self.m),
            *client_flags("consumer", self.m, cert=consumer_cert),
        ]
        return subprocess.run(
            [sys.executable, "-m", "pygazette.cli.main", *root, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=120,
        )


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSDeployment]:
    if etcd_binary() is None:
        pytest.fail("etcd is not installed; run .ci/install-system-deps")
    tmp = tmp_path_factory.mktemp("consumer-tls")
    m = generate_tls_material(tmp / "tls")
    client_tls = ClientTLS(m.ca, m.client_cert, m.client_key)
    etcd = EtcdProcess(tmp / "etcd" / "data", tls=m)
    broker = BrokerProcess(tmp / "broker", extra_args=server_flags(m), tls=client_tls)
    consumer = ConsumerProcess(
        tmp / "consumer",
        app=APP,
        broker=f"https://127.0.0.1:{broker.port}",
        etcd_prefix=f"/test-{uuid.uuid4().hex[:12]}/consumers/counter",
        extra_args=[
            *etcd.client_flags,
            *server_flags(m),
            *client_flags("broker", m),
            "--hints-interval",
            "1s",
        ],
        env={"COUNTER_OUTPUT": OUTPUT},
        tls=client_tls,
    )
    try:
        (tmp / "etcd").mkdir()
        etcd.start()
        broker.start()
        consumer.start()
        yield TLSDeployment(m, broker, consumer)
    finally:
        consumer.kill()
        broker.kill()
        etcd.stop()


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def test_consumer_serves_over_mtls(deployment: TLSDeployment) -> None:
    dep = deployment
    prefix = "tls"
    shard = "tls-shard-1"
    ok(
        dep.cli(
            "journals",
            "apply",
            "--specs",
            "-",
            stdin=journalspace(
                f"{prefix}/",
                [f"{prefix}/in/a", f"{prefix}/in/b"],
                [f"{prefix}/recovery/{shard}"],
            ),
        )
    )
    ok(dep.cli("journals", "apply", "--specs", "-", stdin=journalspace("tls-shards/", [OUTPUT])))
    ok(dep.cli("shards", "apply", "--specs", "-", stdin=shardspace(prefix, f"- id: {shard}\n")))

    # The shard becomes primary: `shards list` over mTLS shows it.
    deadline = time.monotonic() + 60
    while True:
        out = ok(dep.cli("shards", "list", "-l", f"id={shard}", "--format", "json"))
        shards = json.loads(out).get("shards", [])
        codes = [s.get("status", [{}])[0].get("code") for s in shards]
        if codes == ["PRIMARY"]:
            break
        assert time.monotonic() < deadline, out
        time.sleep(0.1)
    route = shards[0]["route"]
    assert all(e.startswith("https://127.0.0.1:") for e in route["endpoints"]), route

    # It consumes over TLS from the broker: a Stat waits for what was appended.
    async def consume() -> None:
        async with (
            JournalClient(dep.broker.url, tls=dep.tls) as journals,
            ShardClient(dep.consumer.url, tls=dep.tls) as shards,
        ):
            lines = b"".join(json.dumps({"key": k}).encode() + b"\n" for k in "abca")
            resp = await append(journals, f"{prefix}/in/a", lines)
            stat = await shards.stat(shard, {f"{prefix}/in/a": resp.commit.end}, within=60)
            assert stat.status == cpb.Status.OK

    asyncio.run(consume())

    # Without a client certificate the consumer refuses the connection, in one clear line.
    nocert = one_line_error(dep.cli("shards", "list", consumer_cert=False))
    assert f"consumer unavailable at {dep.consumer.url}: TLS handshake failed" in nocert
    assert "requires a client certificate (mTLS), and none was given" in nocert
