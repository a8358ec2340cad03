"""Loopback ports for test and benchmark servers, and retrying a start whose port was taken.

Binding port 0 hands out a port of the kernel's ephemeral range
(`/proc/sys/net/ipv4/ip_local_port_range`), which any outgoing connection may take before the
server binds it: a fresh `make test` once saw etcd exit with "bind: address already in use".
`free_port` chooses outside that range instead, at random (so concurrent pytest processes
rarely meet), checks the port free by binding it without SO_REUSEADDR, and never hands out
the same port twice in one process.

Another process can still take a port between its choice and the server's bind. A harness
therefore keeps each of its ports in a `ServerPort` and starts through `start_retrying`: a
start that fails because its port was taken (`PortInUse`, or a log saying so) runs again on
a new free port, a few times. A port moves only while nothing outside the harness has read
it and the server has not started yet: once a test has passed the address on (a URL in
another process's flags) or the server has served on it (a restart keeps its address),
the port is pinned. `start_on_free_port` is the same for a plain start function.
"""

from __future__ import annotations

import errno
import os
import random
import re
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Linux's default ephemeral range: what to avoid when the file can't be read.
DEFAULT_EPHEMERAL = (32768, 60999)
# Below this: well-known and commonly configured ports (8080, 9092, 5432...): never chosen.
LOWEST = 10000
HIGHEST = 65535
# How many tries a start gets (the first one included) before its PortInUse stands.
START_ATTEMPTS = 5

# What servers print when their port is taken: Go (etcd, versitygw, NATS), grpc, Python,
# Java (Kafka, Spark), PostgreSQL, Redis, werkzeug (moto).
_TAKEN = re.compile(
    r"address already in use|failed to bind|could not bind|bindexception"
    r"|is in use by another program|EADDRINUSE|errno 98\b",
    re.IGNORECASE,
)

_lock = threading.Lock()
_handed_out: set[int] = set()  # Every port `free_port` returned in this process.
_rng = random.SystemRandom()


class PortInUse(OSError):
    """A server could not listen: its port was taken."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EADDRINUSE, message)


def ephemeral_range(path: Path | None = None) -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive, from `path`, by default
    EPHEMERAL_RANGE_FILE); Linux's default if it can't be read."""
    try:
        low, high = (int(x) for x in (path or EPHEMERAL_RANGE_FILE).read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    if not 0 < low <= high <= HIGHEST:
        return DEFAULT_EPHEMERAL
    return low, high


def candidate_ranges(ephemeral: tuple[int, int] | None = None) -> list[range]:
    """The port ranges `free_port` chooses from: [LOWEST, HIGHEST] minus the ephemeral range."""
    low, high = ephemeral or ephemeral_range()
    ranges = [range(LOWEST, min(low, HIGHEST + 1)), range(max(high + 1, LOWEST), HIGHEST + 1)]
    return [r for r in ranges if len(r) > 0]


def is_free(port: int) -> bool:
    """Whether nothing holds `port` on any local IPv4 (or IPv6) address.

    Binds without SO_REUSEADDR, so a port left in TIME_WAIT counts as taken too.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    if socket.has_ipv6:
        try:
            sock6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        except OSError:
            return True  # No IPv6 here: nothing can hold the port there.
        with sock6:
            sock6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock6.bind(("::", port))
            except OSError as exc:
                # EADDRNOTAVAIL: IPv6 configured off; anything else: the port is held.
                return exc.errno == errno.EADDRNOTAVAIL
    return True


def free_port() -> int:
    """A loopback TCP port outside the ephemeral range that nothing holds right now, and
    that this process has not handed out before."""
    ranges = candidate_ranges()
    total = sum(len(r) for r in ranges)
    with _lock:
        for _ in range(200 if total else 0):
            port = _nth(ranges, _rng.randrange(total))
            if port not in _handed_out and is_free(port):
                _handed_out.add(port)
                return port
        # An ephemeral range covering nearly every port (or a machine full of listeners):
        # the kernel's choice is all there is; retries in the harnesses cover its risk.
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def _nth(ranges: Sequence[range], i: int) -> int:
    """The `i`th port of `ranges` taken one after the other."""
    for r in ranges:
        if i < len(r):
            return r[i]
        i -= len(r)
    raise IndexError(i)


def says_port_taken(output: str) -> bool:
    """Whether a server's output says it could not listen because its port was taken."""
    return _TAKEN.search(output) is not None


def output_since(path: Path, offset: int) -> str:
    """What a log file holds past `offset` (one start's output, in a log kept across starts)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def log_size(path: Path) -> int:
    """The log's length now: where the next start's output begins."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _listening_inodes(port: int) -> set[int] | None:
    """Inodes of the TCP sockets listening on `port` (any address), from /proc/net/tcp{,6};
    None if those tables can't be read."""
    inodes: set[int] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            # fields[3] is the state: 0A is LISTEN.
            if len(fields) >= 10 and fields[3] == "0A":
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(int(fields[9]))
    return inodes if readable else None


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc/PID/task/*/children)."""
    pids = [pid]
    for p in pids:  # Grows as children are found.
        for children in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                pids.extend(int(c) for c in children.read_text().split())
            except (OSError, ValueError):
                continue
    return pids


def listens_on(pid: int, port: int) -> bool:
    """Whether process `pid` (or a child of it) listens on TCP `port`, rather than some other
    process (a server started elsewhere on the same port, which would answer in its stead).
    Where /proc can't tell, whether anything accepts a connection on 127.0.0.1:`port`."""
    inodes = _listening_inodes(port)
    if inodes is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False
    if not inodes:
        return False
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for p in _process_tree(pid):
        fd_dir = f"/proc/{p}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") in wanted:
                    return True
            except OSError:
                continue
    return False


def port_was_taken(exc: BaseException) -> bool:
    """Whether `exc` says a listen failed because the port was taken (PortInUse, an OSError
    with EADDRINUSE, or grpc's "Failed to bind" RuntimeError)."""
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return True
    return isinstance(exc, RuntimeError) and says_port_taken(str(exc))


class ServerPort:
    """A port a harness's server listens on: `port` as given (pinned), else a free one that
    may move (`move`) until it is read through `number` or `pin`ned."""

    def __init__(self, port: int | None = None) -> None:
        self._port = port or free_port()
        self._pinned = bool(port)

    @property
    def number(self) -> int:
        """The port, for use outside the harness: from now on it stays what it is."""
        self._pinned = True
        return self._port

    def peek(self) -> int:
        """The port, for the harness's own start (it may still move)."""
        return self._port

    @property
    def pinned(self) -> bool:
        return self._pinned

    def pin(self) -> None:
        """Keep this port from now on (the server has served on it)."""
        self._pinned = True

    def move(self) -> bool:
        """Take a new free port, unless pinned; whether it moved."""
        if self._pinned:
            return False
        self._port = free_port()
        return True


def start_retrying(
    start: Callable[[], T],
    ports: Sequence[ServerPort],
    *,
    taken: Callable[[BaseException], bool] = port_was_taken,
    attempts: int = START_ATTEMPTS,
) -> T:
    """`start()`; while it fails because a port was taken (`taken`), move the movable
    `ports` to new free ones and start again, up to `attempts` starts in all. The last
    failure stands when no port can move. Pins the ports once started."""
    for attempt in range(1, attempts + 1):
        try:
            result = start()
        except Exception as exc:
            if not taken(exc) or attempt == attempts:
                raise
            moved = [p.move() for p in ports]  # Every movable one: which was taken is unsaid.
            if not any(moved):
                raise
            continue
        for p in ports:
            p.pin()
        return result
    raise AssertionError("unreachable")


def start_on_free_port(
    start: Callable[[int], T],
    *,
    port: int | None = None,
    taken: Callable[[BaseException], bool] = port_was_taken,
    attempts: int = START_ATTEMPTS,
) -> T:
    """`start(port)` on `port` (a free one if None), retried on new free ports while it
    fails because its port was taken (a given `port` is kept: it is not retried)."""
    server_port = ServerPort(port)
    return start_retrying(
        lambda: start(server_port.peek()), [server_port], taken=taken, attempts=attempts
    )
