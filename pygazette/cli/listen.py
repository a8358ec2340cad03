"""A server's gRPC address, tried before gRPC binds it. gRPC reports an address it cannot
bind (a port in use) with a C-core log line and a RuntimeError traceback, so `serve` and
`consumer serve` bind a plain socket there first and fail in one line."""

from __future__ import annotations

import errno
import socket

import click


def check_listen_address(host: str, port: int) -> None:
    """Raise a one-line ClickException unless `host:port` can be bound (port 0 always can)."""
    if port == 0:
        return
    where = f"cannot serve gRPC on {host}:{port}"
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise click.ClickException(f"{where}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As a server binds: an address whose connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                why += " (another process listens there; --port picks another port)"
            raise click.ClickException(f"{where}: {why}") from None
