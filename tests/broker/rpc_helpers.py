"""Raw-stub helpers for broker RPC tests (kept free of the client layer on purpose)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc


def journal_spec(
    name: str,
    *,
    length: int = 1 << 20,
    codec: int = pb.NONE,
    stores: Iterable[str] = ("file:///",),
    replication: int = 1,
    flags: int = 0,
    labels: dict[str, str] | None = None,
    max_append_rate: int = 0,
) -> pb.JournalSpec:
    spec = pb.JournalSpec(
        name=name, replication=replication, flags=flags, max_append_rate=max_append_rate
    )
    for k, v in sorted((labels or {}).items()):
        spec.labels.labels.add(name=k, value=v)
    spec.fragment.length = length
    spec.fragment.compression_codec = codec
    spec.fragment.stores.extend(stores)
    spec.fragment.refresh_interval.seconds = 60
    return spec


async def apply_specs(stub: pb_grpc.JournalStub, *specs: pb.JournalSpec) -> pb.ApplyResponse:
    req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s) for s in specs])
    return await stub.Apply(req)


async def append(
    stub: pb_grpc.JournalStub,
    journal: str,
    *chunks: bytes,
    commit: bool = True,
    **options: object,
) -> pb.AppendResponse:
    async def requests() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=journal, **options)  # type: ignore[arg-type]
        for chunk in chunks:
            yield pb.AppendRequest(content=chunk)
        if commit:
            yield pb.AppendRequest()

    return await stub.Append(requests(), timeout=30)


async def read_all(
    stub: pb_grpc.JournalStub, journal: str, offset: int = 0, **options: object
) -> tuple[bytes, list[pb.ReadResponse]]:
    """Content and metadata responses of a non-blocking read from `offset`."""
    content = bytearray()
    meta = []
    async for resp in stub.Read(
        pb.ReadRequest(journal=journal, offset=offset, **options),
        timeout=30,  # type: ignore[arg-type]
    ):
        if resp.content:
            content += resp.content
        else:
            meta.append(resp)
    return bytes(content), meta


async def list_once(stub: pb_grpc.JournalStub, req: pb.ListRequest) -> pb.ListResponse:
    """One List snapshot, its chunks merged into one response."""
    merged = pb.ListResponse()
    async for resp in stub.List(req, timeout=30):
        merged.MergeFrom(resp)
    return merged
