"""Checkpoints: the protobuf `consumer.Checkpoint` to and from the message layer's state.

A Checkpoint records, per source journal, the offset read through and the states of the
producers seen there (so that a restored Sequencer de-duplicates exactly as the one that
wrote it), and, per output journal, the ACK intent that commits the transaction's messages
there. It is written atomically with the store's state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pygazette.message.envelope import ProducerState
from pygazette.message.publisher import AckIntent
from pygazette.protocol.pb import consumer_pb2 as cpb

__all__ = ["build_checkpoint", "checkpoint_ack_intents", "checkpoint_sources"]


def build_checkpoint(
    read_through: Mapping[str, int],
    states: Iterable[ProducerState],
    ack_intents: Iterable[AckIntent] = (),
) -> cpb.Checkpoint:
    """A Checkpoint of source offsets, producer states and ACK intents."""
    cp = cpb.Checkpoint()
    for journal, offset in read_through.items():
        cp.sources[journal].read_through = offset
    for state in states:
        entry = cp.sources[state.journal].producers.add()
        entry.id = state.producer
        entry.state.last_ack = state.last_ack
        entry.state.begin = state.begin
    for intent in ack_intents:
        cp.ack_intents[intent.journal] = intent.intent
    return cp


def checkpoint_sources(
    cp: cpb.Checkpoint,
) -> tuple[dict[str, int], dict[str, list[ProducerState]]]:
    """(read-through offsets, producer states by journal) to restore Sequencers from."""
    offsets: dict[str, int] = {}
    states: dict[str, list[ProducerState]] = {}
    for journal, source in cp.sources.items():
        offsets[journal] = source.read_through
        states[journal] = [
            ProducerState(journal, bytes(p.id), p.state.last_ack, p.state.begin)
            for p in source.producers
        ]
    return offsets, states


def checkpoint_ack_intents(cp: cpb.Checkpoint) -> list[AckIntent]:
    """The checkpoint's ACK intents, in journal order."""
    return [AckIntent(j, bytes(cp.ack_intents[j])) for j in sorted(cp.ack_intents)]
