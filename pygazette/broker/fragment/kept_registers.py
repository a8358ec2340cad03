"""The registers of a journal whose spools are all persisted, kept on disk across restarts.

A journal's registers live in its spools: a spool's log records them at its creation and with
every append that changes them (`spool.py`), so a broker that restarts recovers them with its
spools. Once a journal's last spool is persisted and its files removed, nothing on the broker
held them: a restart (a lone broker's crash, or every broker of a route restarting) came back
with none, and every `check_registers` then passed (an empty register set matches any
selector), so fences built on registers (a recovery log's author, the Spark sink's labels)
no longer held. Gazette keeps them in its replicas' memory only and loses them the same way.

So when a spool's files go because its content is in a store (`Replica.keep_registers`), the
registers at its end are written here, if the journal has any (or had: an emptied set is
written too): one small file per journal, `<spool root>/.#registers/<spool directory name>`,
rewritten in place. A record is

    crc32 (u32) | end offset (u64) | name length (u16) | registers length (u32) | journal name
    (UTF-8) | registers (LabelSet)

little-endian, the CRC over all that follows it. A record that doesn't check out (torn by a
power loss, or of another journal) is no record. A restarted replica with no spool takes the
kept registers only where the journal's write head is the end they were kept at: content
appended since (through other brokers) had registers of its own, which these are not.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from pathlib import Path

from google.protobuf.message import DecodeError

from pygazette.protocol.pb import protocol_pb2 as pb

# Beside the journals' spool directories, under a name none of them has ("#" is in no journal
# name, and a spool directory's name would quote it).
DIR_NAME = ".#registers"
_HEAD = struct.Struct("<IQHI")  # crc32 of the rest, end, name length, registers length


def path_of(spool_root: Path, spool_dir_name: str) -> Path:
    """Where the registers of the journal whose spool directory is `spool_dir_name` are kept."""
    return spool_root / DIR_NAME / spool_dir_name


def encode(journal: str, end: int, registers: pb.LabelSet) -> bytes:
    name = journal.encode()
    regs = registers.SerializeToString()
    rest = _HEAD.pack(0, end, len(name), len(regs))[4:] + name + regs
    return struct.pack("<I", zlib.crc32(rest)) + rest


def decode(journal: str, data: bytes) -> tuple[int, pb.LabelSet] | None:
    """The end and registers a record of `journal` holds, or None (no whole record of it).
    Bytes past the record (left by a longer one it was written over) are ignored."""
    if len(data) < _HEAD.size:
        return None
    crc, end, name_len, regs_len = _HEAD.unpack_from(data)
    size = _HEAD.size + name_len + regs_len
    if len(data) < size or zlib.crc32(data[4:size]) != crc:
        return None
    if data[_HEAD.size : _HEAD.size + name_len] != journal.encode():
        return None
    registers = pb.LabelSet()
    try:
        registers.ParseFromString(data[_HEAD.size + name_len : size])
    except DecodeError:
        return None
    return end, registers


def save(path: Path, journal: str, end: int, registers: pb.LabelSet, *, sync: bool) -> None:
    """Keep `registers` as the journal's at `end` (one write; synced with `sync`)."""
    record = encode(journal, end, registers)
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, record, 0)
        os.ftruncate(fd, len(record))
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def load(path: Path, journal: str) -> tuple[int, pb.LabelSet] | None:
    """The registers kept for `journal`, with the end they were kept at; None if none are."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode(journal, data)


def forget(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
