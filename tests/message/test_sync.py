"""The message layer from synchronous code: publishing from several threads through the
sync client's AppendService, and iterating read-committed messages."""

from __future__ import annotations

import threading

from pygazette.client import SyncJournalClient
from pygazette.message import Publisher, read_committed, read_uncommitted, rendezvous_mapping
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.message.test_exactly_once import spec
from tests.support.broker_process import BrokerProcess

PARTS = ["sync/part-0", "sync/part-1"]


def test_threads_publish_and_a_thread_reads_committed(broker: BrokerProcess) -> None:
    with SyncJournalClient(broker.url) as client:
        client.apply_journals(
            [
                pb.ApplyRequest.Change(upsert=spec(p, topic="sync"), expect_mod_revision=0)
                for p in PARTS
            ]
        )
        listing = pb.ListResponse(journals=client.list_journals("topic=sync"))
        service = client.append_service()
        publisher = Publisher(service)
        mapping = rendezvous_mapping(lambda m: str(m["t"]), listing)

        def produce(t: int) -> None:
            for i in range(500):
                op = publisher.publish_committed(mapping, {"t": t, "i": i})
            op.result(60)  # The thread's last message committed, so did the others.

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        service.wait_all_sync(60)

        seen: dict[int, list[int]] = {}
        for journal in PARTS:
            for env in client.iterate(read_committed(client.client, journal)):
                seen.setdefault(env.message["t"], []).append(env.message["i"])
        # Each thread's messages, each once, in the order it published them.
        assert seen == {t: list(range(500)) for t in range(4)}
        raw = sum(1 for j in PARTS for _ in client.iterate(read_uncommitted(client.client, j)))
        assert raw == 2000
