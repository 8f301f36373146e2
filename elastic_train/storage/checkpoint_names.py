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

Example::

    check_dir_name("epoch_3")                 # 'epoch_3'
    claim_file(7, "epoch_3")                  # '000007.epoch_3'
    parse_claim("000007.epoch_3")             # (7, 'epoch_3')
"""

from __future__ import annotations

import os
import re
from typing import Any

from elastic_train.errors import ConfigError
from elastic_train.storage.run_state import RUN_ENTRIES

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
    the claim (:meth:`~.checkpoint_store.CheckpointStore.claim`)."""
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
