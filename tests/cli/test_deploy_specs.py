"""deploy_specs: the examples' journalspaces and shardspaces, adapted for deploy/'s apply
Jobs, still parse (with the store, replication and revision -1 they were given)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pygazette.cli.deploy_specs import SpecsError, adapt_journalspace, adapt_shardspace
from pygazette.cli.journalspace import apply_request, parse_journalspace
from pygazette.cli.shardspace import apply_request as shards_apply_request
from pygazette.cli.shardspace import parse_shardspace

REPO = Path(__file__).resolve().parents[2]
STORE = "s3://pygazette-fragments/?endpoint=http://s3:7070&region=us-east-1"


@pytest.mark.parametrize("example", ["stream_sum", "word_count"])
def test_journalspace_gets_store_replication_and_revisions(example: str) -> None:
    path = REPO / "examples" / example / "journalspace.yaml"
    doc = adapt_journalspace(yaml.safe_load(path.read_text()), store=STORE, replication=3)
    request = apply_request(parse_journalspace(yaml.safe_dump(doc)))
    upserts = [c for c in request.changes if c.HasField("upsert")]
    assert upserts and len(upserts) == len(request.changes)
    for change in upserts:
        assert change.expect_mod_revision == -1
        assert change.upsert.replication == 3
        assert list(change.upsert.fragment.stores) == [STORE]


@pytest.mark.parametrize("example", ["stream_sum", "word_count"])
def test_shardspace_gets_revisions(example: str) -> None:
    path = REPO / "examples" / example / "shards.yaml"
    doc = adapt_shardspace(yaml.safe_load(path.read_text()))
    request = shards_apply_request(parse_shardspace(yaml.safe_dump(doc)))
    assert len(request.changes) == 4
    assert {c.expect_mod_revision for c in request.changes} == {-1}


def test_other_stores_are_kept() -> None:
    doc = {"name": "a/", "fragment": {"stores": ["gs://keep/", "file:///"]}, "children": [
        {"name": "a/b"}]}
    out = adapt_journalspace(doc, store="s3://x/")
    assert out["fragment"]["stores"] == ["gs://keep/", "s3://x/"]
    assert out["children"][0]["revision"] == -1


def test_bad_input_is_refused() -> None:
    with pytest.raises(SpecsError, match="replication"):
        adapt_journalspace({"name": "a/"}, replication=0)
    with pytest.raises(SpecsError, match="list of shards"):
        adapt_shardspace({"common": {}})
    with pytest.raises(SpecsError, match="children must be a list"):
        adapt_journalspace({"name": "a/", "children": "x"})


def test_command_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just a list\n")
    run = subprocess.run(
        [sys.executable, "-m", "pygazette.cli.deploy_specs", "--shardspace", str(bad)],
        capture_output=True, text=True, cwd=REPO,
    )
    assert run.returncode == 2
    assert run.stderr.strip() == f"error: {bad}: expected a mapping at the top level"
    ok = subprocess.run(
        [sys.executable, "-m", "pygazette.cli.deploy_specs", "--journalspace",
         str(REPO / "examples/stream_sum/journalspace.yaml"), "--replication", "2"],
        capture_output=True, text=True, cwd=REPO, check=True,
    )
    assert yaml.safe_load(ok.stdout)["replication"] == 2
