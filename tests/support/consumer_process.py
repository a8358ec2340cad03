"""A real `pygazette consumer serve` subprocess on loopback, for integration and fault tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pygazette.auth.tls import ClientTLS
from tests.support.broker_process import BrokerProcess


class ConsumerProcess(BrokerProcess):
    """Starts, kills, freezes and restarts one consumer process (see BrokerProcess: its
    start is retried on another port the same way)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        app: str,
        broker: str,
        etcd: str = "",
        etcd_prefix: str = "",
        zone: str = "local",
        member_id: str = "",
        port: int | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        tls: ClientTLS | None = None,
    ) -> None:
        super().__init__(data_dir, port=port, extra_args=extra_args, env=env, tls=tls)
        self.app = app
        self.broker = broker
        self.etcd = etcd
        self.etcd_prefix = etcd_prefix
        self.zone = zone
        self.member_id = member_id or f"consumer-{self._port.peek()}"
        self.log_path = data_dir.parent / f"consumer-{self._port.peek()}.log"

    def command(self, port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pygazette.cli.main",
            "--log-level",
            "info",
            "consumer",
            "serve",
            "--app",
            self.app,
            "--broker",
            self.broker,
            "--port",
            str(port),
            "--zone",
            self.zone,
            "--id",
            self.member_id,
            "--data-dir",
            str(self.data_dir),
            *(["--etcd", self.etcd] if self.etcd else []),
            *(["--etcd-prefix", self.etcd_prefix] if self.etcd_prefix else []),
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        repo = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
        return env
