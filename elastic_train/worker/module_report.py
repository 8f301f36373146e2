"""A worker tells its agent which modules it imported, so the zygote can preload them.

At its first ``report()`` -- by then the train function has built its model,
optimizer and data loaders, so what torch and the user's libraries import
lazily has been imported -- local rank 0 writes the names of the modules that
come from the Python installation (the standard library and site-packages;
the user's own modules are left out: they may read the worker's environment at
import) to ``<ELASTIC_TRAIN_MODULES_DIR>/rank<R>.json``. See
:mod:`elastic_train.agent.zygote_preload`.
"""

from __future__ import annotations

import json
import os
import sys

from fsspec.implementations.local import LocalFileSystem

from elastic_train import env_vars
from elastic_train.storage import filesystem as fsutil

_done = False


def is_installed(module: object) -> bool:
    """Whether ``module`` comes from the Python installation (not the user's own code)."""
    path = getattr(module, "__file__", None)
    prefixes = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix)}
    return bool(path) and any(os.path.realpath(path).startswith(p) for p in prefixes)


def installed_modules() -> list[str]:
    """The imported modules that come from the Python installation, in import order."""
    return [name for name, module in list(sys.modules.items())
            if module is not None and is_installed(module)]


def note_imports(rank: int, local_rank: int) -> None:
    """Writes this worker's imported modules once per process (local rank 0 only)."""
    global _done
    directory = os.environ.get(env_vars.MODULES_DIR)
    if _done or local_rank != 0 or not directory:
        return
    _done = True
    os.makedirs(directory, exist_ok=True)
    fsutil.write_bytes_atomic(LocalFileSystem(), os.path.join(directory, f"rank{rank}.json"),
                              json.dumps(installed_modules()).encode())
