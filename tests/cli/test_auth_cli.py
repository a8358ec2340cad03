"""The real `pygazette` CLI against an authorizing broker (`serve --auth-keys`): with
`--auth-keys` (or $AUTH_KEYS, or a token) every command works; without, one clear line."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest

from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims, label_selector
from pygazette.auth.keyed_auth import KeyedAuth
from tests.cli.test_journals_cli import EXAMPLE, cli, ok, one_line_error
from tests.support.broker_process import BrokerProcess

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
