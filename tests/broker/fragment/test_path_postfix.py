"""Path postfix templates: Go's text/template and time layouts, as Hive-style paths use them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pygazette.broker.fragment.go_time_format import go_time_format
from pygazette.broker.fragment.path_postfix import (
    TemplateError,
    check_apply_request,
    check_template,
    evaluate_path_postfix,
    go_sprintf,
)
from pygazette.protocol.pb import protocol_pb2 as pb

T = datetime(2024, 3, 7, 9, 5, 4, 120000, UTC)


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("2006-01-02", "2024-03-07"),
        ("15", "09"),
        ("2006/01/02/15", "2024/03/07/09"),
        ("Jan _2 3:04:05PM", "Mar  7 9:05:04AM"),
        ("January Monday Mon MST", "March Thursday Thu UTC"),
        ("06 1 2 4 5 002 __2", "24 3 7 5 4 067  67"),
        ("2006-01-02T15:04:05Z07:00", "2024-03-07T09:05:04Z"),
        ("2006-01-02T15:04:05-0700", "2024-03-07T09:05:04+0000"),
        ("15:04:05.000", "09:05:04.120"),
        ("15:04:05.999999", "09:05:04.12"),
        ("05.000000000", "04.120000000"),
        ("_2006", "_2024"),  # A literal underscore, then the year.
        ("pm PM 03", "am AM 09"),
        ("date=2006-01-02", "date=2024-03-07"),
        ("hour=15,000", "hour=09,120"),
        ("123", "379"),  # "1", "2" then "3": month, day, 12-hour.
        ("2006.05", "2024.04"),  # ".05" is not a fraction: "05" follows a literal dot.
        # "Jan" and "Mon" before a lowercase letter are text, as in Go (they rendered the
        # month and weekday: "Thuthly/2024", "Marchitor"). Outputs from Go's time.Format.
        ("Monthly/2006", "Monthly/2024"),
        ("January Janitor", "March Janitor"),
        ("Mon-Jan MonX JanZ", "Thu-Mar ThuX MarZ"),
        ("date=Jan02", "date=Mar07"),
    ],
)
def test_go_layouts(layout: str, expected: str) -> None:
    assert go_time_format(T, layout) == expected


def test_fraction_of_whole_seconds_drops_its_separator() -> None:
    assert go_time_format(datetime(2024, 1, 1, tzinfo=UTC), "05.999") == "00"


def _spec(template: str, name: str = "examples/clicks/part-000") -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20,
            compression_codec=pb.SNAPPY,
            stores=["s3://bucket/prefix/"],
            path_postfix_template=template,
        ),
    )


FRAG = pb.Fragment(
    journal="examples/clicks/part-000",
    begin=0x1000,
    end=0x2400,
    compression_codec=pb.SNAPPY,
    backing_store="s3://bucket/prefix/",
)
HIVE = (
    'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}'
    '/hour={{ .Spool.FirstAppendTime.Format "15" }}'
)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("", ""),
        (HIVE, "date=2024-03-07/hour=09"),
        ("{{ .JournalSpec.Name }}", "examples/clicks/part-000"),
        ("{{ .Name }}/{{ .Spool.Journal }}", "examples/clicks/part-000/examples/clicks/part-000"),
        ('{{ .Spool.Begin | printf "%016x" }}', "0000000000001000"),
        ('{{ printf "%05d-%s" .Spool.Fragment.End .Spool.CompressionCodec }}', "09216-SNAPPY"),
        ("y={{.Spool.FirstAppendTime.Year}}/m={{.Spool.FirstAppendTime.Month}}", "y=2024/m=March"),
        ('m={{ printf "%02d" .Spool.FirstAppendTime.Month }}', "m=03"),
        ("{{- /* a comment */ -}} static {{- `/raw` }}", "static/raw"),
        ("{{ .Spool.End }}/{{ .JournalSpec.Fragment.CompressionCodec }}", "9216/SNAPPY"),
        ("{{ $.Spool.FirstAppendTime.Unix }}", str(int(T.timestamp()))),
        ('{{ "lit" }}-{{ 7 }}', "lit-7"),
        ("/leading/and/trailing/", "leading/and/trailing"),
    ],
)
def test_render(template: str, expected: str) -> None:
    assert evaluate_path_postfix(_spec(template), FRAG, T.timestamp()) == expected


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ('date={{ .FirstAppendTime.Format "2006-01-02" }}', "date=2024-03-07"),
        ('{{ .Begin | printf "%016x" }}-{{ .End }}', "0000000000001000-9216"),
        ("{{ .Journal }}/{{ .CompressionCodec }}", "examples/clicks/part-000/SNAPPY"),
    ],
)
def test_spool_fields_are_promoted_to_the_top_as_in_go(template: str, expected: str) -> None:
    # Gazette persists by executing the template on struct{Spool; *JournalSpec}: Go promotes
    # the spool's FirstAppendTime and its fragment's fields, so Gazette renders these.
    assert evaluate_path_postfix(_spec(template), FRAG, T.timestamp()) == expected
    # But its JournalSpec.Validate executes it on struct{Spool struct{...}; JournalSpec},
    # where Spool is a named field and nothing of it is promoted: Gazette refuses such a spec
    # at Apply, and its brokers and clients refuse it wherever they meet it (a Gazette broker's
    # keyspace drops it, gazctl's List fails whole). Checked with go.gazette.dev/core
    # v0.103.0: "can't evaluate field FirstAppendTime in type struct { Spool struct {...};
    # protocol.JournalSpec }".
    field = template.split("{{ .", 1)[1].split()[0].split(".")[0]
    with pytest.raises(TemplateError, match=f"can't evaluate field {field} in type data"):
        check_template(_spec(template))


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{ if .Name }}x{{ end }}", "unsupported action 'if'"),
        ("{{ range .Labels }}{{ end }}", "unsupported action 'range'"),
        ("{{ $x := 1 }}", "unsupported variable"),
        ("{{ len .Name }}", "unsupported function 'len'"),
        ("{{ bogus }}", 'function "bogus" not defined'),
        ("{{ .Spool.Nope }}", "can't evaluate field Nope in type Spool"),
        ("{{ .JournalSpec.Labels }}", "is a label set, which has no path form"),
        ("{{ .Spool.Registers }}", "is a label set"),
        ("{{ .Registers }}", "can't evaluate field Registers in type data"),
        ("{{ .ContentName }}", "can't evaluate field ContentName in type data"),
        # Methods of *Fragment: Gazette's template can't call them on its Spool value.
        ("{{ .Spool.ContentName }}", "can't evaluate field ContentName in type Spool"),
        ("{{ .Spool.ContentLength }}", "can't evaluate field ContentLength in type Spool"),
        ("{{ .Spool.Fragment.ContentName }}", "can't evaluate field ContentName in type Fragment"),
        ("{{ .Fragment.Length }}", "ambiguous at the top level"),
        ("{{ .Spool.FirstAppendTime }}", "not a valid path postfix"),  # Spaces and ':'.
        ('{{ .Spool.FirstAppendTime.Format "15:04" }}', "not a valid path postfix"),
        ("../{{ .Name }}", "leaves the journal's directory"),
        ("{{ .Spool.Begin", "unclosed action"),
        ('{{ printf "%d" .Name }}', "printf %d of a non-integer"),
        ('{{ printf "%d-%d" .Spool.Begin }}', "needs more arguments"),
        ("{{ (.Name) }}", "parenthesized"),
        ("{{ }}", "missing value for command"),
        ("{{ .Spool.FirstAppendTime.Format }}", "takes one layout string"),
    ],
)
def test_refused_with_a_clear_error(template: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message) as err:
        check_template(_spec(template))
    assert "PathPostfixTemplate" in str(err.value)


@pytest.mark.parametrize("layout", ["_2", "__2", "Jan _2", "2006-01-_2"])
def test_layouts_rendering_spaces_on_some_days_are_refused(layout: str) -> None:
    # Space-padded day ("_2") and day of year ("__2") render a space only early in a month or
    # year: checked on one sample day (November 23rd) alone they passed at Apply, and the
    # journal then failed to persist its spools on January 1st to 9th ("not a valid path
    # postfix"), which pile up on the broker's disk. Gazette would write a path its own
    # listing refuses.
    template = f'd={{{{ .Spool.FirstAppendTime.Format "{layout}" }}}}'
    with pytest.raises(TemplateError, match="not a valid path postfix"):
        check_template(_spec(template))
    early = datetime(2024, 1, 3, tzinfo=UTC).timestamp()
    with pytest.raises(TemplateError):
        evaluate_path_postfix(_spec(template), FRAG, early)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ .Flags }}", "O_RDWR"),
        ("{{ .JournalSpec.Flags }}", "O_RDWR"),
        ('{{ printf "%d" .Flags }}', "4"),
    ],
)
def test_flags_render_by_name_as_in_go(template: str, expected: str) -> None:
    # JournalSpec_Flag has a String() method: Go's template prints its name (checked with
    # go.gazette.dev/core v0.103.0), where the number was written, so that fragments of such
    # a journal were persisted under another path than Gazette's.
    spec = _spec(template)
    spec.flags = pb.JournalSpec.O_RDWR
    check_template(spec)
    assert evaluate_path_postfix(spec, FRAG, T.timestamp()) == expected


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        # A comment runs to its "*/", whatever it holds ("}}" included), as Go's lexer reads
        # it; such templates were refused at Apply and failed to persist ("unclosed comment"),
        # though Gazette renders them (checked with go.gazette.dev/core v0.103.0).
        ("a{{/* }} */}}b", "ab"),
        ("{{/* {{ }} */}}x", "x"),
        ("{{- /* x }} */ -}}/{{ .Name }}", "examples/clicks/part-000"),
        ("a {{- /* x */ -}} b", "ab"),
    ],
)
def test_comments_read_as_in_go(template: str, expected: str) -> None:
    check_template(_spec(template))
    assert evaluate_path_postfix(_spec(template), FRAG, T.timestamp()) == expected


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{/* x }}", "unclosed comment"),
        ("{{/* x */ }}", "comment ends before closing delimiter"),
        ("{{ /* x */ }}", 'unexpected "/" in command'),  # Not at once after "{{": not one.
    ],
)
def test_comments_refused_as_in_go(template: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        check_template(_spec(template))


def test_specs_applied_with_content_name_before_it_was_refused_still_persist() -> None:
    spec = _spec("{{ .Spool.ContentLength }}/{{ .Spool.Fragment.ContentName }}")
    with pytest.raises(TemplateError):
        check_template(spec)
    assert evaluate_path_postfix(spec, FRAG, T.timestamp()) == (
        "5120/0000000000001000-0000000000002400-0000000000000000000000000000000000000000.sz"
    )


def test_apply_request_check_names_the_journal() -> None:
    req = pb.ApplyRequest()
    req.changes.add(upsert=_spec(HIVE, "a/ok"), expect_mod_revision=-1)
    req.changes.add(upsert=_spec("{{ if 1 }}{{ end }}", "a/bad"), expect_mod_revision=-1)
    req.changes.add(delete="a/gone", expect_mod_revision=-1)
    with pytest.raises(TemplateError, match=r"journal a/bad: Fragment\.PathPostfixTemplate"):
        check_apply_request(req)


def test_sprintf_verbs() -> None:
    assert go_sprintf("%d|%5d|%-5d|%05d|%x|%X|%o|%%", [7, 7, 7, 7, 255, 255, 8]) == (
        "7|    7|7    |00007|ff|FF|10|%"
    )
    assert go_sprintf("%s|%8s|%-4s|%v|%.2s|%q", ["a", "b", "c", "d", "xyz", 'q"']) == (
        'a|       b|c   |d|xy|"q\\""'
    )


@given(st.text(alphabet="-_=./abc0123", max_size=30))
def test_plain_text_renders_as_itself_or_is_refused(text: str) -> None:
    try:
        got = evaluate_path_postfix(_spec(text), FRAG, T.timestamp())
    except TemplateError:
        return
    assert got in (text.strip("/"), "") or "." in text or "//" in text
