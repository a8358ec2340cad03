"""Journal specs in Gazette's encoding: its non-nullable sub-messages always present."""

from __future__ import annotations

from pygazette.protocol.gazette_encoding import canonical_journal_spec
from pygazette.protocol.pb import protocol_pb2 as pb

# JournalSpec{Name: "a/b", Replication: 1} as Gazette v0.103.0's Go types marshal it (printed
# by its JournalSpec.Marshal): labels, fragment and the fragment's three durations present.
GAZETTE_BYTES = bytes.fromhex("0a03612f6210011a00220622002a003200")
# The same with Fragment.RefreshInterval = 30s.
GAZETTE_BYTES_REFRESH_30S = bytes.fromhex("0a03612f6210011a0022082202081e2a003200")


def test_canonical_spec_matches_gazettes_bytes() -> None:
    spec = pb.JournalSpec(name="a/b", replication=1)
    canonical = canonical_journal_spec(spec)
    assert canonical.SerializeToString(deterministic=True) == GAZETTE_BYTES
    # Python equality tells an absent sub-message from an empty one: a spec read back from
    # Gazette equals the canonical form, not the spec as built.
    assert pb.JournalSpec.FromString(GAZETTE_BYTES) == canonical
    assert pb.JournalSpec.FromString(GAZETTE_BYTES) != spec

    spec.fragment.refresh_interval.seconds = 30
    again = canonical_journal_spec(canonical_journal_spec(spec))
    assert again.SerializeToString(deterministic=True) == GAZETTE_BYTES_REFRESH_30S
    assert again == canonical_journal_spec(spec)  # Idempotent.
