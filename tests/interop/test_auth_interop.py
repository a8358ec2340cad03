"""Authorization across implementations, with the same `--auth-keys` on both sides.

The released `gazctl --broker.auth-keys` applies, appends, reads and lists against an
authorizing pygazette broker, and is refused without keys; pygazette's client and CLI with
`--auth-keys` do the same against an authorizing Gazette broker (`gazette serve
--broker.auth-keys`), and are refused without. Tokens signed by either side verify on the
other: the claims' JSON, capabilities and selectors are Gazette's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.auth.capability import Capability
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.client import JournalClient, Reader, append, apply_journals, list_all
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
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


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _token(payload: dict[str, object], key: bytes, header: dict[str, object] | None = None) -> str:
    """A token signed as written (PyJWT's encoder refuses some of these headers)."""
    head = header or {"alg": "HS256", "typ": "JWT"}
    alg = str(head.get("alg"))
    digest = {"HS384": hashlib.sha384, "HS512": hashlib.sha512}.get(alg, hashlib.sha256)
    signed = _b64(json.dumps(head).encode()) + "." + _b64(json.dumps(payload).encode())
    return signed + "." + _b64(hmac.new(key, signed.encode(), digest).digest())


def test_tokens_are_refused_as_gazettes_refuses_them(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    """The same tokens to Gazette's and pygazette's brokers, both with two `--auth-keys`
    (rotation): each is served or refused alike, with the same code and message."""
    keys = f"{KEYS},{WRONG}"
    gazette = GazetteBroker(binaries.gazette, etcd, tmp_path / "gazette", auth_keys=keys)
    gazette.start()
    pygazette = BrokerProcess(tmp_path / "pygazette" / "data", extra_args=["--auth-keys", keys])
    pygazette.data_dir.parent.mkdir(parents=True, exist_ok=True)
    pygazette.start()
    first, second = base64.b64decode(KEYS), base64.b64decode(WRONG)
    now = int(time.time())
    claims: dict[str, object] = {"cap": int(Capability.READ), "exp": now + 600}
    tokens = {
        "first key": _token(claims, first),
        "second key": _token(claims, second),
        "hs384": _token(claims, second, {"alg": "HS384", "typ": "JWT"}),
        "another key": _token(claims, b"another key"),
        "hs512": _token(claims, first, {"alg": "HS512", "typ": "JWT"}),
        "none": _token(claims, first, {"alg": "none", "typ": "JWT"}),
        "unknown alg": _token(claims, first, {"alg": "XY256", "typ": "JWT"}),
        "no alg": _token(claims, first, {"typ": "JWT"}),
        "two segments": "abc.def",
        "four segments": _token(claims, first) + ".x",
        "expired": _token({**claims, "exp": now - 60}, first),
        "no exp": _token({"cap": int(Capability.READ)}, first),
        "issued later": _token({**claims, "iat": now + 60}, first),
        "not yet valid": _token({**claims, "nbf": now + 60}, first),
        "within leeway": _token({**claims, "exp": now - 2, "iat": now + 2, "nbf": now + 2}, first),
    }
    try:
        answers = {}
        for broker in (gazette, pygazette):
            with grpc.insecure_channel(broker.address) as channel:
                stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
                for name, token in tokens.items():
                    req = pb.ReadRequest(journal="sec/none", offset=0)
                    md = (("authorization", f"Bearer {token}"),)
                    try:
                        first_resp = next(iter(stub.Read(req, metadata=md, timeout=10)))
                        answer = pb.Status.Name(first_resp.status)
                    except grpc.RpcError as exc:
                        answer = f"{exc.code().name}: {exc.details()}"
                    answers[broker is gazette, name] = answer
        assert answers[True, "first key"] == "JOURNAL_NOT_FOUND"  # Served.
        assert answers[True, "another key"].startswith("UNAUTHENTICATED: verifying")
        differ = {
            name: (answers[True, name], answers[False, name])
            for name in tokens
            if answers[True, name] != answers[False, name]
        }
        assert differ == {}
    finally:
        pygazette.kill()
        gazette.kill()


def test_reads_and_watches_end_at_expiry_as_gazettes_do(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    """A blocking Read and a watched List whose token expires end as Gazette's brokers end
    them: the stream closes (EOF), no error, which Gazette's RetryReader resumes without a
    warning; an Append in flight at expiry fails."""
    gazette = GazetteBroker(binaries.gazette, etcd, tmp_path / "gazette", auth_keys=KEYS)
    gazette.start()
    pygazette = BrokerProcess(tmp_path / "pygazette" / "data", extra_args=["--auth-keys", KEYS])
    pygazette.data_dir.parent.mkdir(parents=True, exist_ok=True)
    pygazette.start()
    key = base64.b64decode(KEYS)
    every = (("authorization", "Bearer " + _token({"cap": 0xFFFFFFFF, "exp": 2**40}, key)),)
    try:
        ended = {}
        for broker in (gazette, pygazette):
            with grpc.insecure_channel(broker.address) as channel:
                stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
                change = pb.ApplyRequest.Change(upsert=journal_spec("sec/expiry"))
                assert stub.Apply(pb.ApplyRequest(changes=[change]), metadata=every).status == 0
                deadline = time.monotonic() + 30
                while True:  # Until the journal is served (a broker assigned).
                    chunks = [pb.AppendRequest(journal="sec/expiry"), pb.AppendRequest()]
                    status = stub.Append(iter(chunks), metadata=every).status
                    if status == pb.OK or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                assert status == pb.OK
                for name in ("read", "watch"):
                    short = int(time.time()) + 3
                    token = _token({"cap": 0xFFFFFFFF, "exp": short}, key)
                    md = (("authorization", f"Bearer {token}"),)
                    try:
                        if name == "read":
                            req = pb.ReadRequest(journal="sec/expiry", offset=-1, block=True)
                            responses = list(stub.Read(req, metadata=md, timeout=40))
                        else:
                            responses = list(stub.List(pb.ListRequest(watch=True), metadata=md))
                        statuses = {pb.Status.Name(r.status) for r in responses}
                        ended[broker is gazette, name] = ("EOF", statuses)
                    except grpc.RpcError as exc:
                        ended[broker is gazette, name] = (exc.code().name, set())
                    assert time.time() < short + 30, name
        assert ended[True, "read"][0] == ended[True, "watch"][0] == "EOF", ended
        assert ended[False, "read"] == ended[True, "read"]
        assert ended[False, "watch"][0] == "EOF", ended
    finally:
        pygazette.kill()
        gazette.kill()
