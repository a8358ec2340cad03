"""Authorization across implementations, with the same `--auth-keys` on both sides.

The released `gazctl --broker.auth-keys` applies, appends, reads and lists against an
authorizing pygazette broker, and is refused without keys; pygazette's client and CLI with
`--auth-keys` do the same against an authorizing Gazette broker (`gazette serve
--broker.auth-keys`), and are refused without. Tokens signed by either side verify on the
other: the claims' JSON, capabilities and selectors are Gazette's.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.client import JournalClient, Reader, append, apply_journals, list_all
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import journal_spec
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import EtcdServer, GazetteBinaries, GazetteBroker

KEYS = base64.b64encode(b"interop-auth-key".ljust(32, b"i")).decode()
WRONG = base64.b64encode(b"not-the-key".ljust(32, b"w")).decode()
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 60

SPECS = """
name: sec/
replication: 1
labels:
- name: app
  value: sec
fragment:
  length: 4096
  compression_codec: SNAPPY
  stores:
  - file:///
  refresh_interval: 1s
children:
- name: sec/one
- name: sec/two
"""


@pytest.fixture
def secure_pygazette(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "pygazette" / "data", extra_args=["--auth-keys", KEYS])
    broker.data_dir.parent.mkdir(parents=True, exist_ok=True)
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture
def secure_gazette(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> Iterator[GazetteBroker]:
    broker = GazetteBroker(binaries.gazette, etcd, tmp_path / "gazette", auth_keys=KEYS)
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


def gazctl(
    binaries: GazetteBinaries, url: str, cwd: Path, *args: str, keys: str = "", stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    cmd = [str(binaries.gazctl), *args, f"--broker.address={url}", "--log.level=warn"]
    if keys:
        cmd.append(f"--broker.auth-keys={keys}")
    return subprocess.run(cmd, input=stdin, capture_output=True, timeout=TIMEOUT, cwd=cwd)


def ok(proc: subprocess.CompletedProcess[bytes]) -> bytes:
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


def test_gazctl_against_authorizing_pygazette(
    binaries: GazetteBinaries, secure_pygazette: BrokerProcess, tmp_path: Path
) -> None:
    url = secure_pygazette.url
    specs = tmp_path / "specs.yaml"
    specs.write_text(SPECS)

    # Without keys (or with the wrong ones): refused, and nothing applied.
    for keys in ("", WRONG):
        proc = gazctl(binaries, url, tmp_path, "journals", "apply", f"--specs={specs}", keys=keys)
        assert proc.returncode != 0
        assert b"Unauthenticated" in proc.stderr or b"Authorization" in proc.stderr, proc.stderr
    proc = gazctl(binaries, url, tmp_path, "journals", "list", keys=KEYS, stdin=b"")
    assert b"sec/one" not in ok(proc)

    ok(gazctl(binaries, url, tmp_path, "journals", "apply", f"--specs={specs}", keys=KEYS))
    ok(
        gazctl(
            binaries, url, tmp_path, "journals", "append", "-l", "name=sec/one",
            keys=KEYS, stdin=b"from gazctl\n",
        )
    )  # fmt: skip
    out = ok(gazctl(binaries, url, tmp_path, "journals", "read", "-l", "name=sec/one", keys=KEYS))
    assert out == b"from gazctl\n"
    out = ok(gazctl(binaries, url, tmp_path, "journals", "list", "--format=json", keys=KEYS))
    names = [j["spec"]["name"] for j in json.loads(out)["journals"]]
    assert names == ["sec/one", "sec/two"]
    ok(gazctl(binaries, url, tmp_path, "journals", "fragments", "-l", "name=sec/one", keys=KEYS))

    for args in (("journals", "list"), ("journals", "read", "-l", "name=sec/one")):
        proc = gazctl(binaries, url, tmp_path, *args)
        assert proc.returncode != 0, args
        assert b"missing or empty Authorization token" in proc.stderr, proc.stderr


async def test_pygazette_client_against_authorizing_gazette(secure_gazette: GazetteBroker) -> None:
    async with JournalClient(secure_gazette.url, auth=KeyedAuth(KEYS)) as client:
        changes = [
            pb.ApplyRequest.Change(upsert=journal_spec(f"sec/{n}", labels={"app": "sec"}))
            for n in ("one", "two")
        ]
        assert (await apply_journals(client, changes)).status == pb.OK
        resp = await append(client, "sec/one", b"from pygazette\n")
        assert resp.status == pb.OK
        reader = Reader(client, pb.ReadRequest(journal="sec/one", offset=0, block=False))
        assert await reader.read() == b"from pygazette\n"
        names = [j.spec.name for j in (await list_all(client, "app=sec")).journals]
        assert names == ["sec/one", "sec/two"]

    for auth in (None, KeyedAuth(WRONG)):
        async with JournalClient(secure_gazette.url, auth=auth) as client:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await list_all(client, "app=sec")
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await append(client, "sec/two", b"refused\n", max_attempts=1)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_pygazette_cli_against_authorizing_gazette(secure_gazette: GazetteBroker) -> None:
    def cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        env = dict(os.environ, BROKER_ADDRESS=secure_gazette.url)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env.pop("AUTH_KEYS", None)
        return subprocess.run(
            [sys.executable, "-m", "pygazette.cli.main", *args],
            input=stdin,
            capture_output=True,
            env=env,
            timeout=TIMEOUT,
        )

    specs = SPECS.encode()
    ok(cli("--auth-keys", KEYS, "journals", "apply", "--specs", "-", stdin=specs))
    ok(cli("--auth-keys", KEYS, "journals", "append", "-l", "name=sec/two", stdin=b"cli\n"))
    assert ok(cli("--auth-keys", KEYS, "journals", "read", "-l", "name=sec/two")) == b"cli\n"
    proc = cli("journals", "list")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.decode().splitlines() if line.strip()]
    assert len(lines) == 1 and "UNAUTHENTICATED" in lines[0], proc.stderr
