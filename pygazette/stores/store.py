"""The fragment store interface, and opening a store from its URL.

The interface itself (`FragmentStore`, `StoredFile`, `ObjectRange`, `StoreError`,
`StoreNotFound`) lives in `interface`, which the implementations import; it is re-exported
here, where callers have always found it. Implementations: `file://` (`file_store`), and
`s3://`, `gs://`, `azure://`, `azure-ad://` through obstore (`object_store`, configured by
`cloud_stores`), imported when a store of theirs is first opened.
"""

from __future__ import annotations

from pathlib import Path

from pygazette.stores.interface import (
    FragmentStore,
    ObjectRange,
    ObjectReader,
    StoreAuthError,
    StoredFile,
    StoreError,
    StoreNotFound,
)

__all__ = [
    "FragmentStore",
    "ObjectRange",
    "ObjectReader",
    "StoreAuthError",
    "StoreError",
    "StoreNotFound",
    "StoreRegistry",
    "StoredFile",
    "open_store",
]


def open_store(url: str, *, file_root: Path) -> FragmentStore:
    """A store for `url`. `file://` URLs are rooted under `file_root`.

    Raises StoreError for a malformed URL, an unknown scheme or query argument, or a store
    that cannot be configured (e.g. missing credentials).
    """
    from pygazette.stores.store_url import parse_store_url

    parsed = parse_store_url(url)
    if parsed.scheme == "file":
        from pygazette.stores.file_store import FileStore

        return FileStore(parsed, file_root)
    from pygazette.stores.cloud_stores import open_cloud_store

    return open_cloud_store(parsed)


class StoreRegistry:
    """Opens each store URL once and hands out the shared instance.

    A URL that fails to open is not cached: the next `get` tries again (credentials may
    have been provided meanwhile), and raises StoreError until it succeeds.
    """

    def __init__(self, file_root: Path) -> None:
        self.file_root = file_root
        self._stores: dict[str, FragmentStore] = {}

    def get(self, url: str) -> FragmentStore:
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = open_store(url, file_root=self.file_root)
        return store

    def forget(self, url: str) -> None:
        """Drop the shared instance for `url` (holders keep theirs; the next `get` reopens)."""
        self._stores.pop(url, None)
