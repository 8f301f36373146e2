"""A process's private scratch directories, and what a killed process left of them.

A driver keeps its node's scratch (``elastic_train_*``: staging, ``spec.pkl``,
checkpoint cache, logs) and its worker zygote's socket (``et-zygote-*``) in
directories under the system's temporary directory, and removes them when it ends.
A driver that is SIGKILLed (or whose node loses power) cannot: :func:`make` records
the owner in each directory (``.owner``: pid, start time, boot and pid namespace),
and :func:`sweep` -- run as a driver starts -- removes those of this user whose owner
is gone. A directory without the record (another program's, or one being made) or
whose owner cannot be judged from here (another pid namespace) is left alone.

Example::

    scratch.sweep()                              # what killed drivers left behind
    path = scratch.make(scratch.NODE_PREFIX)     # mode 0700, owned by this process
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile

from elastic_train._internal import process_identity

logger = logging.getLogger(__name__)

NODE_PREFIX = "elastic_train_"
ZYGOTE_PREFIX = "et-zygote-"
OWNER_FILE = ".owner"


def _this_process() -> dict[str, str | int]:
    return {"pid": os.getpid(), "start_ticks": process_identity.start_ticks(os.getpid()),
            "boot_id": process_identity.boot_id(),
            "pid_namespace": process_identity.pid_namespace()}


def make(prefix: str) -> str:
    """A new private directory (mode 0700) in the temporary directory, recorded as this
    process's."""
    path = tempfile.mkdtemp(prefix=prefix)
    with open(os.path.join(path, OWNER_FILE), "w") as f:
        json.dump(_this_process(), f)
    return path


def _owner_gone(path: str, me: dict[str, str | int]) -> bool:
    """Whether the directory's recorded owner has ended (False when it has no record,
    or its owner cannot be judged from this pid namespace)."""
    try:
        with open(os.path.join(path, OWNER_FILE)) as f:
            owner = json.load(f)
        pid, ticks = int(owner["pid"]), str(owner["start_ticks"])
        boot, namespace = owner["boot_id"], owner["pid_namespace"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not me["boot_id"] or boot != me["boot_id"]:
        return bool(me["boot_id"] and boot)  # from a boot before this one: gone
    if not me["pid_namespace"] or namespace != me["pid_namespace"]:
        return False
    return not process_identity.is_running(pid, ticks)


def sweep(prefixes: tuple[str, ...] = (NODE_PREFIX, ZYGOTE_PREFIX)) -> list[str]:
    """Removes the scratch directories (named with ``prefixes``, this user's) whose
    owner process is gone; returns their paths."""
    root, me, removed = tempfile.gettempdir(), _this_process(), []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefixes):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if _owner_gone(entry.path, me):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    if removed:
        logger.info("Removed %d scratch director%s left by ended processes: %s", len(removed),
                    "y" if len(removed) == 1 else "ies", ", ".join(removed))
    return removed
