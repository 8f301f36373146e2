"""Checkpoint directory names: ``checkpoint_NNNNNN`` by default, or the user's
(``report(checkpoint_dir_name=...)``, Ray's argument).

The number orders checkpoints for retention and resume, so a custom name does not
replace it: every checkpoint keeps its index, recorded in the commit manifest, and a
custom-named one also has a *claim*, ``<run>/.checkpoint-names/<NNNNNN>.<name>``, a
small file that rank 0 writes before any rank uploads a file into ``<run>/<name>/``.
One listing of the claims gives every custom name with its index, so readers and the
start's sweep find the directory (and remove it when an upload into it was cut short)
without touching a directory of the run that no report named. A claim of files the
user wrote there (NO_UPLOAD) says so (``{"in_place": true}``): the sweep of its
unfinished commit drops the claim and leaves the files.

:class:`NameClaims` writes, reads and removes one run's claims and knows the names of its
checkpoints (:class:`~.checkpoint_store.CheckpointStore` asks it for a directory's name).

Example::

    check_dir_name("epoch_3")                 # 'epoch_3'
    claim_file(7, "epoch_3")                  # '000007.epoch_3'
    parse_claim("000007.epoch_3")             # (7, 'epoch_3')
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from elastic_train.errors import ConfigError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.run_state import RUN_ENTRIES

if TYPE_CHECKING:
    from elastic_train.storage.manifest import CommitManifest
    from elastic_train.storage.retry import Retrying
    from elastic_train.storage.stores.base import StoreAdapter

NAMES_DIR = ".checkpoint-names"
DEFAULT_RE = re.compile(r"^checkpoint_(\d{6,})$")
_CLAIM_RE = re.compile(r"^(\d{6,})\.(.+)$")
NAME_MAX = 255  # bytes in one name of a path on Linux's file systems (ext4, xfs, NFS)
# The longest name a checkpoint's name is part of: its claim ``<index>.<name>``, written
# through the temporary sibling ``<claim>.tmp-<8 hex digits>`` on local disk (see
# stores/local.py), with room for an index of 12 digits.
_CLAIM_EXTRA_BYTES = len(f"{10**12 - 1}.") + len(".tmp-01234567")
MAX_NAME_BYTES = NAME_MAX - _CLAIM_EXTRA_BYTES


def dir_name(index: int) -> str:
    """The default name of checkpoint ``index``'s directory."""
    return f"checkpoint_{index:06d}"


def check_dir_name(name: Any) -> str:
    """``name`` if it can name a checkpoint directory of the run; else a ConfigError
    naming it and the fix. Uniqueness within the run is checked against storage at
    the claim (:meth:`NameClaims.claim`)."""
    problem = None
    if not isinstance(name, str) or not name:
        problem = "is not a non-empty string"
    elif "/" in name or "\\" in name or "\0" in name:
        problem = "holds a path separator: it names one directory in the run"
    elif name.startswith("."):
        problem = "starts with '.' (the run's own entries do, and '..' leaves the run)"
    elif DEFAULT_RE.match(name):
        problem = "is a default name, whose number another checkpoint may get"
    elif name in RUN_ENTRIES:
        problem = ("is the name of one of the run directory's own entries "
                   f"({', '.join(sorted(RUN_ENTRIES))})")
    elif (size := len(os.fsencode(name))) > MAX_NAME_BYTES:
        problem = (f"is {size} bytes long (UTF-8), over the {MAX_NAME_BYTES} bytes a "
                   f"checkpoint name may have (its claim file adds the index, and a file "
                   f"name has at most {NAME_MAX} bytes)")
    if problem:
        raise ConfigError(f"report(checkpoint_dir_name={name!r}) {problem}: pass a plain "
                          "directory name unique in the run, e.g. f'epoch_{epoch}'.")
    return name


def claim_file(index: int, name: str) -> str:
    """The claim's file name under :data:`NAMES_DIR`."""
    return f"{index:06d}.{name}"


def parse_claim(file_name: str) -> tuple[int, str] | None:
    """``(index, name)`` of a claim's file name; None for anything else (a temporary
    name, a stray file)."""
    match = _CLAIM_RE.match(file_name)
    return (int(match.group(1)), match.group(2)) if match else None


class NameClaims:
    """The checkpoint names of the run at ``run_path``: its claims under
    :data:`NAMES_DIR`, and the names this process knows, by index (from a listing, a
    manifest, a claim, or rank 0's word). ``retrying`` is the store's call with retries,
    ``fenced(what)`` its check of the run's lease before a write."""

    def __init__(self, adapter: StoreAdapter, run_path: str, retrying: Retrying,
                 fenced: Callable[[str], None]) -> None:
        self._adapter, self._run_path = adapter, run_path
        self._retrying, self._fenced = retrying, fenced
        self._names: dict[int, str] = {}  # custom directory names, by index

    def _path(self, index: int, name: str) -> str:
        return fsutil.join(self._run_path, NAMES_DIR, claim_file(index, name))

    def name(self, index: int) -> str:
        """The name of checkpoint ``index``'s directory: the one claimed for it (known
        from a listing, a manifest, :meth:`claim` or :meth:`adopt`), else the default."""
        return self._names.get(index) or dir_name(index)

    def adopt(self, index: int, name: str) -> None:
        """Notes the name rank 0 claimed for checkpoint ``index`` (the other ranks)."""
        self._names[index] = name

    def remember(self, manifests: list[CommitManifest]) -> None:
        """Notes the names of ``manifests`` (read by another rank and sent here)."""
        self._names.update({m.index: m.name for m in manifests})

    def claim(self, index: int, name: str, in_place: bool = False) -> None:
        """Reserves ``name`` for checkpoint ``index`` before any rank uploads into it; a
        ConfigError when the run already has a checkpoint of that name, or an entry of
        that name -- unless ``in_place``: the user writes the files there (NO_UPLOAD, or
        a checkpoint_upload_fn given that directory), and the sweep of an unfinished
        commit then leaves them."""
        fs = self._adapter.fs
        self._fenced(f"claiming {name}")
        exists = not in_place and self._retrying("checking a checkpoint name", lambda: fs.exists(
            fsutil.join(self._run_path, name)))
        if name in self.listed().values() or exists:
            raise ConfigError(f"report(checkpoint_dir_name={name!r}): the run "
                              f"{fsutil.display_path(fs, self._run_path)} already has a "
                              "checkpoint or an entry of that name; names must be unique "
                              "within the run, e.g. f'epoch_{epoch}'.")
        self._retrying(f"claiming {name}", lambda: fsutil.write_json_atomic(
            fs, self._path(index, name), {"in_place": in_place}))
        self._names[index] = name

    def in_place(self, index: int) -> bool:
        """Whether checkpoint ``index``'s directory holds files the user wrote there."""
        claim = self._path(index, self.name(index))
        return index in self._names and bool(self._retrying(
            "reading a checkpoint name",
            lambda: fsutil.read_json(self._adapter.fs, claim)).get("in_place"))

    def listed(self) -> dict[int, str]:
        """Every claim of the run, by index, listed afresh (and noted)."""
        directory = fsutil.join(self._run_path, NAMES_DIR)
        found = self._retrying("listing checkpoints",
                               lambda: fsutil.names_in(self._adapter.fs, directory))
        claims = dict(filter(None, map(parse_claim, sorted(found))))
        self._names.update(claims)
        return claims

    def unclaim(self, index: int) -> None:
        """Removes checkpoint ``index``'s claim, once its directory is gone."""
        name = self._names.pop(index, None)
        if name is not None:
            claim = self._path(index, name)
            self._retrying(f"removing the claim of {name}",
                           lambda: self._adapter.remove_tree(claim))
