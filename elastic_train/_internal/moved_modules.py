"""Where modules moved, so that pickles written before a move still load.

A run's ``trainable.pkl`` (its pickled ``RunSpec``) names classes and functions by
module path: the settings' classes, and :func:`elastic_train._internal.pickling._named_code`
for every train function pickled by value. ``restore`` must load a run saved before a
module moved, so every move adds its old path here, once, and run storage loads stored
pickles with :func:`loads`, which reads each old path as its new one.

Example::

    spec = moved_modules.loads(data)  # "elastic_train.pickling" -> "..._internal.pickling"
"""

from __future__ import annotations

import importlib
import io
import pickle
from types import ModuleType
from typing import Any

_INTERNAL_HELPERS = ("departures", "devices", "env_vars", "failure_kinds", "forked_call",
                     "metric_rows", "pickling", "platforms", "process_identity",
                     "ray_arguments", "redaction", "rendezvous_backends", "scratch")

# old dotted module path -> where it lives now
MOVED: dict[str, str] = {
    # RendezvousConfig left agent/ (commit 50894ab)
    "elastic_train.agent.rendezvous.config": "elastic_train.rendezvous_config",
    # the internal helpers left the package's top level (#39)
    **{f"elastic_train.{name}": f"elastic_train._internal.{name}" for name in _INTERNAL_HELPERS},
}


def new_path(module: str) -> str:
    """Where ``module`` lives now (itself, if it never moved)."""
    return MOVED.get(module, module)


def loads(data: bytes) -> Any:
    """``pickle.loads(data)`` (cloudpickle's payloads too), reading moved modules'
    old paths as their new ones."""
    return _Unpickler(io.BytesIO(data)).load()


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("cloudpickle.cloudpickle", "subimport"):
            return _subimport  # a module that a function pickled by value uses
        return super().find_class(new_path(module), name)


def _subimport(name: str) -> ModuleType:
    """cloudpickle's ``subimport``, for a module named by its path before a move."""
    return importlib.import_module(new_path(name))
