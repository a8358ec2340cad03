"""`pygazette journals edit` (as `gazctl journals edit`): the selected journals' YAML in an
editor, applied when it changed; an edit that fails to apply reopens with the error; an
empty or unchanged file cancels."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from tests.cli.test_journals_cli import apply_example, cli, ok, one_line_error
from tests.cli.test_shards_cli import EDITOR
from tests.support.broker_process import BrokerProcess


def edit(
    broker: BrokerProcess, tmp_path: Path, selector: str, steps: list[dict[str, str]]
) -> tuple[subprocess.CompletedProcess[bytes], list[str]]:
    """Run `journals edit` with an editor that takes `steps` in turn; returns the process
    and what the editor was shown each time."""
    script = tmp_path / "editor.py"
    script.write_text(EDITOR)
    state = tmp_path / f"edit-{uuid.uuid4().hex}.json"
    env = {
        "GAZ_EDITOR": f"{sys.executable} {script}",
        "EDIT_STATE": str(state),
        "EDIT_STEPS": json.dumps(steps),
        "TMPDIR": str(tmp_path),
    }
    proc = cli(broker.url, "journals", "edit", "-l", selector, env=env)
    shown: list[str] = json.loads(state.read_text()) if state.exists() else []
    return proc, shown


def flush_interval(broker: BrokerProcess, name: str) -> str:
    out = ok(cli(broker.url, "journals", "list", "-l", f"name={name}", "--format", "json"))
    return str(json.loads(out)["journals"][0]["spec"]["fragment"]["flush_interval"])


def test_edit_applies_the_edited_specs(broker: BrokerProcess, tmp_path: Path) -> None:
    apply_example(broker)
    name = "examples/clicks/part-000"
    proc, shown = edit(
        broker, tmp_path, f"name={name}", [{"do": "replace", "old": "10m0s", "new": "20m0s"}]
    )
    assert ok(proc).decode().startswith("applied journal changes at revision ")
    assert len(shown) == 1 and shown[0].startswith("#⚙ Edit the spec below.")
    assert f"name: {name}" in shown[0] and "revision: " in shown[0]
    assert flush_interval(broker, name) in ("1200s", "1200.000s")
    assert not list(tmp_path.glob("pygazette-journals-edit-*"))  # The temp file is gone.

    # An invalid spec reopens the editor with the error; fixed, it applies.
    proc, shown = edit(
        broker,
        tmp_path,
        f"name={name}",
        [
            {"do": "replace", "old": "20m0s", "new": "1s"},
            {"do": "replace", "old": "flush_interval: 1s", "new": "flush_interval: 30m0s"},
        ],
    )
    assert ok(proc).decode().startswith("applied journal changes at revision ")
    assert len(shown) == 2 and "FlushInterval" in shown[1], shown[1]
    assert flush_interval(broker, name) in ("1800s", "1800.000s")

    # Unchanged, or empty: cancelled.
    proc, _ = edit(broker, tmp_path, f"name={name}", [{"do": "replace", "old": "", "new": ""}])
    assert ok(proc) == b"" and b"Cancelled; nothing to do." in proc.stderr
    proc, _ = edit(broker, tmp_path, f"name={name}", [{"do": "empty"}])
    assert ok(proc) == b"" and b"Cancelled; empty file." in proc.stderr

    nothing = one_line_error(cli(broker.url, "journals", "edit", "-l", "name=examples/none"))
    assert "examples/none" in nothing


def test_an_edit_applied_in_part_is_not_reopened(broker: BrokerProcess, tmp_path: Path) -> None:
    """An edit applied in several transactions, of which a later one fails: the earlier ones
    stay applied, so the edits no longer apply as they are (their revisions are stale). It
    was reopened under "No changes were applied", and saved unchanged it was cancelled with
    exit status 0. Now the command fails, saying what stayed applied, and keeps the edits."""
    names = [f"part/j-{c}" for c in "abcd"]
    specs = "".join(f"- name: {n}\n" for n in names)
    base = (
        "name: part/\nreplication: 1\nfragment: {length: 1048576, compression_codec: NONE, "
        "refresh_interval: 1m0s}\nchildren:\n"
    )
    ok(cli(broker.url, "journals", "apply", "--specs", "-", stdin=(base + specs).encode()))
    # While the editor is open, part/j-d changes (another operator).
    other = tmp_path / "other.yaml"
    other.write_text(base + "- name: part/j-d\n  max_append_rate: 1000\n  revision: -1\n")
    concurrent = f"{sys.executable} -m pygazette.cli.main journals apply --specs {other}"
    script = tmp_path / "editor.py"
    script.write_text(EDITOR)
    state = tmp_path / "edit-state.json"
    steps = [
        {
            "do": "run-then-replace",
            "cmd": concurrent,
            "old": "replication: 1",
            "new": "replication: 2",
        }
    ]
    env = {
        "GAZ_EDITOR": f"{sys.executable} {script}",
        "EDIT_STATE": str(state),
        "EDIT_STEPS": json.dumps(steps),
        "TMPDIR": str(tmp_path),
    }
    proc = cli(broker.url, "journals", "edit", "-l", "prefix=part/", "--max-txn-size", "2", env=env)
    assert proc.returncode != 0, proc.stderr
    assert len(json.loads(state.read_text())) == 1  # Not reopened.
    err = proc.stderr.decode()
    assert "ETCD_TRANSACTION_FAILED" in err and "the 2 change(s) before it stay applied" in err
    assert "Last edits saved to" in err
    listed = json.loads(ok(cli(broker.url, "journals", "list", "-l", "prefix=part/", "-o", "json")))
    assert [j["spec"]["replication"] for j in listed["journals"]] == [2, 2, 1, 1]
