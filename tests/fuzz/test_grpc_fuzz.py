"""Fuzzing every gRPC method of a broker and a consumer process with hostile requests.

Against real `pygazette serve` (a cluster member, so Replicate is served) and
`pygazette consumer serve` processes, Hypothesis sends each method random bytes and
well-formed protobuf with hostile values (`hostile.py`): huge and negative offsets and
lengths, unknown enum values, 10 MB labels and names, 10 000-label selectors, bogus routes,
headers and proposals. Each call must be answered within a deadline with a response or an
error status, never UNKNOWN or INTERNAL (an exception the server did not mean); the process
stays up; its resident memory stays bounded.

Bounded time: `PYGAZETTE_FUZZ_EXAMPLES` examples per method and kind (default 20: some 520
calls, 10-30 s in all); raise it for a longer campaign. Failing examples are reported as
found, not shrunk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import retention_pb2 as rpb
from tests.fuzz.hostile import message, random_bytes
from tests.fuzz.servers import Target, rss_bytes, start_broker, start_consumer
from tests.support.cluster import Cluster
from tests.support.etcd_process import EtcdProcess

EXAMPLES = int(os.environ.get("PYGAZETTE_FUZZ_EXAMPLES", "20"))
DEADLINE = 15.0  # Seconds a call may take (2 shared cores; a 10 MB message is parsed twice).
MAX_STREAM_RESPONSES = 64  # A read of a long journal is cut off here: it answered.
# The bound on a process's resident memory. 10 MB requests (of the 64 MiB a server accepts)
# grow a broker's heap to a plateau some 700 MiB above its start: glibc keeps freed heap
# for reuse (the broker keeps up to 256 MiB untrimmed on purpose, see heap_tuning), per
# arena. A leak of the 10 MB values would pass this within a few dozen requests.
RSS_LIMIT = 1536 << 20
# Codes that mean the server failed (an unexpected exception, a crash, a hang).
FAILED = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    database=None,
    # No shrinking: a failing example is reported as found (bounded time in `make test`).
    phases=[Phase.explicit, Phase.generate],
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)


@dataclass(frozen=True)
class Method:
    path: str
    shape: str  # unary_unary, unary_stream, stream_unary or stream_stream.
    request: type[Message]

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]


BROKER_METHODS = [
    Method("/protocol.Journal/List", "unary_stream", pb.ListRequest),
    Method("/protocol.Journal/Apply", "unary_unary", pb.ApplyRequest),
    Method("/protocol.Journal/Read", "unary_stream", pb.ReadRequest),
    Method("/protocol.Journal/Append", "stream_unary", pb.AppendRequest),
    Method("/protocol.Journal/Replicate", "stream_stream", pb.ReplicateRequest),
    Method("/protocol.Journal/ListFragments", "unary_unary", pb.FragmentsRequest),
    Method("/protocol.Journal/FragmentStoreHealth", "unary_unary", pb.FragmentStoreHealthRequest),
    Method("/pygazette.Retention/Prune", "unary_unary", rpb.PruneRequest),
]
CONSUMER_METHODS = [
    Method("/consumer.Shard/Stat", "unary_unary", cpb.StatRequest),
    Method("/consumer.Shard/List", "unary_unary", cpb.ListRequest),
    Method("/consumer.Shard/Apply", "unary_unary", cpb.ApplyRequest),
    Method("/consumer.Shard/GetHints", "unary_unary", cpb.GetHintsRequest),
    Method("/consumer.Shard/Unassign", "unary_unary", cpb.UnassignRequest),
]


@pytest.fixture(scope="module")
def broker_target(
    tmp_path_factory: pytest.TempPathFactory, etcd: EtcdProcess
) -> Iterator[tuple[Target, Target]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    cluster: Cluster | None = None
    consumer: Target | None = None
    try:
        cluster, broker = start_broker(tmp, etcd)
        consumer = start_consumer(tmp, broker.proc)
        yield broker, consumer
    finally:
        if consumer is not None:
            consumer.proc.kill()
        if cluster is not None:
            for b in cluster.brokers:
                b.kill()


def _may_wait(method: Method, payloads: list[bytes]) -> bool:
    """Whether the request legitimately waits past the deadline, as with Gazette: a blocking
    read or a watching List (they stream until the client goes away), or a request reading
    through an etcd revision (a proxy header's, a watch's resume point) the cluster may
    never reach."""
    try:
        first = method.request.FromString(payloads[0])
    except DecodeError:
        return False
    if getattr(first, "block", False) or getattr(first, "watch", False):
        return True
    if first.DESCRIPTOR.fields_by_name.get("watch_resume") and first.HasField("watch_resume"):
        return True
    header = first.DESCRIPTOR.fields_by_name.get("header")
    return bool(header and first.HasField("header") and first.header.etcd.revision > 1)


def call(channel: grpc.Channel, method: Method, payloads: list[bytes]) -> None:
    """Send `payloads` (one, or the request stream) raw; fail unless answered properly."""
    raw = getattr(channel, method.shape)(
        method.path, request_serializer=None, response_deserializer=None
    )
    request = iter(payloads) if method.shape.startswith("stream") else payloads[0]
    try:
        if method.shape.endswith("_stream"):
            responses = raw(request, timeout=DEADLINE)
            for n, _ in enumerate(responses):
                if n >= MAX_STREAM_RESPONSES:
                    responses.cancel()
                    break
        else:
            raw(request, timeout=DEADLINE)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.CANCELLED:
            return  # We cut a long stream off.
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and _may_wait(method, payloads):
            return
        assert code not in FAILED, (
            f"{method.name}: {code.name}: {exc.details()}; request {_describe(payloads)}"
        )


def _describe(payloads: list[bytes]) -> str:
    return ", ".join(f"{len(p)} bytes {p[:80]!r}{'...' if len(p) > 80 else ''}" for p in payloads)


def _hostile_payloads(method: Method) -> st.SearchStrategy[list[bytes]]:
    """Serialized hostile messages: one request, or a stream of one to four."""
    one = message(method.request.DESCRIPTOR).map(_defused).map(lambda m: m.SerializeToString())
    if method.shape.startswith("stream"):
        return st.lists(one, min_size=1, max_size=4)
    return one.map(lambda p: [p])


def _defused(msg: Message) -> Message:
    """Keep hostile requests from legitimately waiting until the deadline (`_may_wait`):
    hostile values stay everywhere else, a proxy header's route and process included."""
    if isinstance(msg, pb.ReadRequest):
        msg.block = False
    if isinstance(msg, pb.ListRequest):
        msg.watch = False
        msg.ClearField("watch_resume")
    if "header" in msg.DESCRIPTOR.fields_by_name and msg.HasField("header"):
        header = msg.header
        if header.etcd.revision > 1:
            header.etcd.revision = 1
    return msg


def _random_payloads(method: Method) -> st.SearchStrategy[list[bytes]]:
    if method.shape.startswith("stream"):
        return st.lists(random_bytes(), min_size=1, max_size=3)
    return random_bytes().map(lambda p: [p])


def _fuzz(target: Target, method: Method, payloads: st.SearchStrategy[list[bytes]]) -> None:
    with grpc.insecure_channel(
        target.proc.address,
        options=[
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20),
        ],
    ) as channel:

        @SETTINGS
        @given(payloads)
        def run(requests: list[bytes]) -> None:
            call(channel, method, requests)
            target.check_alive()

        run()
    rss = rss_bytes(target.proc.pid)
    target.baseline_rss = target.baseline_rss or rss
    assert rss < RSS_LIMIT, (
        f"{method.name}: RSS grew from {target.baseline_rss >> 20} MiB to {rss >> 20} MiB"
    )


@pytest.mark.parametrize("method", BROKER_METHODS, ids=lambda m: m.name)
def test_broker_hostile_protobuf(broker_target: tuple[Target, Target], method: Method) -> None:
    _fuzz(broker_target[0], method, _hostile_payloads(method))


@pytest.mark.parametrize("method", BROKER_METHODS, ids=lambda m: m.name)
def test_broker_random_bytes(broker_target: tuple[Target, Target], method: Method) -> None:
    _fuzz(broker_target[0], method, _random_payloads(method))


@pytest.mark.parametrize("method", CONSUMER_METHODS, ids=lambda m: m.name)
def test_consumer_hostile_protobuf(broker_target: tuple[Target, Target], method: Method) -> None:
    _fuzz(broker_target[1], method, _hostile_payloads(method))


@pytest.mark.parametrize("method", CONSUMER_METHODS, ids=lambda m: m.name)
def test_consumer_random_bytes(broker_target: tuple[Target, Target], method: Method) -> None:
    _fuzz(broker_target[1], method, _random_payloads(method))


def test_servers_still_serve(broker_target: tuple[Target, Target], tmp_path: Path) -> None:
    """After the campaign: both processes answer ordinary requests."""
    broker, consumer = broker_target
    with grpc.insecure_channel(broker.proc.address) as channel:
        listed = channel.unary_stream(
            "/protocol.Journal/List",
            request_serializer=pb.ListRequest.SerializeToString,
            response_deserializer=pb.ListResponse.FromString,
        )(pb.ListRequest(), timeout=DEADLINE)
        assert next(iter(listed)).status == pb.OK
    with grpc.insecure_channel(consumer.proc.address) as channel:
        resp = channel.unary_unary(
            "/consumer.Shard/List",
            request_serializer=cpb.ListRequest.SerializeToString,
            response_deserializer=cpb.ListResponse.FromString,
        )(cpb.ListRequest(), timeout=DEADLINE)
        assert resp.status == cpb.Status.OK
    broker.check_alive()
    consumer.check_alive()
