"""The file:// store: paths under its root, and URLs signed as Gazette signs them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pygazette.stores.file_store import FileStore
from pygazette.stores.store import StoreError
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
    store = FileStore(parse_store_url("file:///s/"), tmp_path / "root")
    src = tmp_path / "src"
    src.write_bytes(b"content")

    async def run() -> list[str]:
        await store.put_file("journal/frag.raw", src)
        return [f.path for f in await store.list_files("journal/")]

    assert asyncio.run(run()) == ["frag.raw"]
    assert (tmp_path / "root" / "s" / "journal" / "frag.raw").read_bytes() == b"content"
