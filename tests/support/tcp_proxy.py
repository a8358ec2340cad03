"""A loopback TCP proxy that a test can cut and restore, to make a server unreachable.

While cut, it resets every open connection and refuses new ones (accepts and closes them at
once), so clients see the server as down without the server losing its state.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading

from tests.support.ports import free_port

# SO_LINGER on with a zero timeout: close() sends a reset.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


class TcpProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.setblocking(False)
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._thread = threading.Thread(target=self._serve, name="tcp-proxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Drop every connection and refuse new ones until `restore`."""
        self._cut.set()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
                    s.close()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        while not self._stop.is_set():
            for _key, _ in sel.select(timeout=0.1):
                try:
                    client, _addr = self._listener.accept()
                except OSError:
                    continue
                if self._cut.is_set():
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                    upstream.settimeout(None)
                    client.setblocking(True)
                except OSError:
                    client.close()
                    continue
                with self._lock:
                    self._pairs.append((client, upstream))
                for src, dst in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()
        sel.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
