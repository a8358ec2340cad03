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
        f"{field}: -1h}}\n"
    )
    with pytest.raises(ValidationError, match="negative duration"):
        apply_request(parse_journalspace(text))


def test_a_key_given_twice_in_a_node_is_refused() -> None:
    # gazctl decodes strictly (yaml.UnmarshalStrict): "field children already set". Read
    # leniently, the last of the two won: here the journals of the first 'children' list
    # (a/bb) were silently left out of the apply.
    text = (
        "name: a/\nreplication: 1\n"
        "fragment: {length: 1048576, compression_codec: NONE, refresh_interval: 1m}\n"
        "children:\n- name: a/bb\n"
        "children:\n- name: a/cc\n"
    )
    with pytest.raises(ValidationError, match="duplicate key 'children'"):
        parse_journalspace(text)


def test_yaml_merge_keys_still_work() -> None:
    text = (
        "name: a/\nfragment: {length: 1048576, compression_codec: NONE, refresh_interval: 1m}\n"
        "children:\n- &first\n  name: a/bb\n  replication: 2\n- <<: *first\n  name: a/cc\n"
    )
    changes = apply_request(parse_journalspace(text)).changes
    assert [(c.upsert.name, c.upsert.replication) for c in changes] == [("a/bb", 2), ("a/cc", 2)]


def test_a_duration_gazette_cannot_decode_is_refused_before_anything_applies() -> None:
    # A Go time.Duration spans about 292 years: gazctl refuses a longer one when it reads
    # the YAML, and a Gazette broker or client cannot decode a spec holding one.
    text = (
        "name: a/\nreplication: 1\n"
        "fragment: {length: 1048576, compression_codec: NONE, refresh_interval: 1m}\n"
        "children:\n- name: a/bb\n- name: a/cc\n  fragment: {retention: 3000000h}\n"
    )
    with pytest.raises(ValidationError, match=r"journal 'a/cc': Fragment\.Retention: .*292 years"):
        apply_request(parse_journalspace(text))


def test_a_label_value_of_a_lone_equals_sign_is_read() -> None:
    # '=' is a valid label value, and gazctl writes it plain ("value: ="), where YAML 1.1
    # resolves it to the 'value' tag: PyYAML's loader had no constructor for it and refused
    # the whole document ("could not determine a constructor").
    text = (
        "name: a/bb\nreplication: 1\nlabels:\n- name: ab\n  value: =\n"
        "fragment: {length: 1048576, compression_codec: NONE, refresh_interval: 1m}\n"
    )
    (change,) = apply_request(parse_journalspace(text)).changes
    assert [(x.name, x.value) for x in change.upsert.labels.labels] == [("ab", "=")]


@pytest.mark.parametrize("written", ["007", "0x1f", "1_000", "+5", "0b11", "00"])
def test_a_label_value_written_as_a_number_is_its_text(written: str) -> None:
    # gazctl reads a plain scalar into a string field as written. PyYAML resolved these to
    # ints, and the value became their decimal form ('007' -> '7', '0x1f' -> '31'): labels
    # silently other than written.
    text = (
        f"name: a/bb\nreplication: 1\nlabels:\n- name: ab\n  value: {written}\n"
        "fragment: {length: 0x100000, compression_codec: NONE, refresh_interval: 1m}\n"
    )
    (change,) = apply_request(parse_journalspace(text)).changes
    assert [(x.name, x.value) for x in change.upsert.labels.labels] == [("ab", written)]
    assert change.upsert.fragment.length == 1 << 20  # An integer field reads it as YAML does.


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("flags: -1", "flags: -1 is out of range"),
        ("flags: 4294967296", "flags: 4294967296 is out of range"),
        ("replication: 99999999999", "replication: 99999999999 is out of range"),
        ("max_append_rate: 99999999999999999999", "max_append_rate: .* is out of range"),
        ("suspend: {level: 99999999999}", "suspend.level: .* is out of range"),
        ("suspend: {offset: -99999999999999999999}", "suspend.offset: .* is out of range"),
        ("revision: 99999999999999999999", "revision: .* is out of range"),
        ("fragment: {compression_codec: -99999999999}", "fragment.compression_codec: .* is out"),
        ("fragment: {length: 99999999999999999999}", "fragment.length: .* is out of range"),
    ],
)
def test_a_number_beyond_its_field_is_a_one_line_error(field: str, message: str) -> None:
    # Set into the spec's protobuf field, it raised ValueError ('Value out of range'): a
    # traceback rather than an error naming the node and field.
    text = f"name: a/bb\n{field}\n"
    with pytest.raises(ValidationError, match=f"node 'a/bb': {message}"):
        parse_journalspace(text)


@pytest.mark.parametrize(("written", "value"), [("2.0", 2), ("3.0e+0", 3), ("0x2", 2)])
def test_an_integer_written_as_gazctl_reads_it_is_taken(written: str, value: int) -> None:
    # gazctl (YAML v2) reads a whole float into an integer field; it was refused here.
    text = (
        f"name: a/bb\nreplication: {written}\n"
        "fragment: {length: 1024, compression_codec: NONE, refresh_interval: 1m}\n"
    )
    (change,) = apply_request(parse_journalspace(text)).changes
    assert change.upsert.replication == value


def test_a_fractional_number_for_an_integer_is_refused() -> None:
    # gazctl would truncate it to 2 without a word.
    with pytest.raises(ValidationError, match="node 'a/bb': replication: expected an integer"):
        parse_journalspace("name: a/bb\nreplication: 2.5\n")
