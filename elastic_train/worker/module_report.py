"""A worker tells its agent which modules it imported, so the zygote can preload them.

At its first ``report()`` -- by then the train function has built its model,
optimizer and data loaders, so what torch and the user's libraries import
lazily has been imported -- local rank 0 writes the names of the installed
modules it imported (the standard library and libraries, wherever they are
installed; the user's own modules are left out: they may read the worker's
environment at import, see :mod:`elastic_train.worker.user_code`) to
``<ELASTIC_TRAIN_MODULES_DIR>/rank<R>.json``, with whether it initialised CUDA
(then the zygote's standby warms CUDA, see :mod:`elastic_train.agent.zygote.standby`).
See :mod:`elastic_train.agent.zygote.preload`.
"""

from __future__ import annotations

import json
import os
import sys

from elastic_train._internal import env_vars
from elastic_train.storage import filesystem as fsutil
from elastic_train.worker import user_code

_done = False


def installed_modules(roots: tuple[str, ...] | None = None) -> list[str]:
    """The imported modules that are not the user's own code (``roots``: the user's,
    :func:`~elastic_train.worker.user_code.user_roots` by default), in import order."""
    roots = user_code.user_roots() if roots is None else roots
    return [name for name, module in list(sys.modules.items())
            if module is not None and name not in ("__main__", "__mp_main__")
            and getattr(module, "__file__", None)
            and not user_code.is_user_code(module, roots)]


def uses_cuda() -> bool:
    """Whether this process initialised CUDA (asked without initialising it)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def note_imports(rank: int, local_rank: int) -> None:
    """Writes this worker's imported modules, and whether it uses CUDA, once per process
    (local rank 0 only)."""
    global _done
    directory = env_vars.AgentFacts.from_environ().modules_dir
    if _done or local_rank != 0 or not directory:
        return
    _done = True
    os.makedirs(directory, exist_ok=True)
    fsutil.write_local_atomic(os.path.join(directory, f"rank{rank}.json"),
                              json.dumps({"modules": installed_modules(),
                                          "cuda": uses_cuda()}).encode())
