"""The S3 store against a local S3-compatible server (moto_server) on loopback."""

from __future__ import annotations

import asyncio
import gzip
import re
import time
import urllib.request
from pathlib import Path

import pytest
from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

from pygazette.stores import object_store
from pygazette.stores.store import StoreAuthError, StoreError, StoreNotFound, open_store
from pygazette.stores.store_health import HEALTH_CHECK_PATH, run_check
from tests.support.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server
from tests.support.tcp_proxy import TcpProxy


def _open(url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return open_store(url, file_root=tmp_path)


async def test_round_trip(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = s3_server.create_bucket()
    store = _open(s3_server.store_url(bucket, "pre/fix"), tmp_path)
    local = tmp_path / "f"
    local.write_bytes(b"0123456789" * 1000)

    assert not await store.exists("j/a/0-1-x.raw")
    await store.put_file("j/a/date=2024-01-02/0-1-x.raw", local)
    await store.put_file("j/a/0-2-y.raw", local)
    assert await store.exists("j/a/0-2-y.raw")
    assert s3_server.object_keys(bucket) == [
        "pre/fix/j/a/0-2-y.raw",
        "pre/fix/j/a/date=2024-01-02/0-1-x.raw",
    ]

    assert await store.get("j/a/0-2-y.raw") == local.read_bytes()
    rng = await store.read("j/a/0-2-y.raw", start=5, length=7)
    assert (rng.data, rng.size) == (b"5678901", 10_000)
    assert await store.get("j/a/0-2-y.raw", start=9_995) == b"56789"
    assert await store.get("j/a/0-2-y.raw", start=10_000) == b""

    listed = sorted((f.path, f.size) for f in await store.list_files("j/a/"))
    assert listed == [("0-2-y.raw", 10_000), ("date=2024-01-02/0-1-x.raw", 10_000)]
    now = time.time()
    assert all(abs(f.mod_time - now) < 120 for f in await store.list_files("j/a/"))
    assert await store.list_files("j/b/") == []

    url = await store.signed_url("j/a/0-2-y.raw", 60)
    assert url.startswith(s3_server.endpoint + f"/{bucket}/pre/fix/j/a/0-2-y.raw?")
    assert "X-Amz-Signature=" in url
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
    assert body == local.read_bytes()

    await store.remove("j/a/0-2-y.raw")
    await store.remove("j/a/0-2-y.raw")  # Missing objects are not an error.
    assert not await store.exists("j/a/0-2-y.raw")
    with pytest.raises(StoreNotFound):
        await store.get("j/a/0-2-y.raw")


async def test_content_encoding_is_stored_and_reported(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = s3_server.create_bucket()
    store = _open(s3_server.store_url(bucket), tmp_path)
    local = tmp_path / "f"
    local.write_bytes(gzip.compress(b"hello\n" * 100))
    await store.put_file("j/0-1-x", local, content_encoding="gzip")
    body, encoding = s3_server.get_object(bucket, "j/0-1-x")
    assert (body, encoding) == (local.read_bytes(), "gzip")
    rng = await store.read("j/0-1-x")
    assert (rng.data, rng.content_encoding) == (local.read_bytes(), "gzip")


async def test_find_replace_rewrites_object_keys(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = s3_server.create_bucket()
    url = s3_server.store_url(bucket, "root") + "&find=/bar/v1/&replace=/old/"
    store = _open(url, tmp_path)
    local = tmp_path / "f"
    local.write_bytes(b"x")
    await store.put_file("foo/bar/v1/views/0-1-x.raw", local)
    assert s3_server.object_keys(bucket) == ["root/foo/old/views/0-1-x.raw"]
    assert [f.path for f in await store.list_files("foo/bar/v1/views/")] == ["0-1-x.raw"]


async def test_health_check_passes_and_leaves_gazettes_test_object(
    s3_server: S3Server, tmp_path: Path
) -> None:
    bucket = s3_server.create_bucket()
    store = _open(s3_server.store_url(bucket, "p"), tmp_path)
    await run_check(store)
    assert s3_server.object_keys(bucket) == [f"p/{HEALTH_CHECK_PATH}"]


async def test_missing_bucket_fails_the_health_check(s3_server: S3Server, tmp_path: Path) -> None:
    store = _open(s3_server.store_url("no-such-bucket-here"), tmp_path)
    with pytest.raises(StoreError, match="health check PUT failed"):
        await run_check(store)


async def test_a_missing_bucket_or_denied_request_is_an_auth_error(
    s3_server: S3Server, tmp_path: Path
) -> None:
    # As Gazette's S3 store's IsAuthError (NoSuchBucket, AccessDenied, 403): an exiting
    # broker persists to the journal's next store what such a store refuses. obstore
    # reports the missing bucket of a put as an object not found.
    store = _open(s3_server.store_url("no-such-bucket-either"), tmp_path)
    local = tmp_path / "f"
    local.write_bytes(b"x")
    with pytest.raises(StoreAuthError):
        await store.put_file("j/0-1-x.raw", local)
    denied = object_store.ObjectStore.__new__(object_store.ObjectStore)
    denied.url = "s3://bucket/"
    for exc in (PermissionDeniedError("403 Forbidden"), UnauthenticatedError("401")):
        assert isinstance(denied._error("put", "j/x", exc), StoreAuthError)
    assert type(denied._error("get", "j/x", FileNotFoundError("gone"))) is StoreNotFound


async def test_a_missing_object_whose_key_names_an_auth_error_code_is_not_found(
    s3_server: S3Server, tmp_path: Path
) -> None:
    # The error codes are read from the store's answer (<Code>...</Code>), not from anywhere
    # in the message, which names the key: a fragment of a journal 'logs/AccessDenied' gone
    # from the store (retention) is not found (a read refreshes its index and goes on), not
    # a refusal.
    store = _open(s3_server.store_url(s3_server.create_bucket()), tmp_path)
    for name in ("AccessDenied", "NoSuchBucket", "ContainerNotFound"):
        with pytest.raises(StoreNotFound):
            await store.read(f"logs/{name}/0000000000000000-0000000000000001-x.raw")


async def test_unreachable_endpoint_fails_fast(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = s3_server.create_bucket()
    proxy = TcpProxy(s3_server.port)
    try:
        store = _open(s3_server.store_url(bucket, endpoint=proxy.endpoint), tmp_path)
        await run_check(store)
        proxy.cut()
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"^list s3://"):
            await store.list_files("j/")
        assert time.monotonic() - started < 15
        proxy.restore()
        await run_check(store)
    finally:
        proxy.close()


async def test_profile_reads_the_shared_aws_files(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "credentials"
    creds.write_text(
        f"[gazette]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    config = tmp_path / "config"
    config.write_text(f"[profile gazette]\nregion = {REGION}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    bucket = s3_server.create_bucket()
    store = _open(f"s3://{bucket}/?endpoint={s3_server.endpoint}&profile=gazette", tmp_path)
    await run_check(store)

    with pytest.raises(StoreError, match="no credentials for AWS profile 'nope'"):
        _open(f"s3://{bucket}/?endpoint={s3_server.endpoint}&profile=nope", tmp_path)


async def test_storage_class_and_sse_args_are_accepted(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = s3_server.create_bucket()
    url = s3_server.store_url(bucket) + "&storageClass=STANDARD_IA&SSE=AES256"
    store = _open(url, tmp_path)
    local = tmp_path / "f"
    local.write_bytes(b"x")
    await store.put_file("j/0-1-x.raw", local)
    assert await store.get("j/0-1-x.raw") == b"x"


async def test_a_listing_holds_keys_the_object_store_client_refuses(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """S3 keys are any UTF-8; obstore refuses some as paths (an empty or '.' segment, a
    control character) and failed the whole listing for one of them, hiding every fragment
    beside it. They are listed as they are (the broker then skips them as no fragments)."""
    import boto3

    bucket = s3_server.create_bucket()
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    keys = ["0-1-x.raw", "a//b", "./c", "d/../e", "f\x01g", "h i+j%2Fk", "date=1/0-2-y.raw"]
    keys += [f"many/{i:04d}" for i in range(1100)]  # More than a page of the listing.
    for key in keys:
        s3.put_object(Bucket=bucket, Key=f"pre/j/a/{key}", Body=b"12345")
    s3.put_object(Bucket=bucket, Key="pre/j/b/0-1-z.raw", Body=b"1")
    store = _open(s3_server.store_url(bucket, "pre"), tmp_path)
    listed = await store.list_files("j/a/")
    assert sorted(f.path for f in listed) == sorted(keys)
    assert {f.size for f in listed} == {5}
    assert all(abs(f.mod_time - time.time()) < 120 for f in listed)


def test_a_raw_listing_goes_where_the_store_does_with_the_environments_endpoint_and_region(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store whose endpoint and region come from the environment (obstore reads AWS_ENDPOINT
    and AWS_DEFAULT_REGION, as it reads every AWS_ setting) lists keys obstore refuses from that
    endpoint too, signed for that region; it signed for us-east-1 and sent the listing to
    AWS's s3.us-east-1.amazonaws.com, another service, with the store's key id."""
    from pygazette.stores import s3_listing

    monkeypatch.setenv("AWS_ENDPOINT", "https://objects.example.test:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    sent: list[urllib.request.Request] = []

    class _Answer:
        def __enter__(self) -> _Answer:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def read(self) -> bytes:
            return (
                b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                b"<IsTruncated>false</IsTruncated><Contents><Key>pre/j/a//b</Key>"
                b"<Size>5</Size><LastModified>2026-11-30T07:00:00.000Z</LastModified>"
                b"</Contents></ListBucketResult>"
            )

    def urlopen(request: urllib.request.Request, timeout: float) -> _Answer:
        sent.append(request)
        return _Answer()

    monkeypatch.setattr(s3_listing.urllib.request, "urlopen", urlopen)
    store = _open("s3://bkt/pre/", tmp_path)
    listed = store._list_raw("j/")
    assert [(f.path, f.size) for f in listed] == [("a//b", 5)]
    (request,) = sent
    assert request.full_url.startswith("https://objects.example.test:9000/bkt?")
    assert "/eu-west-3/s3/aws4_request" in request.get_header("Authorization")


async def _read_all(store, path: str, **kw) -> tuple[bytes, list[int], str, int]:  # type: ignore[no-untyped-def]
    reader = await store.open_read(path, **kw)
    chunks = []
    while chunk := await reader.next():
        chunks.append(chunk)
    assert await reader.next() == b""
    await reader.aclose()
    return b"".join(chunks), [len(c) for c in chunks], reader.content_encoding, reader.size


async def test_open_read_streams_an_object_or_a_range_of_it(
    s3_server: S3Server, tmp_path: Path
) -> None:
    bucket = s3_server.create_bucket()
    store = _open(s3_server.store_url(bucket, "pre"), tmp_path)
    data = bytes(range(256)) * (12 * 4096)  # 12 MiB.
    local = tmp_path / "f"
    local.write_bytes(data)
    await store.put_file("j/0-1-x.raw", local)
    await store.put_file("j/0-1-x.gz", local, content_encoding="gzip")

    got, sizes, encoding, size = await _read_all(store, "j/0-1-x.raw", chunk_size=1 << 20)
    assert (got, encoding, size) == (data, "", len(data))
    assert len(sizes) >= 8 and all(s >= 1 << 20 for s in sizes[:-1])  # Chunks as asked.
    assert (await _read_all(store, "j/0-1-x.gz"))[2] == "gzip"
    for start, length in ((5, 7), (5, -1), (len(data) - 3, -1), (len(data) - 3, 100), (0, 0)):
        want = data[start : start + length] if length >= 0 else data[start:]
        assert (await _read_all(store, "j/0-1-x.raw", start=start, length=length))[0] == want
    for start in (len(data), len(data) + 10):
        assert (await _read_all(store, "j/0-1-x.raw", start=start))[0] == b""
    with pytest.raises(StoreNotFound):
        await store.open_read("j/missing.raw")
    # The default of stores without a streaming read: ranged reads, one after another.
    files = _open("file:///", tmp_path / "root")
    (tmp_path / "root" / "j").mkdir(parents=True)
    (tmp_path / "root" / "j" / "0-1-x.raw").write_bytes(data)
    got, sizes, _, size = await _read_all(files, "j/0-1-x.raw", chunk_size=5 << 20)
    assert (got, sizes, size) == (data, [5 << 20, 5 << 20, 2 << 20], len(data))
    assert (await _read_all(files, "j/0-1-x.raw", start=7, length=6 << 20))[0] == data[
        7 : 7 + (6 << 20)
    ]
    with pytest.raises(StoreNotFound):
        await files.open_read("j/missing.raw")


def test_errors_are_described_by_the_stores_own_reason() -> None:
    # obstore's reports, as it words them: the first line ends where the store's answer
    # begins; the reason is in the answer (S3's and Azure's XML, GCS's JSON).
    head = "Error performing GET https://h/b/j/x in 5ms - Server returned non-2xx status code"
    azure = (
        f'Generic MicrosoftAzure error: {head}: 403 Forbidden: \ufeff<?xml version="1.0" '
        'encoding="utf-8"?><Error><Code>AuthenticationFailed</Code><Message>Server failed to '
        "authenticate the request. Make sure the value of Authorization header is formed "
        "correctly including the signature.\nRequestId:1234\nTime:2026-11-30T10:00:00Z"
        "</Message></Error>\n\nDebug source:\nGeneric { <Code>Other</Code> }"
    )
    assert object_store.describe(Exception(azure)) == (
        f"Generic MicrosoftAzure error: {head}: 403 Forbidden: AuthenticationFailed: Server "
        "failed to authenticate the request. Make sure the value of Authorization header is "
        "formed correctly including the signature."
    )
    gcs = (
        f"Generic GCS error: {head}: 403 Forbidden: {{\n"
        '  "error": {\n    "code": 403,\n    "message": "sa@p.iam.gserviceaccount.com does '
        'not have storage.objects.get access to the Google Cloud Storage object. \\"x\\"",\n'
        '    "errors": []\n  }\n}\n\nDebug source:\nGeneric {}'
    )
    assert object_store.describe(Exception(gcs)) == (
        f"Generic GCS error: {head}: 403 Forbidden: sa@p.iam.gserviceaccount.com does not "
        'have storage.objects.get access to the Google Cloud Storage object. "x"'
    )
    s3 = (
        f'Object at location j/x not found: {head}: 404 Not Found: <?xml version="1.0" '
        'encoding="UTF-8"?>\n<Error><Code>NoSuchKey</Code><Message>The specified key does '
        "not exist &amp; never did.</Message></Error>\n\nDebug source:\nNotFound {}"
    )
    assert object_store.describe(Exception(s3)) == (
        f"Object at location j/x not found: {head}: 404 Not Found: NoSuchKey: The specified "
        "key does not exist & never did."
    )
    # Without an answer: the first line, without a dangling ': '.
    assert object_store.describe(Exception(f"{head}: 403 Forbidden: \n\nDebug")) == (
        f"{head}: 403 Forbidden"
    )
    assert object_store.describe(Exception("HTTP error: error sending request\nmore")) == (
        "HTTP error: error sending request"
    )
    # A request that got no answer: the innermost cause, from the debug dump.
    body = (
        "Generic S3 error: HTTP error: request or response body error\n\nDebug source:\n"
        "Generic { source: HttpError { kind: Timeout, source: reqwest::Error { kind: Body, "
        "source: TimedOut } } }"
    )
    assert object_store.describe(Exception(body)) == (
        "Generic S3 error: HTTP error: request or response body error: timed out"
    )
    tls = (
        f"{head} - HTTP error: error sending request\n\nDebug source:\nGeneric {{ source: "
        "Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) } }"
    )
    assert object_store.describe(Exception(tls)).endswith(
        "error sending request: InvalidCertificate(UnknownIssuer)"
    )


async def test_a_stream_stalled_mid_object_resumes_or_fails_within_the_stall_timeout(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A streaming read has no deadline on the whole GET (a reader may take its time), only
    # on stalls: a connection silently lost mid-object is noticed after STALL_TIMEOUT, and
    # the rest of the object is fetched again from where it stopped (the client's retry).
    from datetime import timedelta

    from pygazette.stores import cloud_stores

    monkeypatch.setattr(cloud_stores, "STALL_TIMEOUT", timedelta(seconds=1))
    bucket = s3_server.create_bucket()
    data = bytes(range(256)) * (64 * 4096)  # 64 MiB: far more than the connection buffers.
    local = tmp_path / "f"
    local.write_bytes(data)
    proxy = TcpProxy(s3_server.port)
    try:
        store = _open(s3_server.store_url(bucket, endpoint=proxy.endpoint), tmp_path)
        await store.put_file("j/0-1-x.raw", local)
        reader = await store.open_read("j/0-1-x.raw")
        got = [await reader.next()]
        proxy.stall_open()
        started = time.monotonic()
        while chunk := await reader.next():
            got.append(chunk)
        assert b"".join(got) == data
        assert time.monotonic() - started < 30  # A margin for a loaded machine.
        # And a store that cannot be reached says why, not just 'error sending request'.
        proxy.cut()  # Connections accepted, and closed at once.
        with pytest.raises(StoreError) as failed:
            await store.open_read("j/0-1-x.raw")
        # How depends on timing: 'the connection closed before the answer was complete',
        # '... before the request was sent', 'Connection reset by peer'.
        assert re.search(r"error sending request: \w", str(failed.value)), str(failed.value)
    finally:
        proxy.close()
    refused = _open(f"s3://{bucket}/?endpoint=http://127.0.0.1:1&region={REGION}", tmp_path)
    with pytest.raises(StoreError) as failed:
        await refused.list_files("j/")
    assert str(failed.value).endswith("error sending request: Connection refused"), str(
        failed.value
    )
