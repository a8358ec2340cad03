"""What the `pygazette` command imports to start: each subcommand's module only when it runs,
no broker and no Spark for client commands, and packages whose names load on first use.

These tests check imports (the cause of a slow start), not milliseconds: start-up time is
measured by `python -X importtime` and `time pygazette --help`, not asserted here.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from pygazette.cli.lazy_group import LazyGroup
from pygazette.cli.main import SUBCOMMANDS, cli, run
from tests.support.broker_process import BrokerProcess

REPO = Path(__file__).resolve().parents[2]

# Runs the CLI entry point as `pygazette` does, then reports what was imported.
PROBE = """
import json, sys
from pygazette.cli.main import run
argv = json.loads(sys.argv[1])
code = run(argv)
sys.stdout.flush()
sys.stderr.write("\\nMODULES " + json.dumps({"code": code, "modules": sorted(sys.modules)}) + "\\n")
"""


def imported_by(*argv: str, stdin: bytes = b"") -> set[str]:
    """The modules loaded by `pygazette ARGV` in a fresh interpreter (it must succeed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(argv))],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    stderr = proc.stderr.decode(errors="replace")
    report = next(
        (line for line in stderr.splitlines() if line.startswith("MODULES ")), None
    )
    assert report is not None, stderr
    result = json.loads(report.removeprefix("MODULES "))
    assert result["code"] == 0, stderr
    return set(result["modules"])


def under(modules: set[str], *packages: str) -> list[str]:
    """The modules that are one of `packages` or inside one."""
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


HEAVY = ("pygazette.broker", "pyspark", "pygazette.spark", "pygazette.gateway", "aiohttp")


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["journals", "--help"],
        ["journals", "list", "--help"],
        ["journals", "append", "--help"],
        ["journals", "read", "--help"],
        ["shards", "list", "--help"],
        ["attach-uuids", "--help"],
    ],
    ids=" ".join,
)
def test_help_imports_neither_broker_nor_spark(argv: list[str]) -> None:
    modules = imported_by(*argv)
    assert under(modules, *HEAVY) == []
    assert under(modules, "pygazette.keyspace", "pygazette.allocator") == []


def test_root_help_imports_no_subcommand() -> None:
    """The listing of `pygazette --help` comes from static help lines: no subcommand module,
    no gRPC, no protobuf, no TLS or JWT libraries."""
    modules = imported_by("--help")
    assert under(modules, *(lazy.module for lazy in SUBCOMMANDS.values())) == []
    assert under(modules, "grpc", "google.protobuf", "cryptography", "jwt", "yaml") == []
    assert under(modules, "pygazette.client") == ["pygazette.client", "pygazette.client.defaults"]


def test_journals_commands_import_only_the_client(broker: BrokerProcess) -> None:
    """`journals read` and `journals list` against a real broker: the client and message
    framing, never the consumer framework, the HTTP gateway, the broker or Spark."""
    base = ["--broker", broker.url]
    spec = "name: startup/one\nreplication: 1\nlabels:\n- name: content-type\n"
    spec += "  value: application/x-ndjson\nfragment:\n  length: 1048576\n"
    spec += "  refresh_interval: 1m\n  compression_codec: NONE\n"
    modules = imported_by(*base, "journals", "apply", "--specs", "-", stdin=spec.encode())
    assert under(modules, *HEAVY, "pygazette.consumer") == []

    modules = imported_by(
        *base, "journals", "append", "-l", "name=startup/one", stdin=b'{"n": 1}\n'
    )
    assert under(modules, *HEAVY, "pygazette.consumer") == []
    assert "pygazette.client.appender" in modules

    modules = imported_by(*base, "journals", "read", "-l", "name=startup/one")
    assert under(modules, *HEAVY, "pygazette.consumer") == []
    assert "pygazette.client.retry_reader" in modules

    modules = imported_by(*base, "journals", "list")
    assert under(modules, *HEAVY, "pygazette.consumer") == []
    # Listing needs neither the append pipeline, nor the reader, nor YAML or TLS libraries.
    assert under(modules, "pygazette.client.append_service", "pygazette.client.retry_reader") == []
    assert under(modules, "pygazette.message", "yaml", "cryptography", "jwt") == []


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_static_help_lines_match_the_commands(name: str) -> None:
    """The listing shows for each unloaded subcommand what click would show for it loaded."""
    assert isinstance(cli, LazyGroup)
    loaded = SUBCOMMANDS[name].load()
    assert loaded.name == name
    for limit in (30, 45, 60, 80, 200):
        assert cli.listing_help(name, limit) == _unloaded(name).listing_help(name, limit)
        assert _unloaded(name).listing_help(name, limit) == loaded.get_short_help_str(limit)


def _unloaded(name: str) -> LazyGroup:
    return LazyGroup("probe", lazy_commands={name: SUBCOMMANDS[name]})


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--help"]) == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert f"\n  {name} " in out, out
    assert "Interact with broker journals." in out


def test_journals_subcommands_include_prune(capsys: pytest.CaptureFixture[str]) -> None:
    """`journals prune` and `store-health` live in another module, loaded with `journals`."""
    assert run(["journals", "--help"]) == 0
    out = capsys.readouterr().out
    for name in ("apply", "list", "append", "read", "fragments", "prune", "store-health"):
        assert f"\n  {name} " in out, out


def test_unknown_subcommand_suggests_unloaded_ones(capsys: pytest.CaptureFixture[str]) -> None:
    group = LazyGroup("probe", lazy_commands={"journals": SUBCOMMANDS["journals"]})
    with pytest.raises(click.UsageError) as raised:
        group.main(["jornals"], standalone_mode=False)
    assert "journals" in raised.value.format_message()
    assert run(["jornals"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: No such command 'jornals'."), err
    assert len(err.strip().splitlines()) == 1


# Packages that export their modules' names lazily (PEP 562).
LAZY_PACKAGES = [
    "pygazette.client",
    "pygazette.message",
    "pygazette.protocol",
    "pygazette.consumer.recoverylog",
    "pygazette.spark",
]


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_exported_name_resolves(package: str) -> None:
    """Each name of `__all__` is importable from the package and is its module's object."""
    pkg = importlib.import_module(package)
    exports: dict[str, str] = pkg._EXPORTS
    assert set(exports) <= set(pkg.__all__)
    for name in pkg.__all__:
        value = getattr(pkg, name)
        if name in exports:
            assert value is getattr(importlib.import_module(exports[name]), name), name
    assert set(pkg.__all__) <= set(dir(pkg))
    with pytest.raises(AttributeError):
        _ = pkg.NoSuchName
    with pytest.raises(ImportError):
        exec(f"from {package} import NoSuchName", {})


def test_packages_import_nothing_until_used() -> None:
    """Importing a package, or one module of it, does not import its other modules."""
    code = (
        "import sys, json\n"
        "import pygazette.client, pygazette.message, pygazette.protocol, pygazette.spark\n"
        "import pygazette.client.journal_client\n"
        "from pygazette.client import JournalClient\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, env=env, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    modules = set(json.loads(proc.stdout))
    assert "pygazette.client.journal_client" in modules
    assert under(
        modules,
        "pygazette.client.append_service",
        "pygazette.client.sync_client",
        "pygazette.message.publisher",
        "pygazette.spark.source",
        "pyspark",
    ) == []
