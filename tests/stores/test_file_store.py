"""The file:// store: paths under its root, and URLs signed as Gazette signs them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from pygazette.stores.file_store import FileStore
from pygazette.stores.store import StoreAuthError, StoreError
from pygazette.stores.store_url import parse_store_url


async def test_signed_urls_are_relative_to_the_file_root(tmp_path: Path) -> None:
    # Gazette signs `file://` + the store's path + the fragment path; readers map it under
    # their own file root.
    root = tmp_path.resolve()
    root_store = FileStore(parse_store_url("file:///"), root)
    assert await root_store.signed_url("a/b/0-1-ab.raw", 60) == "file:///a/b/0-1-ab.raw"
    sub_store = FileStore(parse_store_url("file:///sub/dir/"), root)
    assert await sub_store.signed_url("j/x.gz", 60) == "file:///sub/dir/j/x.gz"
    assert sub_store.local_path("j/x.gz") == root / "sub" / "dir" / "j" / "x.gz"
    with pytest.raises(StoreError):
        await sub_store.signed_url("../../../etc/passwd", 60)


def test_put_and_list(tmp_path: Path) -> None:
    (tmp_path / "root" / "s").mkdir(parents=True)
    store = FileStore(parse_store_url("file:///s/"), tmp_path / "root")
    src = tmp_path / "src"
    src.write_bytes(b"content")

    async def run() -> list[str]:
        await store.put_file("journal/frag.raw", src)
        return [f.path for f in await store.list_files("journal/")]

    assert asyncio.run(run()) == ["frag.raw"]
    assert (tmp_path / "root" / "s" / "journal" / "frag.raw").read_bytes() == b"content"


async def test_a_missing_store_directory_refuses_puts_until_it_exists(tmp_path: Path) -> None:
    # As Gazette's file store: the store's directory (root + prefix) must exist, and only
    # directories below it are made. Missing, it is most likely an unmounted volume: writing
    # there would hide fragments from every reader of the real one. An authorization-class
    # error, so the store is unhealthy and the persister turns to the journal's next store.
    root = tmp_path / "root"
    root.mkdir()
    store = FileStore(parse_store_url("file:///mnt/fragments/"), root)
    src = tmp_path / "src"
    src.write_bytes(b"content")
    with pytest.raises(StoreAuthError, match="does not exist"):
        await store.put_file("journal/frag.raw", src)
    assert not (root / "mnt").exists()  # Nothing made, nothing written.
    assert await store.list_files("journal/") == []  # Listing a missing store is empty.

    (root / "mnt" / "fragments").mkdir(parents=True)  # Mounted.
    await store.put_file("journal/frag.raw", src)
    assert (root / "mnt" / "fragments" / "journal" / "frag.raw").read_bytes() == b"content"


async def test_a_directory_that_cannot_be_read_fails_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Gazette's file store makes directories 0750 (files 0600): a broker sharing the store as
    # another user may not read them. Such a directory was left out of the listing, so the
    # journal's index lacked its fragments and reads jumped over their offsets (from 0, to
    # the first fragment listed). As Gazette's listing, it fails instead. (Tests run as root,
    # which reads any directory: scandir refuses this one as it would another user.)
    root = tmp_path / "root"
    root.mkdir()
    store = FileStore(parse_store_url("file:///"), root)
    src = tmp_path / "src"
    src.write_bytes(b"content")
    await store.put_file("journal/early/0000000000000000-0000000000000007-aa.raw", src)
    await store.put_file("journal/late/0000000000000007-000000000000000e-bb.raw", src)
    unreadable = root / "journal" / "early"
    scandir = os.scandir

    def refusing(path: Any = ".") -> Any:
        if Path(path) == unreadable:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(StoreError, match="Permission denied"):
        await store.list_files("journal/")
    monkeypatch.setattr(os, "scandir", scandir)
    assert sorted(f.path for f in await store.list_files("journal/")) == [
        "early/0000000000000000-0000000000000007-aa.raw",
        "late/0000000000000007-000000000000000e-bb.raw",
    ]


async def test_a_directory_removed_while_listing_is_just_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    store = FileStore(parse_store_url("file:///"), root)
    src = tmp_path / "src"
    src.write_bytes(b"content")
    await store.put_file("journal/gone/0000000000000000-0000000000000007-aa.raw", src)
    await store.put_file("journal/kept/0000000000000007-000000000000000e-bb.raw", src)
    gone = root / "journal" / "gone"
    scandir = os.scandir

    def removed(path: Any = ".") -> Any:
        if Path(path) == gone:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", removed)
    assert [f.path for f in await store.list_files("journal/")] == [
        "kept/0000000000000007-000000000000000e-bb.raw"
    ]


async def test_a_store_directory_that_is_a_symbolic_link_is_followed(tmp_path: Path) -> None:
    # A volume mounted elsewhere and linked into the file root (<root>/fragments -> /mnt/vol)
    # is where Gazette's file store writes: it joins root and path, and the OS follows the
    # link. The store was refused ('escapes the file root': its directory was resolved
    # through the link, then required to lie under the root), so nothing persisted to it.
    root, volume = tmp_path / "root", tmp_path / "volume"
    root.mkdir()
    volume.mkdir()
    (root / "fragments").symlink_to(volume)
    store = FileStore(parse_store_url("file:///fragments/"), root)
    src = tmp_path / "src"
    src.write_bytes(b"content")
    name = "journal/0000000000000000-0000000000000007-aa.raw"
    await store.put_file(name, src)
    assert (volume / name).read_bytes() == b"content"
    assert [f.path for f in await store.list_files("journal/")] == [name.split("/", 1)[1]]
    assert await store.get(name) == b"content"
    assert await store.signed_url(name, 60) == f"file:///fragments/{name}"
    # A path that leaves the root by its own '..' is still refused.
    with pytest.raises(StoreError, match="escapes the file root"):
        FileStore(parse_store_url("file:///fragments/../../elsewhere/"), root)
