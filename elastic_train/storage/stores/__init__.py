"""One adapter per store, and the one table that picks it by fsspec protocol.

Every quirk of a store lives in its adapter (:class:`StoreAdapter`, overridden
in ``local.py`` and ``s3.py``); the rest of the project asks an adapter and
never which store it holds. A protocol missing from :data:`STORES` gets the
base adapter, which serves any fsspec store (e.g. ``memory://``). Adding a
store, say GCS, is a module ``gcs.py`` with a ``GCSStore(StoreAdapter)`` and
one line ``"gs": GCSStore`` (and ``"gcs"``) below.

Example::

    fs, path = open_url("s3://bucket/results", {"endpoint_url": "http://127.0.0.1:9000"})
    adapter_for(fs).remove_tree(f"{path}/run/checkpoint_000003")
"""

from __future__ import annotations

from typing import Any

import fsspec

from elastic_train.storage.stores.base import StoreAdapter
from elastic_train.storage.stores.local import LocalStore
from elastic_train.storage.stores.s3 import S3Store

# fsspec protocol -> its store's adapter (a filesystem has one or more protocols).
STORES: dict[str, type[StoreAdapter]] = {
    "file": LocalStore,
    "local": LocalStore,
    "s3": S3Store,
    "s3a": S3Store,
}

__all__ = ["STORES", "LocalStore", "S3Store", "StoreAdapter", "open_url", "adapter_for"]


def _adapter_class(protocols: str | tuple[str, ...]) -> type[StoreAdapter]:
    names = (protocols,) if isinstance(protocols, str) else protocols
    return next((STORES[p] for p in names if p in STORES), StoreAdapter)


def adapter_for(fs: fsspec.AbstractFileSystem) -> StoreAdapter:
    """The adapter of the store ``fs`` reaches."""
    return _adapter_class(fs.protocol)(fs)


def open_url(url: str, options: dict[str, Any] | None = None
             ) -> tuple[fsspec.AbstractFileSystem, str]:
    """``(filesystem, path)`` of an fsspec URL (a plain path is ``file``), built with the
    options its store's adapter adds to the user's ``options``."""
    adapter = _adapter_class(fsspec.core.split_protocol(url)[0] or "file")
    fs, path = fsspec.core.url_to_fs(url, **adapter.filesystem_options(options))
    adapter(fs).configure()
    return fs, path
