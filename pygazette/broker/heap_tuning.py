"""Process heap settings for a broker that moves megabyte-sized messages.

Every 1 MiB append chunk becomes a few 1 MiB buffers (gRPC's receive buffer, the message
bytes) that live for a fraction of a millisecond. With glibc's defaults a freed 1 MiB buffer
either goes back to the kernel (mmap'ed chunks, or a heap top trimmed past its threshold)
and the next one is faulted in and zeroed page by page, or the thresholds keep adapting.
Measured on the 2-vCPU benchmark VM, a raw grpc.aio server appends 1 MiB messages ~25%
faster once large buffers are reused from a heap that is neither trimmed nor mmap'ed
(see bench/append_read.py, which reports the raw baseline both ways).

`tune_heap_for_large_messages` fixes those thresholds for the whole process. It is called
once by `pygazette serve`, before the server starts; it does nothing where the C library is
not glibc. The cost is memory: the process keeps up to `trim_threshold` bytes of freed heap
instead of returning it to the kernel.

`tune_gc` makes the cyclic garbage collector's passes fewer and cheaper. An append in flight
is a few dozen short-lived objects (request and response messages, futures, coroutine
frames); with CPython's default of a pass every 700 allocations, most of them are still alive
when the youngest generation is collected, so they are traced, promoted and traced again
(~6 % of a broker's CPU while 5,000 journals take their first appends, `bench/scale.py`
under `perf`). Collecting the youngest generation every 20,000 allocations lets them die by
reference count first, and what was alive at start-up (modules, the server) is frozen out
of every pass.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)

# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

# The youngest generation is collected after this many allocations (CPython's default: 700).
GC_YOUNG_THRESHOLD = 20_000

# Allocations below this come from the heap (glibc's maximum is 32 MiB on 64-bit).
MMAP_THRESHOLD = 32 << 20
# Freed memory at the top of the heap is returned to the kernel only past this much.
TRIM_THRESHOLD = 256 << 20
# The heap grows by at least this much at a time.
TOP_PAD = 16 << 20


def tune_heap_for_large_messages() -> bool:
    """Keep megabyte buffers on a reused heap. True if the settings took effect."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # Not glibc (or no mallopt): leave the allocator alone.
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (_M_TOP_PAD, TOP_PAD),
        )
    )
    if not ok:
        log.warning("mallopt refused the heap settings; using the C library's defaults")
    return ok


def tune_gc() -> None:
    """Fewer, cheaper garbage collections: freeze what is alive now, collect the youngest
    generation every GC_YOUNG_THRESHOLD allocations (the older ones keep their ratios)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
