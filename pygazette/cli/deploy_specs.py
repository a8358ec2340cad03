"""Adapts an example's journalspace or shardspace YAML to a deployment, for the apply Jobs
of deploy/ (`python -m pygazette.cli.deploy_specs ...`, output on stdout):

- a journalspace gets the deployment's fragment store in place of `file:///` stores, the
  deployment's replication at its root, and `revision: -1` on every journal;
- a shardspace gets `revision: -1` on every shard,

so that a Job applying them can be retried (or re-run on an upgrade) without conflicting
with what an earlier run created. The output is applied with `journals apply` and
`shards apply`, which validate it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["SpecsError", "adapt_journalspace", "adapt_shardspace", "main"]


class SpecsError(ValueError):
    """The input is not a journalspace or shardspace this module can adapt."""


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecsError(f"{path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise SpecsError(f"{path}: expected a mapping at the top level")
    return doc


def _adapt_node(node: dict[str, Any], store: str | None, where: str) -> None:
    fragment = node.get("fragment")
    if store is not None and isinstance(fragment, dict) and "stores" in fragment:
        stores = fragment["stores"]
        if not isinstance(stores, list):
            raise SpecsError(f"{where}: fragment.stores must be a list")
        fragment["stores"] = [store if s == "file:///" else s for s in stores]
    children = node.get("children")
    if children is None:
        node["revision"] = -1
        return
    if not isinstance(children, list):
        raise SpecsError(f"{where}: children must be a list")
    for i, child in enumerate(children):
        if not isinstance(child, dict):
            raise SpecsError(f"{where}.children[{i}]: expected a mapping")
        _adapt_node(child, store, f"{where}.children[{i}]")


def adapt_journalspace(
    doc: dict[str, Any], *, store: str | None = None, replication: int | None = None
) -> dict[str, Any]:
    """The journalspace `doc` with `store` for file:/// stores, `replication` at its root and
    revision -1 on every journal (a node without children). Changes `doc` in place."""
    if replication is not None:
        if replication < 1:
            raise SpecsError(f"replication: expected 1 or more, got {replication}")
        doc["replication"] = replication
    _adapt_node(doc, store, "journalspace")
    return doc


def adapt_shardspace(doc: dict[str, Any]) -> dict[str, Any]:
    """The shardspace `doc` with revision -1 on every shard. Changes `doc` in place."""
    shards = doc.get("shards")
    if not isinstance(shards, list):
        raise SpecsError("shardspace: expected a list of shards")
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            raise SpecsError(f"shardspace.shards[{i}]: expected a mapping")
        shard["revision"] = -1
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pygazette.cli.deploy_specs")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--journalspace", type=Path, help="journalspace YAML to adapt")
    which.add_argument("--shardspace", type=Path, help="shardspace YAML to adapt")
    parser.add_argument("--store", help="fragment store replacing file:/// stores")
    parser.add_argument("--replication", type=int, help="replication of every journal")
    args = parser.parse_args(argv)
    try:
        if args.journalspace is not None:
            out = adapt_journalspace(
                _load(args.journalspace), store=args.store, replication=args.replication
            )
        else:
            if args.store is not None or args.replication is not None:
                raise SpecsError("--store and --replication apply to a journalspace only")
            out = adapt_shardspace(_load(args.shardspace))
    except SpecsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    yaml.safe_dump(out, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
