"""Gazette's capability bits: what a token's claims allow (`protocol.Capability`)."""

from __future__ import annotations

import enum

__all__ = ["Capability", "capability_names", "missing_capability_message"]


class Capability(enum.IntFlag):
    """A bit mask of authorized capabilities, with Gazette's values."""

    NONE = 0
    LIST = 1 << 1
    APPLY = 1 << 2
    READ = 1 << 3
    APPEND = 1 << 4
    REPLICATE = 1 << 5
    # Applications may use bits from 1 << 16.
    ALL = 0xFFFFFFFF


_NAMED = (
    Capability.LIST,
    Capability.APPLY,
    Capability.READ,
    Capability.APPEND,
    Capability.REPLICATE,
)


def capability_names(cap: int) -> list[str]:
    """Names of the well-known capability bits set in `cap` ("LIST", "READ", ...)."""
    return [c.name or "" for c in _NAMED if cap & c]


def missing_capability_message(have: int, require: int) -> str | None:
    """None if `have` holds every bit of `require`, else Gazette's refusal message."""
    if have & require == require:
        return None
    for c in _NAMED:
        if require & c and not have & c:
            return f"authorization is missing required {c.name} capability"
    return f"authorization is missing required capability (have {have:b}, but require {require:b})"
