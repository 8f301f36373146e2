"""Which imported modules are the user's own code, and which are installed libraries.

A zygote forked from the driver drops the driver's imports of the user's own
modules (each worker imports them again, in its own environment: such a module
may read ``RANK`` at import), and a worker reports only installed modules for
the zygote to preload (:mod:`elastic_train.worker.module_report`). Both ask
:func:`is_user_code`, with the same roots.

A module is decided by where its file is, first match wins:

1. this package and torch (what the zygote holds), and modules without a file
   (built in, namespace packages): installed;
2. under a ``site-packages`` or ``dist-packages`` directory -- of a venv, conda,
   the system, the user's site (``pip install --user``), another environment
   reached through ``PYTHONPATH`` or a ``.pth`` file (HPC modules, containers):
   installed;
3. under the interpreter's prefixes (``sys.prefix``, ``sys.base_prefix``, the
   exec prefixes: the standard library): installed;
4. on a ``sys.path`` entry that holds ``*.dist-info`` directories -- a
   ``pip install --target`` directory, a pex or Bazel layout: installed;
5. under one of the user's roots -- the working directory, the directory of the
   driver's script, the train function's package, the launched script's
   directory, and the directories in ``ELASTIC_TRAIN_USER_CODE``
   (:data:`elastic_train._internal.env_vars.USER_CODE`): the user's own code;
6. anything else: installed.

The installed checks come first: a ``.venv`` inside the project directory is under
the working directory. Each path is checked as imported and with its symlinks
resolved. Anything wrongly taken for the user's code is dropped from a forked
zygote, which then imports it again: for torch that kills the zygote, so the
default for what no rule claims is "installed".

Example::

    roots = user_roots(extra=[os.path.dirname(script)])
    mine = [name for name, module in sys.modules.items() if is_user_code(module, roots)]
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable

from elastic_train._internal import env_vars
from elastic_train.worker.worker_plan import WorkerPlan

SITE_DIRS = frozenset({"site-packages", "dist-packages"})
NEVER_USER_CODE = frozenset({"elastic_train", "torch"})  # top-level packages


def user_roots(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The user's roots in this process: the working directory, the directory of
    ``__main__``'s file, the directories of :data:`env_vars.USER_CODE` and the worker
    plan's ``user_roots`` (what the driver decided, for its workers), and ``extra``;
    absolute, without duplicates."""
    roots = [os.getcwd()]
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if isinstance(main_file, str) and main_file:
        roots.append(os.path.dirname(os.path.abspath(main_file)))
    plan = WorkerPlan.load()
    roots += env_vars.Switches.from_environ().user_code
    roots += plan.user_roots if plan is not None else ()
    roots += [p for p in extra if p]
    return tuple(dict.fromkeys(os.path.abspath(p) for p in roots))


def module_root(module: object) -> str | None:
    """The directory of a module's top-level package, or the directory of a top-level
    module (``__main__`` too): for the train function's module, its siblings with it."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path:
        return None
    directory = os.path.dirname(os.path.abspath(path))
    name = getattr(module, "__name__", "") or ""
    if name != "__main__":
        for _ in range(name.count(".") - 1 + os.path.basename(path).startswith("__init__.")):
            directory = os.path.dirname(directory)
    return directory


def is_user_code(module: object, roots: Iterable[str]) -> bool:
    """Whether ``module`` is the user's own code (see the module's docstring for the
    rules), ``roots`` being the user's roots (:func:`user_roots`)."""
    path = getattr(module, "__file__", None)
    name = getattr(module, "__name__", None) or ""
    if not isinstance(path, str) or not path or name.split(".")[0] in NEVER_USER_CODE:
        return False
    absolute = os.path.abspath(path)
    if _installed(absolute):
        return False
    real = os.path.realpath(absolute)
    if real != absolute and _installed(real):
        return False
    if _on_install_dir(absolute):
        return False
    return any(_under(p, mine) for root in roots for mine in _both(root)
               for p in {absolute, real})


def _installed(path: str) -> bool:
    """Rules 2 and 3: under a site directory, or the interpreter's prefixes."""
    return (not SITE_DIRS.isdisjoint(path.split(os.sep))
            or any(_under(path, prefix) for prefix in _prefixes()))


@functools.lru_cache(maxsize=256)
def _both(path: str) -> tuple[str, ...]:
    """``path`` absolute as given, and with its symlinks resolved."""
    absolute = os.path.abspath(path)
    real = os.path.realpath(absolute)
    return (absolute,) if real == absolute else (absolute, real)


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


@functools.lru_cache(maxsize=1)
def _prefixes() -> tuple[str, ...]:
    return tuple(dict.fromkeys(p for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                sys.base_exec_prefix} if prefix
                               for p in _both(prefix)))


def _on_install_dir(path: str) -> bool:
    """Whether the deepest ``sys.path`` entry above ``path`` holds installed
    distributions (``*.dist-info``), as a ``pip install --target`` directory does."""
    entries = [e for e in (os.path.abspath(e or os.curdir) for e in sys.path if isinstance(e, str))
               if _under(path, e) and path != e]
    return bool(entries) and _holds_distributions(max(entries, key=len))


@functools.lru_cache(maxsize=256)
def _holds_distributions(directory: str) -> bool:
    try:
        return any(name.endswith(".dist-info") for name in os.listdir(directory))
    except OSError:
        return False
