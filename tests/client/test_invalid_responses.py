"""The client refuses responses that break Gazette's rules: the real client against a scripted
broker (a grpc.aio server) sending them. Each is raised as `InvalidResponse`, naming the RPC,
the journal and the rule, and counted in `pygazette_client_invalid_responses_total`{rpc}; a
RetryReader logs it and reads again after a backoff, as Gazette's does."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from pygazette.client import JournalClient
from pygazette.client.appender import append
from pygazette.client.errors import InvalidResponse, ProtocolViolation
from pygazette.client.fragments import list_all_fragments
from pygazette.client.list_apply import apply_journals, list_journals
from pygazette.client.reader import Reader
from pygazette.client.retry_reader import RetryReader
from pygazette.client.store_health import fragment_store_health
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.client.fake_broker import (
    FakeBroker,
    Hang,
    committed,
    content,
    header,
    listed,
    listing,
    metadata,
)

J = "a/journal"


def invalid_count(rpc: str) -> float:
    return REGISTRY.get_sample_value("pygazette_client_invalid_responses_total", {"rpc": rpc}) or 0


async def test_a_fragment_past_the_write_head_is_refused_and_counted(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    # The bug Gazette's client met in pygazette (issue 20): a fragment ending at 10006 with
    # the write head still at 9857.
    fake.journal.read_scripts.append(
        [metadata(9000, begin=9000, end=10006, write_head=9857), content(9000, b"x" * 100)]
    )
    before = invalid_count("Read")
    reader = Reader(fake_client, J, offset=9000)
    with pytest.raises(InvalidResponse) as info:
        await reader.read()
    err = info.value
    assert (err.rpc, err.subject) == ("Read", J)
    assert err.rule == "invalid WriteHead (9857; expected >= 10006)"
    assert str(err) == (
        "invalid Read response of a/journal: invalid WriteHead (9857; expected >= 10006)"
    )
    assert isinstance(err, ProtocolViolation)
    assert invalid_count("Read") == before + 1
    assert reader.offset == 9000  # Nothing of it was taken.
    with pytest.raises(InvalidResponse):
        await reader.read()  # The Reader stays failed.


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        (
            pb.ReadResponse(offset=0, content=b"abc", write_head=3),
            "unexpected WriteHead with Content",
        ),
        (
            pb.ReadResponse(offset=0, content=b"abc", header=header()),
            "unexpected Header with Content",
        ),
        (
            pb.ReadResponse(status=pb.WRONG_ROUTE, offset=0, content=b"abc"),
            "unexpected Status with Content (WRONG_ROUTE)",
        ),
        (
            pb.ReadResponse(offset=0, content=b"abc", fragment_url="file:///x"),
            "unexpected FragmentUrl with Content",
        ),
    ],
)
async def test_content_chunks_get_gazettes_cheap_checks(
    fake: FakeBroker, fake_client: JournalClient, bad: pb.ReadResponse, rule: str
) -> None:
    fake.journal.read_scripts.append([metadata(0, begin=0, end=3), bad])
    before = invalid_count("Read")
    with pytest.raises(InvalidResponse) as info:
        await Reader(fake_client, J).read()
    assert info.value.rule == rule
    assert invalid_count("Read") == before + 1


async def test_a_response_behind_the_readers_offset_is_refused(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.append(
        [metadata(0, begin=0, end=6), content(0, b"abc"), content(0, b"abc")]
    )
    reader = Reader(fake_client, J)
    assert await reader.read() == b"abc"
    with pytest.raises(InvalidResponse, match=r"invalid ReadResponse offset \(0; expected >= 3\)"):
        await reader.read()


async def test_a_retry_reader_logs_and_retries_after_an_invalid_response(
    fake: FakeBroker, fake_client: JournalClient, caplog: pytest.LogCaptureFixture
) -> None:
    fake.journal.read_scripts.extend(
        [
            [metadata(0, begin=0, end=6, write_head=3)],  # Past the write head: refused.
            [metadata(0, begin=0, end=6, write_head=6), content(0, b"abcdef"), Hang()],
        ]
    )
    before = invalid_count("Read")
    delays: list[int] = []

    def backoff(attempt: int) -> float:
        delays.append(attempt)
        return 0.0

    rr = RetryReader(fake_client, J, block=True, backoff=backoff)
    with caplog.at_level(logging.WARNING, logger="pygazette.client.retry_reader"):
        assert await rr.read() == b"abcdef"
    await rr.aclose()
    assert invalid_count("Read") == before + 1
    assert delays == [0]  # One backoff before the retry.
    assert len(fake.journal.read_requests) == 2
    (record,) = [r for r in caplog.records if r.getMessage() == "read failure (will retry)"]
    assert "invalid WriteHead (3; expected >= 6)" in record.__dict__["err"]


async def test_an_ok_append_without_its_commit_is_refused_and_not_retried(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.append_responses.append(
        pb.AppendResponse(status=pb.OK, header=header(), registers=pb.LabelSet())
    )
    before = invalid_count("Append")
    with pytest.raises(InvalidResponse) as info:
        await append(fake_client, J, b"payload")
    assert str(info.value) == "invalid Append response of a/journal: expected Commit"
    assert invalid_count("Append") == before + 1
    assert len(fake.journal.append_calls) == 1  # Its outcome is unknown: never retried.


async def test_an_append_response_without_a_header_is_refused(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    resp = committed(J, 0, 7)
    resp.ClearField("header")
    fake.journal.append_responses.append(resp)
    # As Gazette's (its Header is not nullable): an absent Header's zero Route is the fault.
    with pytest.raises(InvalidResponse) as info:
        await append(fake_client, J, b"payload")
    assert info.value.rule == "Header.Route: invalid Primary (0; expected -1 <= Primary < 0)"


async def test_a_commit_with_an_invalid_fragment_is_refused(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    resp = committed(J, 7, 0)
    fake.journal.append_responses.append(resp)
    with pytest.raises(InvalidResponse, match=r"Commit: expected Begin <= End \(have 7, 0\)"):
        await append(fake_client, J, b"payload")


async def test_listings_are_checked_whole_and_chunk_by_chunk(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    no_header = listing("a/one")
    no_header.ClearField("header")
    bad_spec = pb.ListResponse(journals=listed("a/two"))
    bad_spec.journals[0].spec.replication = 0
    fake.journal.list_responses.extend(
        [
            [no_header],
            [listing("a/one"), bad_spec],
            [listing("a/one"), pb.ListResponse()],
            [listing("a/one"), pb.ListResponse(journals=listed("a/two"))],
        ]
    )
    before = invalid_count("List")
    with pytest.raises(InvalidResponse, match=r"List response of listing all journals: Header"):
        await list_journals(fake_client)
    with pytest.raises(InvalidResponse, match=r"Journals\[0\]\.Spec: invalid Replication \(0;"):
        await list_journals(fake_client)
    with pytest.raises(InvalidResponse, match=r"unexpected empty ListResponse\.Journals"):
        await list_journals(fake_client)
    assert invalid_count("List") == before + 3
    assert [j.spec.name for j in await list_journals(fake_client)] == ["a/one", "a/two"]


async def test_apply_fragments_and_store_health_responses_are_checked(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.apply_responses.append(pb.ApplyResponse(status=pb.OK))  # No header.
    bad_fragment = pb.FragmentsResponse(
        status=pb.OK,
        header=header(),
        fragments=[pb.FragmentsResponse._Fragment(spec=pb.Fragment(journal=J, begin=0, end=9))],
    )
    fake.journal.fragments_responses.append(bad_fragment)
    fake.journal.health_responses.append(pb.FragmentStoreHealthResponse(status=9999))  # type: ignore[arg-type]
    counts = {rpc: invalid_count(rpc) for rpc in ("Apply", "ListFragments", "FragmentStoreHealth")}

    with pytest.raises(InvalidResponse, match=r"invalid Apply response .*Header"):
        await apply_journals(
            fake_client, [pb.ApplyRequest.Change(delete=J, expect_mod_revision=-1)]
        )
    with pytest.raises(InvalidResponse) as info:
        await list_all_fragments(fake_client, J)
    assert info.value.rule == "Fragments[0].Spec.CompressionCodec: invalid value (INVALID)"
    with pytest.raises(InvalidResponse, match=r"Status: invalid status \(9999\)"):
        await fragment_store_health(fake_client, "file:///")
    for rpc, before in counts.items():
        assert invalid_count(rpc) == before + 1, rpc


async def test_fragment_pages_whose_token_does_not_grow_are_refused(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    """A page token is the begin of the next page's first fragment: one that doesn't grow
    would list fragments again, or page for ever."""

    def page(begin: int, end: int, token: int) -> pb.FragmentsResponse:
        frag = pb.Fragment(journal=J, begin=begin, end=end, compression_codec=pb.NONE)
        return pb.FragmentsResponse(
            status=pb.OK,
            header=header(),
            fragments=[pb.FragmentsResponse._Fragment(spec=frag)],
            next_page_token=token,
        )

    fake.journal.fragments_responses.extend([page(0, 10, 10), page(10, 20, 5)])
    before = invalid_count("ListFragments")
    with pytest.raises(InvalidResponse, match=r"NextPageToken 5 not past the previous one \(10\)"):
        await list_all_fragments(fake_client, J)
    assert invalid_count("ListFragments") == before + 1
