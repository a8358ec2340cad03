"""The S3 store against a real S3 server process (versitygw, built from the Go module proxy):
the whole store interface, signatures the server verifies (requests and presigned URLs),
and the server going away and coming back with its objects."""

from __future__ import annotations

import asyncio
import gzip
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pygazette.stores.store import (
    FragmentStore,
    StoreAuthError,
    StoreError,
    StoreNotFound,
    open_store,
)
from pygazette.stores.store_health import HEALTH_CHECK_PATH, run_check
from tests.support.s3_real_server import RealS3Server, credentials_env, running_real_s3
from tests.support.tcp_proxy import TcpProxy


@pytest.fixture(scope="module")
def real_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealS3Server]:
    with running_real_s3(tmp_path_factory.mktemp("real-s3")) as server:
        yield server


@pytest.fixture(autouse=True)
def s3_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's credentials, for the stores this test opens (obstore reads them)."""
    for key, value in credentials_env().items():
        monkeypatch.setenv(key, value)


def _open(url: str, tmp_path: Path) -> FragmentStore:
    return open_store(url, file_root=tmp_path)


def _http_get(url: str) -> tuple[int, bytes, str]:
    """(status, body, Content-Encoding) of a plain GET, without credentials of any kind."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Encoding") or ""
    except urllib.error.HTTPError as err:
        return err.code, err.read(), ""


async def test_round_trip(real_s3: RealS3Server, tmp_path: Path) -> None:
    bucket = real_s3.create_bucket()
    store = _open(real_s3.store_url(bucket, "pre/fix"), tmp_path)
    local = tmp_path / "f"
    local.write_bytes(b"0123456789" * 1000)

    assert not await store.exists("j/a/0-1-x.raw")
    await store.put_file("j/a/date=2024-01-02/0-1-x.raw", local)
    await store.put_file("j/a/0-2-y.raw", local, disposable=True)
    assert await store.exists("j/a/0-2-y.raw")
    assert real_s3.object_keys(bucket) == [
        "pre/fix/j/a/0-2-y.raw",
        "pre/fix/j/a/date=2024-01-02/0-1-x.raw",
    ]
    # The server keeps objects as files: what a batch tool on the server's host would read.
    assert real_s3.object_file(bucket, "pre/fix/j/a/0-2-y.raw").read_bytes() == local.read_bytes()

    assert await store.get("j/a/0-2-y.raw") == local.read_bytes()
    rng = await store.read("j/a/0-2-y.raw", start=5, length=7)
    assert (rng.data, rng.size) == (b"5678901", 10_000)
    assert await store.get("j/a/0-2-y.raw", start=9_995) == b"56789"
    assert await store.get("j/a/0-2-y.raw", start=9_995, length=100) == b"56789"
    assert await store.get("j/a/0-2-y.raw", start=10_000) == b""
    assert await store.get("j/a/0-2-y.raw", start=20_000) == b""

    listed = sorted((f.path, f.size) for f in await store.list_files("j/a/"))
    assert listed == [("0-2-y.raw", 10_000), ("date=2024-01-02/0-1-x.raw", 10_000)]
    now = time.time()
    assert all(abs(f.mod_time - now) < 120 for f in await store.list_files("j/a/"))
    assert await store.list_files("j/b/") == []
    # Listing a nested prefix: paths are relative to it.
    assert [f.path for f in await store.list_files("j/a/date=2024-01-02/")] == ["0-1-x.raw"]

    await store.remove("j/a/0-2-y.raw")
    await store.remove("j/a/0-2-y.raw")  # Missing objects are not an error.
    assert not await store.exists("j/a/0-2-y.raw")
    with pytest.raises(StoreNotFound):
        await store.get("j/a/0-2-y.raw")
    assert [f.path for f in await store.list_files("j/")] == ["a/date=2024-01-02/0-1-x.raw"]


async def test_many_objects_list_across_pages(real_s3: RealS3Server, tmp_path: Path) -> None:
    bucket = real_s3.create_bucket()
    store = _open(real_s3.store_url(bucket), tmp_path)
    local = tmp_path / "f"
    local.write_bytes(b"x")
    names = [f"{i:016x}-{i + 1:016x}-{'0' * 40}.raw" for i in range(1100)]
    sem = asyncio.Semaphore(16)

    async def put(name: str) -> None:
        async with sem:
            await store.put_file(f"j/{name}", local)

    await asyncio.gather(*(put(n) for n in names))
    # More than one page of S3's ListObjectsV2 (1000 keys): every object is listed once.
    assert sorted(f.path for f in await store.list_files("j/")) == names


async def test_signed_urls_are_verified_by_the_server(
    real_s3: RealS3Server, tmp_path: Path
) -> None:
    bucket = real_s3.create_bucket()
    store = _open(real_s3.store_url(bucket, "p"), tmp_path)
    body = gzip.compress(b"hello\n" * 100)
    local = tmp_path / "f"
    local.write_bytes(body)
    await store.put_file("j/0-1-x", local, content_encoding="gzip")
    assert real_s3.get_object(bucket, "p/j/0-1-x") == (body, "gzip")
    rng = await store.read("j/0-1-x")
    assert (rng.data, rng.content_encoding) == (body, "gzip")

    url = await store.signed_url("j/0-1-x", 60)
    assert url.startswith(f"{real_s3.endpoint}/{bucket}/p/j/0-1-x?")
    assert "X-Amz-Expires=60" in url and "X-Amz-Signature=" in url
    # A reader with no credentials gets the object, still gzip-encoded, as stored.
    assert await asyncio.to_thread(_http_get, url) == (200, body, "gzip")

    # The server checks what was signed: another key, a changed signature, no signature.
    other = url.replace("/p/j/0-1-x?", "/p/j/0-2-y?")
    assert (await asyncio.to_thread(_http_get, other))[0] == 403
    sig = url.rsplit("X-Amz-Signature=", 1)[1]
    forged = url.replace(sig, ("0" if sig[0] != "0" else "1") + sig[1:])
    assert (await asyncio.to_thread(_http_get, forged))[0] == 403
    assert (await asyncio.to_thread(_http_get, url.split("?")[0]))[0] == 403

    # And when it was signed for: a URL outlives its TTL by nothing.
    short = await store.signed_url("j/0-1-x", 1)
    assert "X-Amz-Expires=1&" in short or short.endswith("X-Amz-Expires=1")
    await asyncio.sleep(2.5)
    assert (await asyncio.to_thread(_http_get, short))[0] == 403


async def test_wrong_credentials_are_refused(
    real_s3: RealS3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = real_s3.create_bucket()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    store = _open(real_s3.store_url(bucket), tmp_path)
    with pytest.raises(StoreError, match="health check PUT failed"):
        await run_check(store)
    with pytest.raises(StoreError, match=r"^list s3://"):
        await store.list_files("j/")
    assert real_s3.object_keys(bucket) == []

    # Each error says why, in the server's words (its error code and message), as Gazette's
    # AWS SDK reports them: it was obstore's first line, cut where the server's XML answer
    # begins ('403 Forbidden: <?xml version="1.0" encoding="UTF-8"?>'). And any 403 is a
    # refusal (StoreAuthError), as Gazette's S3 store's IsAuthError takes it, a listing's too.
    local = tmp_path / "f"
    local.write_bytes(b"x")
    why = (
        "SignatureDoesNotMatch: The request signature we calculated does not match the "
        "signature you provided. Check your key and signing method."
    )
    for call in (
        store.put_file("j/x", local),
        store.get("j/x"),
        store.open_read("j/x"),
        store.list_files("j/"),
    ):
        with pytest.raises(StoreAuthError) as refused:
            await call
        assert str(refused.value).endswith(f"403 Forbidden: {why}"), str(refused.value)
        assert "\n" not in str(refused.value) and "<" not in str(refused.value)
    with pytest.raises(StoreAuthError) as refused:
        await store.exists("j/x")  # A HEAD's answer has no body to say why.
    assert str(refused.value).endswith("non-2xx status code: 403 Forbidden"), str(refused.value)


async def test_health_check(real_s3: RealS3Server, tmp_path: Path) -> None:
    bucket = real_s3.create_bucket()
    await run_check(_open(real_s3.store_url(bucket, "p"), tmp_path))
    assert real_s3.object_keys(bucket) == [f"p/{HEALTH_CHECK_PATH}"]
    with pytest.raises(StoreError, match="health check PUT failed") as failed:
        await run_check(_open(real_s3.store_url("no-such-bucket-here"), tmp_path))
    assert str(failed.value).endswith(
        "404 Not Found: NoSuchBucket: The specified bucket does not exist."
    ), str(failed.value)


async def test_server_down_then_back_with_its_objects(tmp_path: Path) -> None:
    # A server of this test's own: it is killed and restarted on the same port and data.
    with running_real_s3(tmp_path / "s3") as server:
        bucket = server.create_bucket()
        store = _open(server.store_url(bucket), tmp_path)
        local = tmp_path / "f"
        local.write_bytes(b"persisted before the crash")
        await store.put_file("j/0-1-x.raw", local)

        server.kill()
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"^list s3://"):
            await store.list_files("j/")
        with pytest.raises(StoreError, match="health check PUT failed"):
            await run_check(store)
        with pytest.raises(StoreError, match=r"^put s3://"):
            await store.put_file("j/1-2-y.raw", local)
        assert time.monotonic() - started < 60  # Bounded retries, not minutes per call.

        server.start()
        # The same store object (its connection pool saw the server die) works again.
        await run_check(store)
        assert await store.get("j/0-1-x.raw") == b"persisted before the crash"
        await store.put_file("j/1-2-y.raw", local)
        assert [f.path for f in await store.list_files("j/")] == ["0-1-x.raw", "1-2-y.raw"]


async def test_unreachable_through_a_cut_proxy_fails_fast(
    real_s3: RealS3Server, tmp_path: Path
) -> None:
    bucket = real_s3.create_bucket()
    proxy = TcpProxy(real_s3.port)
    try:
        store = _open(real_s3.store_url(bucket, endpoint=proxy.endpoint), tmp_path)
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


@pytest.mark.parametrize("profile", [None, "gazette"])
async def test_credentials_of_the_shared_credentials_file(
    real_s3: RealS3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str | None
) -> None:
    # With no profile= and no keys in the environment, Gazette's AWS SDK (v1) takes the
    # static keys of the shared credentials file ($AWS_SHARED_CREDENTIALS_FILE, else
    # ~/.aws/credentials), profile $AWS_PROFILE or 'default': a deployment that mounts its
    # credentials as that file. obstore does not read it: every request went for instance
    # metadata credentials (169.254.169.254), and the store never worked.
    bucket = real_s3.create_bucket()  # Before AWS_PROFILE, which the test's boto3 would read.
    env = credentials_env()
    creds = tmp_path / "credentials"
    creds.write_text(
        "[other]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n"
        f"[{profile or 'default'}]\naws_access_key_id = {env['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {env['AWS_SECRET_ACCESS_KEY']}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    if profile is not None:
        monkeypatch.setenv("AWS_PROFILE", profile)
    else:
        monkeypatch.delenv("AWS_PROFILE", raising=False)
    # No instance metadata service to fall back on, whatever the host offers.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9")
    store = _open(real_s3.store_url(bucket, "p"), tmp_path)
    await run_check(store)  # Signed requests and a presigned URL the server verifies.

    # Keys in the environment come first, as in the SDK: wrong ones are refused.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(StoreError):
        await run_check(_open(real_s3.store_url(bucket, "p"), tmp_path))
