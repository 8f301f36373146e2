"""The commit manifest: what the marker of a committed checkpoint records.

Written last into ``checkpoint_NNNNNN/.commit.json`` (or ``<checkpoint_dir_name>/``,
see :mod:`.checkpoint_names`) by the committing rank (see
:mod:`.checkpoint_store`): the checkpoint's index, name and metrics, every file with
its size, CRC-32, SHA-256 and the rank that uploaded it, the world size that wrote it and
each rank's resume state. The node's local tier checks its kept copies against
it (:func:`~.checkpoint_store.file_matches`), and ``Result.checkpoint`` and
``elastic-train show`` show it.

Checksums (:class:`FileDigest`): the CRC-32 catches a torn or rotten copy; the
SHA-256 (markers written since it was added) also a copy someone forged to match the
CRC-32. A copy the reader did not just write itself -- kept in the node's tier, sent
by a peer -- is trusted only against a SHA-256 (:func:`is_trusted`); for an older
marker, with CRC-32s only, such files come from the store again.

A marker comes from shared storage, which others can write: :meth:`CommitManifest.from_json`
takes nothing on trust. A marker that is not the shape written here, or that names
a file outside its checkpoint (an absolute path, a ``..``), raises
:class:`~elastic_train.errors.CorruptManifestError`, and readers treat the checkpoint as
damaged.
"""

from __future__ import annotations

import hashlib
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from elastic_train.errors import ConfigError, CorruptManifestError
from elastic_train.storage.checkpoint_names import check_dir_name, dir_name

VALIDATION_STATES = ("PENDING_VALIDATION", "VALIDATED", "VALIDATION_TIMEOUT",
                     "VALIDATION_FAILED")


@dataclass
class CommitManifest:
    """The marker of a committed checkpoint."""

    index: int
    training_iteration: int
    metrics: dict[str, Any]
    files: dict[str, dict[str, Any]]
    world_size: int
    worker_states: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    # The directory's name when report(checkpoint_dir_name=...) gave one; "" for
    # checkpoint_NNNNNN (and in markers written before names could be chosen).
    checkpoint_dir_name: str = ""
    # Its asynchronous validation, when the report asked for one (see
    # elastic_train.worker.validation_runner): {"status": "PENDING_VALIDATION" |
    # "VALIDATED" | "VALIDATION_TIMEOUT" | "VALIDATION_FAILED", "task": {"fn_kwargs",
    # "timeout_s"}, "error": why it failed}; {} when none was asked for.
    validation: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> CommitManifest:
        """The manifest a marker holds; :class:`CorruptManifestError` unless it is one."""
        _expect(isinstance(data, dict), "is not a JSON object")
        missing = {"index", "training_iteration", "metrics", "files", "world_size"} - set(data)
        _expect(not missing, f"lacks {sorted(missing)}")
        manifest = cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        for name in ("index", "training_iteration"):
            _expect(_is_int(getattr(manifest, name), 0), f"{name}={getattr(manifest, name)!r}")
        _expect(_is_int(manifest.world_size, 1), f"world_size={manifest.world_size!r}")
        _expect(isinstance(manifest.metrics, dict), "metrics is not an object")
        _expect(isinstance(manifest.created, (int, float)) and not isinstance(
            manifest.created, bool), f"created={manifest.created!r}")
        _expect(isinstance(manifest.worker_states, dict) and all(
            isinstance(v, dict) for v in manifest.worker_states.values()),
            "worker_states is not an object of objects")
        _expect(isinstance(manifest.files, dict), "files is not an object")
        if manifest.checkpoint_dir_name != "":
            try:
                check_dir_name(manifest.checkpoint_dir_name)
            except ConfigError:
                _expect(False, f"checkpoint_dir_name={manifest.checkpoint_dir_name!r}")
        _expect(isinstance(manifest.validation, dict) and (
            not manifest.validation or manifest.validation.get("status") in VALIDATION_STATES),
            f"validation={manifest.validation!r}")
        for rel, info in manifest.files.items():
            check_relpath(rel)
            _expect(isinstance(info, dict) and _is_int(info.get("size"), 0)
                    and isinstance(info.get("crc32"), str)
                    and ("sha256" not in info or is_sha256(info["sha256"]))
                    and _is_int(info.get("rank", 0), 0), f"files[{rel!r}]={info!r}")
        return manifest

    @property
    def name(self) -> str:
        """The checkpoint directory's name in the run."""
        return self.checkpoint_dir_name or dir_name(self.index)

    @property
    def validation_pending(self) -> bool:
        """Whether the checkpoint waits for its asynchronous validation."""
        return self.validation.get("status") == "PENDING_VALIDATION"

    @property
    def size_bytes(self) -> int:
        """The checkpoint's size: its files' sizes summed (the marker left out)."""
        return sum(info["size"] for info in self.files.values())

    @property
    def ranks(self) -> list[int] | None:
        """The ranks that uploaded the checkpoint's files (each file once, from the
        lowest rank that had it); None for a marker written before ranks were recorded."""
        ranks = [info.get("rank") for info in self.files.values()]
        return None if None in ranks else sorted(set(ranks))

    def describe_contents(self) -> str:
        """Its size and who wrote it, e.g. ``"400.0 MiB from ranks 0-3"``."""
        ranks = self.ranks
        if ranks is None:
            who = "(ranks not recorded)"
        elif len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
            who = f"from ranks {ranks[0]}-{ranks[-1]}"
        else:
            who = f"from rank{'s' * (len(ranks) != 1)} {', '.join(map(str, ranks))}"
        return f"{format_size(self.size_bytes)} {who}"


class FileDigest:
    """The size, CRC-32 and SHA-256 of bytes fed in order (:meth:`update`): what the
    manifest records of a file (:meth:`info`), computed where the bytes are read anyway."""

    def __init__(self) -> None:
        self.size = 0
        self._crc = 0
        self._sha256 = hashlib.sha256()

    def update(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self._crc = zlib.crc32(chunk, self._crc)
        self._sha256.update(chunk)

    def info(self) -> dict[str, Any]:
        """``{"size", "crc32", "sha256"}``, as the manifest records them."""
        return {"size": self.size, "crc32": f"{self._crc:08x}",
                "sha256": self._sha256.hexdigest()}

    def matches(self, info: dict[str, Any]) -> bool:
        """Whether the bytes are the file ``info`` (a manifest entry) describes: size,
        CRC-32, and SHA-256 where the manifest has one."""
        mine = self.info()
        return (mine["size"] == info["size"] and mine["crc32"] == info["crc32"]
                and info.get("sha256", mine["sha256"]) == mine["sha256"])


def is_trusted(info: dict[str, Any]) -> bool:
    """Whether a copy of the file not written by this process may be checked against
    ``info`` at all: only when the manifest has its SHA-256 (a CRC-32 can be forged)."""
    return "sha256" in info


def is_sha256(value: Any) -> bool:
    """Whether ``value`` is a SHA-256 as the manifest writes it (64 lowercase hex)."""
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None


def check_relpath(rel: Any) -> str:
    """``rel`` if it names a file inside a checkpoint directory (``/``-separated, relative,
    no ``.`` or ``..`` or empty part, no NUL or backslash); else :class:`CorruptManifestError`."""
    if not (isinstance(rel, str) and rel != "" and "\0" not in rel and "\\" not in rel
            and not rel.startswith("/")
            and all(part not in ("", ".", "..") for part in rel.split("/"))):
        raise CorruptManifestError(f"{rel!r} names no file inside a checkpoint")
    return rel


def _is_int(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise CorruptManifestError(f"commit marker {what}")


def format_size(size: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
