"""Rendering of listings for the CLI (journals and fragments; the JSON of shard listings too):
aligned text tables, hierarchical YAML (journalspace) and JSON.

Tables are plain text aligned in columns, so that they read well in a terminal and survive
pipes into grep, awk or a file unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pygazette.protocol.fragment_name import fragment_location, sha1sum_to_hex
from pygazette.protocol.pb import protocol_pb2 as pb

if TYPE_CHECKING:
    from google.protobuf import message

NONE = "<none>"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns left-aligned to their widest cell, separated by two spaces."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(headers)]
    out.extend(line(r) for r in rows)
    return "\n".join(out) + "\n"


def _labels_text(ls: pb.LabelSet) -> str:
    parts = [f"{lb.name}={lb.value}" if lb.value else lb.name for lb in ls.labels]
    return ",".join(parts) if parts else NONE


def _route_text(route: pb.Route) -> tuple[str, str]:
    """(primary, other replicas) of a route, by broker ID suffix."""
    primary = NONE
    replicas: list[str] = []
    for i, member in enumerate(route.members):
        name = member.suffix or member.zone or "?"
        if i == route.primary:
            primary = name
        else:
            replicas.append(name)
    return primary, ",".join(replicas)


def journals_table(journals: Sequence[pb.ListResponse.Journal]) -> str:
    rows = []
    for j in journals:
        primary, replicas = _route_text(j.route)
        rows.append(
            [
                j.spec.name,
                str(j.spec.replication),
                primary,
                replicas or NONE,
                _labels_text(j.spec.labels),
                str(j.mod_revision),
            ]
        )
    return render_table(["NAME", "RF", "PRIMARY", "REPLICAS", "LABELS", "REVISION"], rows)


def label_cells(labels: pb.LabelSet, columns: Sequence[str]) -> list[str]:
    """The values of each label of `columns` (-L), comma-separated, as gazctl's tables."""
    from pygazette.protocol.labels import label_values

    cells = []
    for label in columns:
        values = label_values(labels, label)
        cells.append(",".join(values) if values else NONE)
    return cells


def journals_columns_table(
    journals: Sequence[pb.ListResponse.Journal],
    *,
    rf: bool,
    primary: bool,
    replicas: bool,
    stores: bool,
    label_columns: Sequence[str],
) -> str:
    """Journal names and the chosen columns, as gazctl's `journals list` table shows them
    (a suspended journal's primary is marked "<S>")."""
    headers = ["NAME"]
    if rf:
        headers.append("RF")
    if primary:
        headers.append("PRIMARY")
    if replicas:
        headers.append("REPLICAS")
    if stores:
        headers.append("STORES")
    headers.extend(label.upper() for label in label_columns)
    rows = []
    for j in journals:
        primary_cell, replicas_cell = _route_text(j.route)
        if j.spec.suspend.level != pb.JournalSpec.Suspend.NONE:
            primary_cell += " <S>"
        row = [j.spec.name]
        if rf:
            row.append(str(j.spec.replication))
        if primary:
            row.append(primary_cell)
        if replicas:
            row.append(replicas_cell or NONE)
        if stores:
            row.append(j.spec.fragment.stores[0] if j.spec.fragment.stores else NONE)
        row.extend(label_cells(j.spec.labels, label_columns))
        rows.append(row)
    return render_table(headers, rows)


def journals_yaml(journals: Sequence[pb.ListResponse.Journal]) -> str:
    """The listing as a hoisted journalspace, which `journals apply` accepts back."""
    from pygazette.cli.journalspace import dump_journalspace, from_list  # YAML: only here.

    return dump_journalspace(from_list(journals))


def listing_json(listing: message.Message) -> str:
    """A List response (of journals or shards) as gazctl's `--format json` writes it, byte for
    byte: gogo jsonpb with OrigName and EmitDefaults (proto field names, every field, in
    declaration order, compact; no line break at its end)."""
    from pygazette.gateway import jsonpb  # Only for JSON output.

    return jsonpb.marshal(listing, orig_name=True).decode()


def listing_proto_text(listing: message.Message) -> str:
    """A response in protobuf text format, byte for byte as gazctl's --format proto."""
    from pygazette.gateway import jsonpb  # Only for this output.

    return jsonpb.marshal_text(listing)


def human_bytes(n: int) -> str:
    """Binary-prefixed size: "512 B", "1.5 KiB", "256 MiB"."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{n} B"
            return f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def mod_time_text(mod_time: int) -> str:
    if not mod_time:
        return "(not persisted)"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mod_time))


def fragments_table(fragments: Sequence[pb.FragmentsResponse._Fragment], with_urls: bool) -> str:
    headers = ["JOURNAL", "BEGIN", "END", "LENGTH", "PERSISTED", "SHA1", "COMPRESSION"]
    if with_urls:
        headers.append("URL")
    rows = []
    for f in fragments:
        spec = f.spec
        row = [
            spec.journal,
            str(spec.begin),
            str(spec.end),
            human_bytes(spec.end - spec.begin),
            mod_time_text(spec.mod_time),
            sha1sum_to_hex(spec.sum)[:12] + "...",
            pb.CompressionCodec.Name(spec.compression_codec),
        ]
        if with_urls:
            row.append(f.signed_url or NONE)
        rows.append(row)
    return render_table(headers, rows)


def removed_fragments_table(fragments: Sequence[pb.Fragment]) -> str:
    """Fragments a prune removed (or would remove), with where each lived."""
    rows = [
        [
            f.journal,
            str(f.begin),
            str(f.end),
            human_bytes(f.end - f.begin),
            mod_time_text(f.mod_time),
            fragment_location(f),
        ]
        for f in fragments
    ]
    headers = ["JOURNAL", "BEGIN", "END", "LENGTH", "PERSISTED", "FRAGMENT"]
    return render_table(headers, rows)


def _go_json(value: object) -> str:
    """`value` as Go's encoding/json writes it: compact, non-ASCII kept, and "<", ">", "&",
    U+2028 and U+2029 escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escape in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escape)
    return text


def fragments_json_lines(fragments: Sequence[pb.FragmentsResponse._Fragment]) -> str:
    """One JSON object per fragment and line, exactly as gazctl writes them (Go's
    encoding/json of Gazette's structs: numbers as numbers, the codec as its number, fields
    at their zero values left out but "spec" and "sum")."""
    lines = []
    for f in fragments:
        spec = f.spec
        total = {}
        for name, part in (
            ("part1", spec.sum.part1),
            ("part2", spec.sum.part2),
            ("part3", spec.sum.part3),
        ):
            if part:
                total[name] = part
        fields: dict[str, object] = {}
        for name, value in (
            ("journal", spec.journal),
            ("begin", spec.begin),
            ("end", spec.end),
            ("sum", total),
            ("compression_codec", spec.compression_codec),
            ("backing_store", spec.backing_store),
            ("mod_time", spec.mod_time),
            ("path_postfix", spec.path_postfix),
        ):
            if value or name == "sum":
                fields[name] = value
        record: dict[str, object] = {"spec": fields}
        if f.signed_url:
            record["signed_url"] = f.signed_url
        lines.append(_go_json(record))
    return "".join(line + "\n" for line in lines)
