"""The open-file limit of a broker process.

A broker holds a few files per journal with traffic (its open spool's content and log) and
a socket per client and peer stream; at thousands of journals that passes the usual soft
limit of 1,024 open files, and appends then fail with EMFILE. As Go's runtime does for
Gazette's broker (since Go 1.19), `pygazette serve` raises the soft limit to the hard limit
at start. `pygazette consumer serve` does too: playing a shard's recovery log holds a file
open per live file of its store until playback completes.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)


def raise_open_file_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-file limit", extra={"soft": soft, "error": str(exc)})
        return soft
    return hard
