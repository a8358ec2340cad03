"""Journal specs over the wire: list journals by selector, get one, apply changes.

Broker statuses other than OK are raised as `pygazette.protocol.errors` exceptions; responses
that break Gazette's rules as `InvalidResponse` (`response_check`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import grpc
import grpc.aio

from pygazette.client.errors import ClientError
from pygazette.client.journal_client import JournalClient
from pygazette.client.response_check import check_response, invalid_response
from pygazette.protocol.errors import error_for_status
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import format_selector, parse_selector
from pygazette.protocol.validation import (
    validate_apply_response,
    validate_list_journals,
    validate_list_response,
)

# Changes per Apply RPC in `apply_journals_in_batches`: below etcd's default transaction
# limit (`--max-txn-ops` 128: an apply of more changes in one transaction fails).
DEFAULT_APPLY_BATCH = 100

# Told after each applied batch: (changes applied so far, all changes).
ApplyProgress = Callable[[int, int], None]


class ApplyIncomplete(ClientError):
    """A batch of `apply_journals_in_batches` failed as an RPC after earlier batches
    applied (those stay applied); its cause is the RPC's error."""


def as_selector(selector: str | pb.LabelSelector) -> pb.LabelSelector:
    """A LabelSelector from its text form (e.g. "name=foo/bar, app in (a, b)") or as is."""
    if isinstance(selector, pb.LabelSelector):
        return selector
    return parse_selector(selector)


async def list_journals(
    client: JournalClient, selector: str | pb.LabelSelector = ""
) -> list[pb.ListResponse.Journal]:
    """Every journal matching `selector` (which may also use meta-labels "name", "prefix")."""
    resp = await list_all(client, selector)
    return list(resp.journals)


async def list_all(client: JournalClient, selector: str | pb.LabelSelector = "") -> pb.ListResponse:
    """A complete listing snapshot as one ListResponse.

    The List RPC streams a snapshot as one or more responses (the first carries the status
    and header, each later one more journals) and then ends the stream.
    """
    request = pb.ListRequest(selector=as_selector(selector))
    listing = f"listing {format_selector(request.selector) or 'all journals'}"
    call = client.rpc_list(request)
    try:
        joined: pb.ListResponse | None = None
        while True:
            resp = await call.read()
            if not isinstance(resp, pb.ListResponse):  # grpc.aio.EOF
                break
            if joined is None:
                # The snapshot's first response, checked whole (as Gazette's client does).
                check_response("List", listing, validate_list_response, resp)
                if resp.status != pb.OK:
                    raise error_for_status(
                        resp.status,
                        listing,
                        resp.header if resp.HasField("header") else None,
                    )
                joined = resp
            elif not resp.journals:
                raise invalid_response(
                    "List", listing, "unexpected empty ListResponse.Journals in unary listing"
                )
            else:
                check_response("List", listing, validate_list_journals, resp)
                joined.journals.extend(resp.journals)
    finally:
        call.cancel()
    if joined is None:
        raise invalid_response("List", listing, "stream ended without a response")
    return joined


async def get_journal(client: JournalClient, name: str) -> pb.JournalSpec:
    """The spec of journal `name`; raises `JournalNotFound` if there is none."""
    entry = await get_journal_entry(client, name)
    return entry.spec


async def get_journal_entry(client: JournalClient, name: str) -> pb.ListResponse.Journal:
    """The listing entry (spec, mod revision, route) of journal `name`."""
    selector = pb.LabelSelector(
        include=pb.LabelSet(labels=[pb.Label(name="name", value=name.split(";", 1)[0])])
    )
    for journal in await list_journals(client, selector):
        if journal.spec.name == name.split(";", 1)[0]:
            return journal
    raise error_for_status(pb.JOURNAL_NOT_FOUND, name)


def _changes(
    changes: pb.ApplyRequest | Iterable[pb.ApplyRequest.Change],
) -> list[pb.ApplyRequest.Change]:
    if isinstance(changes, pb.ApplyRequest):
        return list(changes.changes)
    return list(changes)


async def apply_journals(
    client: JournalClient, changes: pb.ApplyRequest | Iterable[pb.ApplyRequest.Change]
) -> pb.ApplyResponse:
    """Apply all changes in one transaction: every change applies, or none does."""
    return await apply_journals_in_batches(client, changes, 0)


async def apply_journals_in_batches(
    client: JournalClient,
    changes: pb.ApplyRequest | Iterable[pb.ApplyRequest.Change],
    batch_size: int = DEFAULT_APPLY_BATCH,
    progress: ApplyProgress | None = None,
) -> pb.ApplyResponse:
    """Apply changes in transactions of `batch_size` (0: one transaction).

    Batches apply in order; if one fails, earlier batches stay applied (its error says how
    many were). `progress`, given, is told after each batch. Returns the response to the
    last batch.
    """
    all_changes = _changes(changes)
    size = batch_size if batch_size > 0 else max(1, len(all_changes))
    resp: pb.ApplyResponse | None = None
    for start in range(0, max(1, len(all_changes)), size):
        batch = all_changes[start : start + size]
        what = _describe_batch(batch)
        try:
            resp = await client.rpc_apply(pb.ApplyRequest(changes=batch))
            check_response("Apply", what, validate_apply_response, resp)
        except (grpc.aio.AioRpcError, ClientError) as exc:
            if not start:
                raise
            # The earlier transactions are applied: an error that doesn't say so hides it.
            reason = (
                f"{exc.code().name}: {exc.details()}"
                if isinstance(exc, grpc.aio.AioRpcError)
                else str(exc)
            )
            raise ApplyIncomplete(
                f"{what}: {reason} (the {start} change(s) before it stay applied)"
            ) from exc
        if resp.status != pb.OK:
            if start:
                what += f" (the {start} change(s) before it stay applied)"
            raise error_for_status(
                resp.status, what, resp.header if resp.HasField("header") else None
            )
        if progress is not None:
            progress(start + len(batch), len(all_changes))
    assert resp is not None
    return resp


def name_list(names: Sequence[str], shown: int = 3) -> str:
    """The first `shown` of `names`, comma-separated, and how many more there are."""
    text = ", ".join(names[:shown])
    if len(names) > shown:
        text += f" (+{len(names) - shown} more)"
    return text


def _describe_batch(batch: list[pb.ApplyRequest.Change]) -> str:
    shown = name_list([c.upsert.name if c.HasField("upsert") else c.delete for c in batch])
    return f"applying {shown}" if shown else "applying no changes"
