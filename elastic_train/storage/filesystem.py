"""Paths and files on any store: the helpers every part of the project uses.

:func:`resolve` turns a storage path into an ``(fs, path)`` pair; everything
else holds such a pair and never asks which store it is: what differs between
stores is answered by the store's adapter (:mod:`elastic_train.storage.stores`),
e.g. :func:`write_bytes_atomic` (a rename on local disk, one PUT on an object store).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from elastic_train._internal.redaction import public_options
from elastic_train.errors import ConfigError, StorageError
from elastic_train.storage.manifest import FileDigest
from elastic_train.storage.stores import adapter_for, open_url

CHUNK = 1 << 20
READ_LIMIT = 1 << 30  # the most a whole-file read of a record (run.json, metrics) loads

T = TypeVar("T")


def resolve(storage_path: str, filesystem: fsspec.AbstractFileSystem | None = None,
            options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """``(filesystem, path)`` for a local path, ``file://`` or any fsspec URL.

    Local paths are expanded (``~``) and made absolute, as every worker and
    node must see the same directory. ``options`` go to the filesystem's
    constructor (endpoint, credentials, ...), with the store's own defaults
    (see :meth:`~elastic_train.storage.stores.StoreAdapter.filesystem_options`).
    """
    if filesystem is not None:
        return filesystem, filesystem._strip_protocol(storage_path)
    if "://" not in storage_path:
        storage_path = os.path.abspath(os.path.expanduser(storage_path))
    try:
        return open_url(storage_path, options)
    except ImportError as exc:  # a known protocol whose package is missing (s3fs, gcsfs)
        raise ConfigError(f"Storage {storage_path!r} needs a package that is not installed "
                          f"({exc}); e.g. pip install 'elastic-train[s3]' for s3://.") from exc
    except ValueError as exc:  # "Protocol not known: ..."
        raise ConfigError(f"Storage {storage_path!r} cannot be opened: {exc}. Use a local "
                          "path, file://, s3:// or another fsspec URL.") from exc


def options_from_flags(pairs: list[str], flag: str = "--storage-option") -> dict[str, str] | None:
    """``--storage-option KEY=VALUE`` flags as fsspec options (None when there are none)."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {pair!r} is invalid: use KEY=VALUE, e.g. "
                              f"{flag} endpoint_url=http://127.0.0.1:9000")
        options[key] = value
    return options or None


def without_secrets(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """The same store through a filesystem built without credentials (safe to pickle; the
    rule is :mod:`elastic_train._internal.redaction`'s); on use it finds credentials where the
    store's client looks (environment, profiles)."""
    options = public_options(fs.storage_options)
    if options == fs.storage_options:
        return fs
    return type(fs)(*fs.storage_args, **{**options, "skip_instance_cache": True})


def same_store(a: fsspec.AbstractFileSystem, b: fsspec.AbstractFileSystem) -> bool:
    """Whether two filesystems reach the same store (kind and endpoint), so that one's
    credentials serve the other's paths."""
    return type(a) is type(b) and adapter_for(a).endpoint() == adapter_for(b).endpoint()


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """True for this machine's disk (and NFS mounts on it)."""
    return adapter_for(fs).is_local


def display_path(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """What to show a user: a plain path for local disk, a URL otherwise."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def write_bytes_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Readers see the old content or the new, never a part (a rename over the target on
    local disk, one PUT on an object store: the store's adapter knows which)."""
    adapter_for(fs).write_bytes_atomic(path, data)


def write_json_atomic(fs: fsspec.AbstractFileSystem, path: str, obj: Any) -> None:
    write_bytes_atomic(fs, path, json.dumps(obj, indent=2, sort_keys=True).encode())


def write_local_atomic(path: str, data: bytes) -> None:
    """:func:`write_bytes_atomic` to a file of this node's disk (scratch, never a store)."""
    write_bytes_atomic(LocalFileSystem(), path, data)


def write_local_json(path: str, obj: Any) -> None:
    """:func:`write_json_atomic` to a file of this node's disk (scratch, never a store)."""
    write_json_atomic(LocalFileSystem(), path, obj)


def read_bytes(fs: fsspec.AbstractFileSystem, path: str) -> bytes:
    """The file at ``path`` whole, as the store holds it now: one read (``cat_file``), not
    a file object, which s3fs opens with the ETag its listing cache holds and fails
    (``FileExpired``) when another process rewrote the file since -- a heartbeat's claim,
    ``run.json``. Bounded: a regular file of at most :data:`READ_LIMIT` bytes, else a
    StorageError naming it (a FIFO or a device in a run directory would be read for ever;
    see the store's ``read_bytes``)."""
    data = adapter_for(fs).read_bytes(path, READ_LIMIT)
    if len(data) > READ_LIMIT:
        raise StorageError(f"{path} is larger than {READ_LIMIT} bytes, more than any record "
                           "elastic-train writes: it is damaged; move it aside")
    return data


def read_json(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    """The JSON file at ``path`` as the store holds it now (:func:`read_bytes`)."""
    return json.loads(read_bytes(fs, path))


def names_in(fs: fsspec.AbstractFileSystem, directory: str) -> set[str]:
    """The names in ``directory`` as the store holds them now: fsspec's listing cache is
    dropped, and on NFS a listing opens the directory, which revalidates it -- and with it
    the client's cached "not found" of its children."""
    fs.invalidate_cache(directory)
    try:
        return {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(directory, detail=False)}
    except FileNotFoundError:
        return set()


def read_unless_missing(fs: fsspec.AbstractFileSystem, path: str,
                        read: Callable[[str], T]) -> T | None:
    """``read(path)``, or None when the file does not exist.

    "Does not exist" is never taken from one lookup: an NFS client caches "not found"
    for up to ``acdirmin`` (30 s by default), so a file another node wrote seconds ago
    can look missing. The directory is listed afresh first (:func:`names_in`); a file
    it lists is read again, and is an error if still unreadable -- never "missing".
    """
    directory, _, name = path.rpartition("/")
    fs.invalidate_cache(directory)  # fsspec's own cache may hold an older size
    try:
        return read(path)
    except FileNotFoundError:
        pass
    if name not in names_in(fs, directory):
        return None
    try:
        return read(path)
    except FileNotFoundError:
        raise StorageError(f"{path} is listed but cannot be read (a stale cache of this "
                           "node?); it is not taken as missing.") from None


def file_digest(path: str) -> FileDigest:
    """Size, CRC-32 and SHA-256 of a local file, streamed (see :class:`.manifest.FileDigest`)."""
    digest = FileDigest()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest


def stream_digest(fs: fsspec.AbstractFileSystem, path: str) -> FileDigest:
    """:func:`file_digest` of a file of ``fs``."""
    digest = FileDigest()
    with fs.open(path, "rb", block_size=CHUNK * 8) as f:
        while chunk := f.read(CHUNK * 8):
            digest.update(chunk)
    return digest


def join(*parts: str) -> str:
    """Join path parts with '/', the separator of every fsspec store."""
    return "/".join(p.rstrip("/") for p in parts if p)
