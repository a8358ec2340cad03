"""The journalspace YAML (`pygazette.cli.journalspace`) against Gazette's rules."""

from __future__ import annotations

import pytest

from pygazette.cli import output
from pygazette.cli.journalspace import apply_request, parse_journalspace
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_journal_spec


def _spec(name: str = "neg/retained") -> pb.JournalSpec:
    spec = pb.JournalSpec(name=name, replication=1)
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.refresh_interval.seconds = 60
    return spec


def test_a_listed_negative_retention_applies_back() -> None:
    # Gazette allows every retention (<= 0 keeps fragments forever), and gazctl reads and
    # writes a negative one ("retention: -1h0m0s"); so does a listing of pygazette's. The YAML
    # of such a journal was refused ("negative duration"): it could not be applied back, and
    # 'journals edit' of a selection holding it could never save.
    spec = _spec()
    spec.fragment.retention.seconds = -3600
    validate_journal_spec(spec)
    listed = output.journals_yaml([pb.ListResponse.Journal(spec=spec, mod_revision=7)])
    assert "retention: -1h0m0s" in listed
    (change,) = apply_request(parse_journalspace(listed)).changes
    assert change.upsert == spec and change.expect_mod_revision == 7


@pytest.mark.parametrize("field", ["refresh_interval", "flush_interval"])
def test_other_negative_durations_stay_refused(field: str) -> None:
    text = (
        "name: neg/x\nreplication: 1\nfragment: {length: 1048576, compression_codec: NONE, "
        f"refresh_interval: 1m, {field}: -1h}}\n"
    )
    with pytest.raises(ValidationError, match="negative duration"):
        apply_request(parse_journalspace(text))
