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
from collections.abc import Collection
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from elastic_train.errors import ConfigError

CHUNK = 1 << 20
# s3fs's multipart settings for checkpoint files: its defaults (50 MiB parts, 10 at
# once) hold up to 500 MiB of one file in memory; these hold 64 MiB, and files from
# 32 MiB up go in parts, so an interrupted large upload resends parts, not the file.
PART_SIZE = 16 << 20
PARTS_AT_ONCE = 4


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


def put_options(fs: fsspec.AbstractFileSystem) -> dict[str, Any]:
    """Extra ``fs.put`` arguments bounding an object store's memory per file (see PART_SIZE)."""
    return {"chunksize": PART_SIZE, "max_concurrency": PARTS_AT_ONCE} if _is_s3(fs) else {}


def missing_bucket(fs: fsspec.AbstractFileSystem, path: str) -> str | None:
    """The bucket of ``path``, when the store has buckets and that one does not exist.

    Asked before the first write: s3fs's ``makedirs`` (and stores that create a
    bucket on first upload) would otherwise create a mistyped bucket. Errors other
    than "not found" (no permission to ask, the endpoint down) answer None: the
    write that follows says what is wrong.
    """
    if not _is_s3(fs):
        return None
    bucket = fs.split_path(path)[0]
    try:
        fs.call_s3("head_bucket", Bucket=bucket)
    except FileNotFoundError:
        return bucket
    except Exception:  # the write probe reports it
        return None
    return None


def _is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    return hasattr(fs, "call_s3")


# Option names that hold credentials (s3fs's key/secret/token, botocore's aws_*, gcsfs's
# token, passwords, session objects): never stored, so never in the run directory.
_SECRET_WORDS = ("key", "secret", "token", "password", "credential", "session")


def public_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` without credentials, also inside nested dicts (``client_kwargs``)."""
    out = {}
    for name, value in options.items():
        if any(word in name.lower() for word in _SECRET_WORDS):
            continue
        out[name] = public_options(value) if isinstance(value, dict) else value
    return out


def without_secrets(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """The same store through a filesystem built without credentials (safe to pickle);
    on use it finds credentials where the store's client looks (environment, profiles)."""
    options = public_options(fs.storage_options)
    if options == fs.storage_options:
        return fs
    return type(fs)(*fs.storage_args, **{**options, "skip_instance_cache": True})


def same_store(a: fsspec.AbstractFileSystem, b: fsspec.AbstractFileSystem) -> bool:
    """Whether two filesystems reach the same store (kind and endpoint), so that one's
    credentials serve the other's paths."""
    def endpoint(fs: fsspec.AbstractFileSystem) -> Any:
        options = fs.storage_options
        return options.get("endpoint_url") or options.get("client_kwargs", {}).get(
            "endpoint_url")

    return type(a) is type(b) and endpoint(a) == endpoint(b)


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


def remove_tree(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Removes ``path`` and everything below it; a path already gone is fine (a retry).

    SeaweedFS's S3 server (a filer underneath) keeps an emptied directory in
    listings until the key ``path/`` is deleted as well; elsewhere that delete
    is a no-op.
    """
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass
    if _is_s3(fs):
        bucket, key, _ = fs.split_path(path)
        fs.call_s3("delete_object", Bucket=bucket, Key=key.rstrip("/") + "/")
        fs.invalidate_cache(path)


def abort_unfinished_uploads(fs: fsspec.AbstractFileSystem, path: str,
                             only: Collection[str] | None = None) -> int:
    """Aborts the multipart uploads under ``path`` that a killed writer left open.

    Only object stores have them (files from ``2 * PART_SIZE`` up go in parts):
    the parts are invisible to listings, yet stored and billed until aborted.
    ``only`` limits it to uploads to these paths (a writer retrying its own
    files, while other writers' uploads under ``path`` go on). Returns how many
    were aborted; 0 on every other filesystem.
    """
    if not _is_s3(fs):
        return 0
    bucket, key, _ = fs.split_path(path)
    listing = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key.rstrip("/") + "/")
    keys = None if only is None else {fs.split_path(p)[1] for p in only}
    uploads = [u for u in listing.get("Uploads", []) if keys is None or u["Key"] in keys]
    for upload in uploads:
        fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"],
                   UploadId=upload["UploadId"])
    return len(uploads)

