"""The one place that turns a storage path into an fsspec filesystem.

Everything else in the project holds an ``(fs, path)`` pair and never asks
which store it is. The two capabilities that differ between stores are
answered here: whether a rename is atomic (local disk and NFS) or a single
PUT is (object stores), and whether a file can be appended to.
"""

from __future__ import annotations

import json
import os
import uuid
import zlib
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from elastic_train.errors import ConfigError

CHUNK = 1 << 20


def resolve(storage_path: str, filesystem: fsspec.AbstractFileSystem | None = None,
            options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """``(filesystem, path)`` for a local path, ``file://`` or any fsspec URL.

    Local paths are expanded (``~``) and made absolute, as every worker and
    node must see the same directory. ``options`` go to the filesystem's
    constructor (endpoint, credentials, ...).
    """
    if filesystem is not None:
        return filesystem, filesystem._strip_protocol(storage_path)
    if "://" not in storage_path:
        storage_path = os.path.abspath(os.path.expanduser(storage_path))
    s3 = storage_path.split("://", 1)[0] in ("s3", "s3a")
    try:
        fs, path = fsspec.core.url_to_fs(storage_path,
                                         **(s3_defaults(options) if s3 else options or {}))
    except ImportError as exc:  # a known protocol whose package is missing (s3fs, gcsfs)
        raise ConfigError(f"Storage {storage_path!r} needs a package that is not installed "
                          f"({exc}); e.g. pip install 'elastic-train[s3]' for s3://.") from exc
    except ValueError as exc:  # "Protocol not known: ..."
        raise ConfigError(f"Storage {storage_path!r} cannot be opened: {exc}. Use a local "
                          "path, file://, s3:// or another fsspec URL.") from exc
    if s3:
        fs.retries = 1  # s3fs's own attempts per call (a class attribute, not an argument)
    return fs, path


def s3_defaults(options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` for s3fs with no botocore retries and bounded timeouts, unless set.

    s3fs (5 attempts, backoff up to 15 s) and botocore (its own retries) would each
    retry underneath :mod:`~elastic_train.storage.retry`, whose budget
    (``RunConfig.storage_retry_timeout_s``) then no longer bounds how long an
    outage takes to fail the run. Here every retry is ours: backoff with jitter,
    within that budget.
    """
    out = dict(options or {})
    config = {"retries": {"max_attempts": 1}, "connect_timeout": 10, "read_timeout": 60}
    out["config_kwargs"] = {**config, **out.get("config_kwargs", {})}
    return out


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """True for this machine's disk (and NFS mounts on it)."""
    return isinstance(fs, LocalFileSystem)


def display_path(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """What to show a user: a plain path for local disk, a URL otherwise."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def write_bytes_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Readers see the old content or the new, never a part.

    Local disk: write a temporary sibling, then rename over the target.
    Object stores: one PUT is atomic; a rename there is copy+delete, which is not.
    """
    if is_local(fs):
        fs.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    else:
        fs.pipe_file(path, data)


def write_json_atomic(fs: fsspec.AbstractFileSystem, path: str, obj: Any) -> None:
    write_bytes_atomic(fs, path, json.dumps(obj, indent=2, sort_keys=True).encode())


def read_json(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    with fs.open(path, "rb") as f:
        return json.loads(f.read())


def link_all(sources: list[str], targets: list[str]) -> bool:
    """Hard-links each source to its target; False (nothing left behind) when the
    file system cannot, e.g. across devices: the caller copies instead."""
    done = []
    try:
        for source, target in zip(sources, targets, strict=True):
            if os.path.lexists(target):
                os.unlink(target)  # a leftover of an interrupted attempt at this index
            os.link(source, target)
            done.append(target)
    except OSError:
        for target in done:
            os.unlink(target)
        return False
    return True


def file_crc32(path: str) -> str:
    """CRC-32 of a local file, streamed; detects truncated or corrupted copies."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def join(*parts: str) -> str:
    """Join path parts with '/', the separator of every fsspec store."""
    return "/".join(p.rstrip("/") for p in parts if p)


def abort_unfinished_uploads(fs: fsspec.AbstractFileSystem, path: str) -> int:
    """Aborts the multipart uploads under ``path`` that a killed writer left open.

    Only object stores have them (s3fs sends files over its 50 MB threshold in
    parts): the parts are invisible to listings, yet stored and billed until
    aborted. Returns how many were aborted; 0 on every other filesystem.
    """
    if not hasattr(fs, "call_s3"):
        return 0
    bucket, key, _ = fs.split_path(path)
    listing = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key.rstrip("/") + "/")
    uploads = listing.get("Uploads", [])
    for upload in uploads:
        fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"],
                   UploadId=upload["UploadId"])
    return len(uploads)

