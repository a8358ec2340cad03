"""Store URLs: parts, Gazette's query arguments, and opening each scheme without a network."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from pygazette.stores.file_store import FileStore
from pygazette.stores.object_store import ObjectStore
from pygazette.stores.store import StoreError, StoreRegistry, open_store
from pygazette.stores.store_url import parse_store_url


def test_parts_and_case_insensitive_args() -> None:
    u = parse_store_url("s3://Bucket-1/a/b/?ENDPOINT=http://h:9000&region=eu-west-1&Profile=p")
    assert (u.scheme, u.host, u.path, u.prefix) == ("s3", "Bucket-1", "/a/b/", "a/b/")
    assert u.args == {"Endpoint": "http://h:9000", "Region": "eu-west-1", "Profile": "p"}
    assert parse_store_url("file:///").prefix == ""
    assert parse_store_url("gs://bkt/").prefix == ""


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://bucket/no-slash", "doesn't end in '/'"),
        ("s3:///path/", "missing bucket"),
        ("ftp://host/path/", "invalid scheme"),
        ("s3://bucket/?bogus=1", "unknown query argument 'bogus'"),
        ("gs://bucket/?endpoint=http://x", "unknown query argument 'endpoint'"),
        ("file:///a/?region=x", "unknown query argument 'region'"),
        ("s3://bucket/?region=a&Region=b", "is repeated as 'region' with another value"),
        ("file://host/a/", "file scheme cannot have host"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        parse_store_url(url)


def test_urls_gazette_accepts_with_repeated_args_or_a_lone_replace() -> None:
    # Gazette's query decoder takes a repeated key's last value, and RewritePath ignores
    # replace= without find=: a Gazette journal spec with either must open here too.
    u = parse_store_url("s3://bucket/?region=a&region=b&Region=b")
    assert u.args == {"Region": "b"}
    u = parse_store_url("file:///root/?replace=x")
    assert u.rewrite("a/x/b") == "a/x/b"


async def test_s3_endpoint_without_a_scheme_is_https(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Gazette's AWS SDK adds https:// to an endpoint given as host[:port]; it was taken
    # for a relative URL, and every request failed ('relative URL without a base').
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    store = open_store("s3://bkt/pre/?endpoint=minio.example:9000&region=r", file_root=tmp_path)
    url = await store.signed_url("j/0-1-x.raw", 60)
    assert url.startswith("https://minio.example:9000/bkt/pre/j/0-1-x.raw?")


def test_rewrite_replaces_first_occurrence_only() -> None:
    u = parse_store_url("file:///root/?find=/v1/&replace=/old/")
    assert u.rewrite("a/v1/b/v1/c") == "a/old/b/v1/c"
    assert u.rewrite("no/match") == "no/match"
    assert parse_store_url("file:///root/").rewrite("a/v1/") == "a/v1/"


async def test_file_store_with_find_replace(tmp_path: Path) -> None:
    store = open_store("file:///data/?find=bar/v1/&replace=old/", file_root=tmp_path)
    assert isinstance(store, FileStore)
    local = tmp_path / "src"
    local.write_bytes(b"content")
    (tmp_path / "data").mkdir()  # The store's directory (Gazette's file store requires it).
    await store.put_file("foo/bar/v1/j/0-1-x.raw", local)
    assert (tmp_path / "data/foo/old/j/0-1-x.raw").read_bytes() == b"content"
    assert [f.path for f in await store.list_files("foo/bar/v1/j/")] == ["0-1-x.raw"]
    assert await store.exists("foo/bar/v1/j/0-1-x.raw")
    # Signed as Gazette signs: the rewritten path, relative to the file root.
    assert await store.signed_url("foo/bar/v1/j/0-1-x.raw", 60) == "file:///data/foo/old/j/0-1-x.raw"


def test_file_store_cannot_escape_its_root(tmp_path: Path) -> None:
    store = open_store("file:///a/", file_root=tmp_path)
    with pytest.raises(StoreError, match="escapes"):
        store.local_path("../../etc/passwd")


def test_acl_is_refused_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="ACL= is not supported"):
        open_store("s3://bucket/?ACL=bucket-owner-full-control", file_root=tmp_path)


def test_azure_needs_gazettes_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_ACCOUNT_NAME", raising=False)
    monkeypatch.delenv("AZURE_ACCOUNT_KEY", raising=False)
    with pytest.raises(StoreError, match="AZURE_ACCOUNT_NAME and AZURE_ACCOUNT_KEY"):
        open_store("azure://container/prefix/", file_root=tmp_path)
    monkeypatch.delenv("AZURE_CLIENT_ID", raising=False)
    with pytest.raises(StoreError, match="AZURE_CLIENT_ID and AZURE_CLIENT_SECRET"):
        open_store("azure-ad://tenant/account/container/prefix/", file_root=tmp_path)


async def test_azure_shared_key_signs_sas_urls_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("AZURE_ACCOUNT_KEY", base64.b64encode(b"k" * 64).decode())
    store = open_store("azure://container/pre/fix/", file_root=tmp_path)
    assert isinstance(store, ObjectStore)
    url = await store.signed_url("j/0-1-x.gz", 60)
    assert url.startswith("https://acct.blob.core.windows.net/container/pre/fix/j/0-1-x.gz?")
    assert "sig=" in url and "sp=r" in url


def test_registry_retries_stores_that_failed_to_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_ACCOUNT_NAME", raising=False)
    monkeypatch.delenv("AZURE_ACCOUNT_KEY", raising=False)
    registry = StoreRegistry(tmp_path)
    with pytest.raises(StoreError):
        registry.get("azure://container/")
    monkeypatch.setenv("AZURE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("AZURE_ACCOUNT_KEY", base64.b64encode(b"k" * 64).decode())
    store = registry.get("azure://container/")
    assert registry.get("azure://container/") is store


def test_file_store_paths_are_resolved_lexically(tmp_path: Path) -> None:
    store = open_store("file:///a/", file_root=tmp_path)
    base = (tmp_path / "a").resolve()
    assert store.local_path("j/x/../0-1-x.raw") == base / "j" / "0-1-x.raw"
    assert store.local_path("j//0-1-x.raw") == base / "j" / "0-1-x.raw"
    for bad in ("..", "../a-sibling/x", "j/../../x"):
        with pytest.raises(StoreError, match="escapes"):
            store.local_path(bad)
