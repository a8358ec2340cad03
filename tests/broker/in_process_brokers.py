"""Brokers of one etcd cluster run in the test's own process (their internals inspectable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pygazette.broker.server import Broker, BrokerConfig
from tests.support.etcd_process import EtcdProcess


async def start_brokers(
    tmp: Path, etcd: EtcdProcess, root: str, count: int, **options: Any
) -> list[Broker]:
    """`count` started brokers in one zone, sharing the store under `tmp/store` (each with
    its data under `tmp/broker-<i>`; a 3 s lease), with BrokerConfig's other `options`."""
    brokers: list[Broker] = []
    for i in range(count):
        b = Broker(
            BrokerConfig(
                data_dir=tmp / f"broker-{i}",
                port=0,
                file_root=tmp / "store",
                zone="zone-a",
                broker_id=f"broker-{i}",
                etcd_url=etcd.url,
                etcd_prefix=root,
                lease_ttl=3.0,
                **options,
            )
        )
        await b.start()
        brokers.append(b)
    return brokers
