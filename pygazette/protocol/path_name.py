"""A journal name or shard ID as one component of a local path: a broker's spool directory,
a consumer's shard directory.

It is the name quoted (`urllib.parse.quote` with nothing safe: "/" becomes "%2F"), so that it
reads as the name and maps back to it. A valid name may be 512 bytes, and more once quoted,
while file systems take components of up to 255: a quoted name longer than MAX_QUOTED is cut,
and told apart from others by a SHA-256 digest after a "~", which is in no journal name or
shard ID (and `quote` keeps). Such a component does not map back to its name: whoever needs
the name keeps it beside (a spool's log names its journal).
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote

__all__ = ["MAX_QUOTED", "path_name"]

MAX_QUOTED = 200  # Leaves room for a suffix (a revision, a timestamp) within 255 bytes.
_KEPT = 120


def path_name(name: str) -> str:
    """`name` as one path component of at most MAX_QUOTED bytes."""
    quoted = quote(name, safe="")
    if len(quoted) <= MAX_QUOTED:
        return quoted
    digest = hashlib.sha256(name.encode()).hexdigest()[:40]
    return f"{quoted[:_KEPT]}~{digest}"
