"""A real, throwaway PostgreSQL server on loopback, for the SQL store's tests.

`initdb` a cluster in a fresh temporary directory and run `postgres` on a free port,
listening on 127.0.0.1 (and a Unix socket in the same directory), with trust auth for the
`postgres` superuser. PostgreSQL refuses to run as root: when the tests run as root, the
server runs as the `postgres` system user (or `nobody`), in a directory it owns.
Readiness is waited for by polling `pg_isready`; `stop()` shuts it down and removes the
directory. A start that finds its port taken moves to another free port (tests/support/ports.py).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.ports import (
    PortInUse,
    ServerPort,
    listens_on,
    log_size,
    output_since,
    says_port_taken,
    start_retrying,
)


def postgres_bin_dir() -> Path | None:
    """The directory of `initdb` and `postgres`: on PATH, else Debian's newest version."""
    on_path = shutil.which("initdb")
    if on_path is not None and shutil.which("postgres") is not None:
        return Path(on_path).resolve().parent  # Debian links them into /usr/local/bin.
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    return Path(found[-1]).parent if found else None


def _server_user() -> pwd.struct_passwd | None:
    """The user to run the server as: None to run as ourselves (not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and there's no 'postgres' or 'nobody' user to run as")


class PostgresProcess:
    """One PostgreSQL server: `start()`, `dsn`, `stop()`."""

    def __init__(self) -> None:
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed (.ci/install-system-deps installs it)")
        self.bin_dir = bin_dir
        self._port = ServerPort()
        self.user = _server_user()
        self.base = Path(tempfile.mkdtemp(prefix="pygazette-pg-"))
        self.data_dir = self.base / "data"
        self.log_path = self.base / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return self._port.number

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _as_server_user(self, argv: list[str]) -> list[str]:
        """`argv` run as the server user, through util-linux's `setpriv` when we are root.

        Not subprocess's `user=`/`group=`: with those, CPython forks instead of vforking,
        and a fork of a test worker that has gRPC threads running can crash the child
        before it execs (gRPC's fork handlers are skipped while other threads call into
        gRPC; CI saw initdb die with SIGSEGV and an epoll error). `setpriv` is exec'd like
        any other program and changes user itself.
        """
        if self.user is None:
            return argv
        return [
            "setpriv",
            f"--reuid={self.user.pw_uid}",
            f"--regid={self.user.pw_gid}",
            "--clear-groups",
            "--",
            *argv,
        ]

    def start(self, timeout: float = 60.0) -> None:
        try:
            self._init_cluster()
            start_retrying(lambda: self._run(timeout), [self._port])
        except BaseException:
            self.stop()
            raise

    def _init_cluster(self) -> None:
        if self.user is not None:
            os.chown(self.base, self.user.pw_uid, self.user.pw_gid)
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        initdb = subprocess.run(
            self._as_server_user(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-sync",
                ]
            ),
            cwd=self.base,
            env=env,
            capture_output=True,
        )
        if initdb.returncode != 0:
            raise RuntimeError(
                f"initdb failed ({initdb.returncode}):\n{initdb.stdout.decode()}"
                f"{initdb.stderr.decode()}"
            )

    def _run(self, timeout: float) -> None:
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        port = self._port.peek()
        offset = log_size(self.log_path)  # This start's output begins here.
        log = open(self.log_path, "ab")
        if self.user is not None:
            os.chown(self.log_path, self.user.pw_uid, self.user.pw_gid)
        self.proc = subprocess.Popen(
            self._as_server_user(
                [
                    str(self.bin_dir / "postgres"),
                    "-D",
                    str(self.data_dir),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-k",
                    str(self.base),
                    # A throwaway server: no durability, small footprint.
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "shared_buffers=16MB",
                    "-c",
                    "max_connections=40",
                ]
            ),
            cwd=self.base,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        try:
            self._wait_ready(port, timeout, offset)
        except BaseException:
            self._stop_server()
            raise

    def _wait_ready(self, port: int, timeout: float, offset: int) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                output = output_since(self.log_path, offset)
                if says_port_taken(output):
                    raise PortInUse(f"port {port} was taken:\n{output[-2000:]}")
                raise RuntimeError(f"postgres exited early ({self.proc.returncode}):\n{self.log()}")
            # Ours listening, not another process that took the port (it would answer).
            if not listens_on(self.proc.pid, port):
                time.sleep(0.05)
                continue
            ready = subprocess.run(
                [
                    str(self.bin_dir / "pg_isready"),
                    "-q",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-U",
                    "postgres",
                    "-t",
                    "1",
                ],
                capture_output=True,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.05)  # pg_isready answers at once while the server starts up.
        if says_port_taken(output_since(self.log_path, offset)):
            raise PortInUse(f"port {port} was taken:\n{self.log()}")
        raise TimeoutError(f"postgres did not become ready on port {port}:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """Fast shutdown (SIGINT: abort sessions, then exit), and remove the directory."""
        try:
            self._stop_server()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def _stop_server(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
