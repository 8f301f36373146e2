"""Pickling what crosses a process boundary: the run spec, trainable.pkl, a return value.

cloudpickle pickles functions it cannot import by name -- a train function
defined in the user's script (``__main__``), a lambda, a closure -- *by value*:
their code objects travel. cloudpickle 3.1.3 writes every such code object
with ``co_filename = "<dynamic-code>"`` (for a deterministic payload), so a
worker's traceback or hang stack would say ``File "<dynamic-code>", line 126``
instead of the user's file and its source line. :func:`dumps` records each
code object's real file name beside it and puts it back when the worker loads
it (nested code objects too: they are reduced the same way), so tracebacks
name the user's file, and show its lines wherever the file is readable on the
node. Loading needs nothing special: the payload names :func:`_named_code`,
an importable function of this module (a run saved while this module was
``elastic_train.pickling`` names that path: run storage reads it as today's,
see :mod:`elastic_train._internal.moved_modules`).

Example::

    payload = pickling.dumps(spec)
    spec = pickle.loads(payload)        # in the worker
"""

from __future__ import annotations

import io
import types
from collections import ChainMap
from collections.abc import Callable
from typing import Any

import cloudpickle
from cloudpickle import cloudpickle as _cloudpickle_impl


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, keeping the file names of code pickled by value."""
    buffer = io.BytesIO()
    _Pickler(buffer).dump(obj)
    return buffer.getvalue()


def _reduce_code(code: types.CodeType) -> tuple[Callable[..., types.CodeType], tuple]:
    """cloudpickle's reduction of ``code``, plus its file name to put back."""
    make, args = _cloudpickle_impl._code_reduce(code)
    return _named_code, (make, args, code.co_filename)


def _named_code(make: Callable[..., types.CodeType], args: tuple, filename: str
                ) -> types.CodeType:
    """In the loading process: the code object as cloudpickle rebuilds it, with its
    original ``co_filename`` (its nested code objects were rebuilt the same way)."""
    code = make(*args)
    return code if code.co_filename == filename else code.replace(co_filename=filename)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler with :func:`_reduce_code` for code objects."""

    dispatch_table = ChainMap({types.CodeType: _reduce_code},
                              cloudpickle.Pickler.dispatch_table)
