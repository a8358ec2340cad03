"""Messages encoded as Gazette encodes them, where that differs from plain protobuf.

Gazette's Go types make some sub-messages non-nullable (gogoproto): they are always written
to the wire, even when empty. A JournalSpec stored and listed by Gazette therefore always
carries its labels, fragment and the fragment's three durations, while a Python-built spec
leaves unset ones out. Protobuf equality in Python tells the two apart, so brokers store
specs in Gazette's form: a spec listed by pygazette equals, byte for byte, one listed by
Gazette.
"""

from __future__ import annotations

from pygazette.protocol.pb import protocol_pb2 as pb


def canonical_journal_spec(spec: pb.JournalSpec) -> pb.JournalSpec:
    """A copy of `spec` with Gazette's non-nullable sub-messages present."""
    out = pb.JournalSpec()
    out.CopyFrom(spec)
    out.labels.SetInParent()
    frag = out.fragment
    frag.SetInParent()
    frag.refresh_interval.SetInParent()
    frag.retention.SetInParent()
    frag.flush_interval.SetInParent()
    return out
