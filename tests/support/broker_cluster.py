"""Several brokers of one system — Gazette's (interop/bin/gazette) or pygazette's — on one
etcd, as the Go-driven interop runs (the soak, stream-sum) deploy them: one zone, a shared
`file://` store root, and a short etcd lease (3 s) so a killed broker's journals move on
within seconds on both systems."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import EtcdServer, GazetteBinaries, GazetteBroker
from tests.support.process_cpu import cpu_seconds

SYSTEMS = ("pygazette", "gazette")
LEASE_TTL = "3s"

Broker = GazetteBroker | BrokerProcess


class BrokerCluster:
    """Brokers of one system on `etcd`, under a fresh prefix below `prefix`, sharing one
    file:// store root (`store`)."""

    def __init__(
        self,
        system: str,
        binaries: GazetteBinaries,
        etcd: EtcdServer,
        work: Path,
        prefix: str,
        brokers: int = 3,
    ) -> None:
        if system not in SYSTEMS:
            raise ValueError(f"system must be one of {SYSTEMS}, not {system!r}")
        self.system = system
        self.store = store = work / "store"
        store.mkdir(parents=True, exist_ok=True)
        self.prefix = f"{prefix}/{system}-{uuid.uuid4().hex[:8]}"
        self.brokers: list[Broker] = []
        for i in range(brokers):
            if system == "gazette":
                self.brokers.append(
                    GazetteBroker(
                        binaries.gazette,
                        etcd,
                        work / f"broker-{i}",
                        file_root=store,
                        prefix=self.prefix,
                        broker_id=f"gazette-{i}",
                        extra_args=[f"--etcd.lease={LEASE_TTL}"],
                    )
                )
            else:
                data = work / f"broker-{i}" / "data"
                data.parent.mkdir(parents=True, exist_ok=True)
                self.brokers.append(
                    BrokerProcess(
                        data,
                        extra_args=[
                            "--etcd",
                            etcd.url,
                            "--etcd-prefix",
                            self.prefix,
                            "--zone",
                            "local",
                            "--id",
                            f"pygazette-{i}",
                            "--file-root",
                            str(store),
                            "--lease-ttl",
                            LEASE_TTL,
                        ],
                    )
                )

    @property
    def endpoints(self) -> list[str]:
        return [b.url for b in self.brokers]

    def start(self) -> None:
        for b in self.brokers:
            b.start(60.0)

    def cpu_seconds(self) -> float:
        """User and system CPU time the running brokers have used so far, together."""
        total = 0.0
        for b in self.brokers:
            proc = b.proc
            if proc is None or proc.poll() is not None:
                continue
            try:
                total += cpu_seconds(proc.pid)
            except OSError:
                continue
        return total

    def kill(self) -> None:
        for b in self.brokers:
            b.kill()

    def logs(self) -> str:
        return "\n".join(f"--- {b.url}\n{b.log()[-2500:]}" for b in self.brokers)
