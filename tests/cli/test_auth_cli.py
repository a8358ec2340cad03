"""The real `pygazette` CLI against an authorizing broker (`serve --auth-keys`): with
`--auth-keys` (or $AUTH_KEYS, or a token) every command works; without, one clear line."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims, label_selector
from pygazette.auth.keyed_auth import KeyedAuth
from tests.cli.test_journals_cli import EXAMPLE, cli, ok, one_line_error
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess

KEYS = base64.b64encode(b"cli-auth-key".ljust(32, b"k")).decode()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(
        tmp_path_factory.mktemp("cli-auth") / "data", extra_args=["--auth-keys", KEYS]
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def test_cli_with_auth_keys(broker: BrokerProcess) -> None:
    auth = ["--auth-keys", KEYS]
    ok(cli(broker.url, *auth, "journals", "apply", "--specs", str(EXAMPLE)))
    ok(
        cli(
            broker.url,
            *auth,
            "journals",
            "append",
            "-l",
            "name=examples/logs/app",
            stdin=b"hello\n",
        )
    )
    out = ok(cli(broker.url, *auth, "journals", "read", "-l", "name=examples/logs/app"))
    assert out == b"hello\n"
    listed = json.loads(ok(cli(broker.url, *auth, "journals", "list", "--format", "json")))
    assert "examples/logs/app" in [j["spec"]["name"] for j in listed["journals"]]
    ok(cli(broker.url, *auth, "journals", "fragments", "-l", "name=examples/logs/app"))
    ok(cli(broker.url, *auth, "journals", "prune", "-l", "name=examples/logs/app", "--dry-run"))


def test_cli_without_auth_fails_with_one_line(broker: BrokerProcess) -> None:
    err = one_line_error(cli(broker.url, "journals", "list"))
    assert "UNAUTHENTICATED" in err and "missing or empty Authorization token" in err
    err = one_line_error(
        cli(broker.url, "--auth-keys", base64.b64encode(b"w" * 32).decode(), "journals", "list")
    )
    assert "UNAUTHENTICATED" in err
    proc = cli(broker.url, "--auth-keys", "not*base64", "journals", "list")
    assert proc.returncode != 0 and b"--auth-keys" in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_cli_with_a_token(broker: BrokerProcess) -> None:
    # A token of other journals lists none of these.
    other = KeyedAuth(KEYS).sign(Claims(Capability.LIST, label_selector(include={"app": "x"})))
    out = ok(cli(broker.url, "--auth-token", other, "journals", "list", "--format", "json"))
    assert not json.loads(out).get("journals")
    token = KeyedAuth(KEYS).sign(Claims(Capability.LIST))
    ok(cli(broker.url, "--auth-token", token, "journals", "list"))
    # Listing is all this token may do.
    err = one_line_error(
        cli(broker.url, "--auth-token", token, "journals", "read", "-l", "name=examples/logs/app")
    )
    assert "PERMISSION_DENIED" in err and "READ capability" in err


FLAGS_SPEC = """
name: flags/one
replication: 1
fragment: {length: 1048576, compression_codec: NONE, stores: [file:///], refresh_interval: 1m0s}
"""


def test_gazctls_flag_spellings_anywhere_after_the_command(broker: BrokerProcess) -> None:
    """gazctl's --broker.address, --broker.auth-keys, --broker.auth-token and --log.level,
    before the command or after it (its group's options, as go-flags takes them)."""
    nowhere = "http://127.0.0.1:1"  # $BROKER_ADDRESS: only the flags reach the broker.
    ok(
        cli(
            nowhere,
            "journals",
            "apply",
            "--broker.address",
            broker.url,
            f"--broker.auth-keys={KEYS}",
            "--log.level=warn",
            stdin=FLAGS_SPEC.encode(),
        )
    )
    token = KeyedAuth(KEYS).sign(Claims(Capability.LIST))
    for args in (
        ["journals", "list", "--broker.address", broker.url, "--broker.auth-token", token],
        ["journals", f"--broker.address={broker.url}", "--broker.auth-token", token, "list"],
        ["--broker.address", broker.url, "--broker.auth-token", token, "journals", "list"],
    ):
        out = ok(cli(nowhere, *args, "--format", "json"))
        names = [j["spec"]["name"] for j in json.loads(out)["journals"]]
        assert "flags/one" in names, args
    # A pygazette --broker of the subcommand still wins over the root's.
    out = ok(
        cli(
            nowhere,
            "--broker.address",
            nowhere,
            "journals",
            "list",
            "--broker",
            broker.url,
            "--broker.auth-token",
            token,
        )
    )
    assert b"flags/one" in out
    # After '--' nothing is taken as a flag.
    err = one_line_error(cli(broker.url, "journals", "list", "--", "--broker.address", broker.url))
    assert "unexpected extra argument" in err


def test_consumer_auth_keys_sign_rpcs_to_consumers(tmp_path: Path) -> None:
    """gazctl's --consumer.auth-keys ($CONSUMER_AUTH_KEYS) and --consumer.address: RPCs to a
    consumer are signed with the consumer's keys, those to brokers with the brokers'."""
    consumer_keys = base64.b64encode(b"consumer-only-key".ljust(32, b"c")).decode()
    # The broker takes tokens of both keys (the consumer signs its own RPCs to it with its
    # key); the consumer takes only its own.
    broker = BrokerProcess(
        tmp_path / "broker", extra_args=["--auth-keys", f"{KEYS},{consumer_keys}"]
    )
    broker.start()
    consumer = ConsumerProcess(
        tmp_path / "consumer",
        app="tests.consumer.apps:Counter",
        broker=broker.url,
        extra_args=["--auth-keys", consumer_keys],
        env={"COUNTER_OUTPUT": "tests/cli-auth/out"},
    )
    try:
        consumer.start()
        base = [
            "--auth-keys",
            KEYS,
            "shards",
            "list",
            "--consumer.address",
            consumer.url,
            "--format",
            "json",
        ]
        # Signed with the brokers' key, the consumer refuses the List.
        err = one_line_error(cli(broker.url, *base))
        assert "UNAUTHENTICATED" in err
        ok(cli(broker.url, *base, "--consumer.auth-keys", consumer_keys))
        ok(cli(broker.url, *base, env={"CONSUMER_AUTH_KEYS": consumer_keys}))
        token = KeyedAuth(consumer_keys).sign(Claims(Capability.LIST))
        ok(cli(broker.url, *base, env={"CONSUMER_AUTH_TOKEN": token}))
    finally:
        consumer.stop()
        broker.stop()
