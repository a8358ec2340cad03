"""`pygazette journals prune` and `pygazette journals store-health`: fragment stores from the CLI.

`prune` asks the broker to remove the selected journals' fragments older than their
`fragment.retention`, or beyond the bytes their `pygazette.dev/retention-bytes` label bounds
them to (the broker holds the store credentials and lists every store), and prints what was
removed — or, with --dry-run, what would be. Expired fragments that retention
keeps are noted on stderr with the reason. `store-health` reports a store's health as the
broker sees it, like `gazctl journals store-health`.
"""

from __future__ import annotations

import click

from pygazette.cli import output
from pygazette.cli.journals_cmd import (
    CommandError,
    _broker,
    _no_match,
    _selector,
    broker_option,
    journals,
    run_with_client,
)
from pygazette.client.journal_client import JournalClient
from pygazette.client.list_apply import list_journals, name_list
from pygazette.client.retention import prune_journal
from pygazette.client.store_health import fragment_store_health
from pygazette.protocol.errors import Suspended
from pygazette.protocol.fragment_name import fragment_location
from pygazette.protocol.labels import label_values
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import retention_pb2 as rpb


@journals.command("prune")
@click.option("-l", "--selector", required=True, help="Label selector of journals to prune.")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; remove nothing.")
@broker_option
@click.pass_context
def prune_cmd(ctx: click.Context, selector: str, dry_run: bool, broker: str | None) -> None:
    """Remove fragments older than each selected journal's retention, or beyond its
    pygazette.dev/retention-bytes label (e.g. 10GiB: the oldest go first).

    Fully suspended journals are left out (noted on stderr): no broker serves them until an
    append resumes them."""
    sel = _selector(selector)
    suspended: list[str] = []

    async def run(client: JournalClient) -> list[tuple[str, rpb.PruneResponse]]:
        found = await list_journals(client, sel)
        if not found:
            if label_values(sel.include, "name"):
                raise _no_match(sel, selector)
            raise CommandError(f"no journal matches selector {selector!r}")
        results = []
        for j in found:
            name = j.spec.name
            if j.spec.suspend.level == pb.JournalSpec.Suspend.FULL:
                suspended.append(name)
                continue
            try:
                results.append((name, await prune_journal(client, name, dry_run=dry_run)))
            except Suspended:  # Since it was listed.
                suspended.append(name)
        return results

    results = run_with_client(_broker(ctx, broker), run)
    if suspended:
        click.echo(
            f"left out {len(suspended)} fully suspended journal(s), which no broker serves "
            f"until an append resumes them: {name_list(suspended)}",
            err=True,
        )
    removed = [f for _, resp in results for f in resp.removed]
    if removed:
        click.echo(output.removed_fragments_table(removed), nl=False)
    for _, resp in results:
        for kept in resp.kept:
            f = kept.fragment
            click.echo(
                f"kept expired fragment {fragment_location(f)} [{f.begin}, {f.end}): {kept.reason}",
                err=True,
            )
    verb = "would remove" if dry_run else "removed"
    content = sum(f.end - f.begin for f in removed)
    click.echo(
        f"{verb} {len(removed)} fragment(s) ({output.human_bytes(content)} of journal content) "
        f"of {len(results)} journal(s)"
    )
    errors = [e for _, resp in results for e in resp.errors]
    if errors:
        raise CommandError(f"{len(errors)} fragment(s) could not be removed: {errors[0]}")


@journals.command("store-health")
@click.argument("store")
@broker_option
@click.pass_context
def store_health_cmd(ctx: click.Context, store: str, broker: str | None) -> None:
    """Check the health of fragment store STORE (e.g. s3://bucket/prefix/) via the broker."""

    async def run(client: JournalClient) -> pb.FragmentStoreHealthResponse:
        return await fragment_store_health(client, store)

    resp = run_with_client(_broker(ctx, broker), run)
    if resp.status == pb.OK:
        click.echo(f"fragment store {store} is healthy")
        return
    if resp.status == pb.FRAGMENT_STORE_UNHEALTHY:
        raise CommandError(f"fragment store {store} is unhealthy: {resp.store_health_error}")
    raise CommandError(f"fragment store {store} health check failed: {pb.Status.Name(resp.status)}")
