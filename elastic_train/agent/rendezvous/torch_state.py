"""torch's rendezvous state, checked before torch's handler unpickles it.

torch's DynamicRendezvousHandler (our ``c10d`` and ``etcd-v3`` backends) keeps a
job's whole rendezvous in one blob, pickled, and reads it back with
``pickle.loads``. Whoever can write that blob -- anyone who reaches the c10d
store's port (it has no authentication), anyone allowed to write the run's etcd
keys -- could make every agent of the job run code of their choosing: unpickling
calls whatever the bytes name. And bytes that are no rendezvous state raise
whatever pickle or torch's code after it raise (EOFError, AttributeError, ...)
where torch means to raise RendezvousStateError.

:func:`check_state` reads the blob first with an unpickler that builds nothing
but the state's own types (torch's ``_RendezvousState`` and ``_NodeDesc``,
``datetime``), then checks each field's type; only then does torch unpickle
it. Anything else is a RendezvousStateError naming where the state lives, which
the agent reports with the fix (``RendezvousLostError.corrupt_state``).
:class:`CheckedBackend` puts the check in front of any RendezvousBackend;
:func:`checked_handler` is torch's dynamic handler with it, and
:func:`create_c10d_handler` torch's c10d handler (registered for ``c10d`` by
:mod:`.registry`).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import weakref
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousParameters,
    RendezvousStateError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousBackend,
    Token,
    _NodeDesc,
    _RendezvousState,
    create_handler,
)

if TYPE_CHECKING:
    from torch.distributed import Store

# The backend of each handler checked_handler made (backend_of's answer).
_BACKENDS: weakref.WeakKeyDictionary[RendezvousHandler, CheckedBackend] = \
    weakref.WeakKeyDictionary()

# What a state pickled by torch refers to (checked for each supported torch by
# tests/unit/test_rendezvous_torch_state.py: a state with every field set passes).
_GLOBALS = {(cls.__module__, cls.__qualname__): cls
            for cls in (_RendezvousState, _NodeDesc, datetime, timezone, timedelta)}


class _StateUnpickler(pickle.Unpickler):
    """Builds the classes of :data:`_GLOBALS` and plain values, nothing else."""

    def find_class(self, module: str, name: str) -> type:
        cls = _GLOBALS.get((module, name))
        if cls is None:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a rendezvous "
                                         "state never holds")
        return cls


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# A node: its host (addr), then numbers (pid, local_id), as torch's dataclass declares them.
_HOST, *_NUMBERS = (f.name for f in dataclasses.fields(_NodeDesc))


def _is_node(value: object) -> bool:
    fields = getattr(value, "__dict__", None)
    return type(value) is _NodeDesc and isinstance(fields, dict) \
        and isinstance(fields.get(_HOST), str) and all(_is_int(fields.get(n)) for n in _NUMBERS)


def _is_time(value: object) -> bool:
    """A datetime with a time zone (torch compares them with ``datetime.now(timezone.utc)``)."""
    return type(value) is datetime and value.utcoffset() is not None


_FIELDS = {
    "round": lambda v: _is_int(v) and v >= 0,
    "complete": lambda v: type(v) is bool,
    "deadline": lambda v: v is None or _is_time(v),
    "closed": lambda v: type(v) is bool,
    "participants": lambda v: type(v) is dict and all(
        _is_node(n) and _is_int(r) for n, r in v.items()),
    "wait_list": lambda v: type(v) is set and all(_is_node(n) for n in v),
    "redundancy_list": lambda v: type(v) is set and all(_is_node(n) for n in v),
    "last_heartbeats": lambda v: type(v) is dict and all(
        _is_node(n) and _is_time(t) for n, t in v.items()),
}


def _why_not(state: object) -> str | None:
    """What is wrong with an unpickled state; None if nothing."""
    if type(state) is not _RendezvousState:
        return f"it holds a {type(state).__name__}, not torch's _RendezvousState"
    fields = vars(state)
    # Every field a state of this torch has; those we know, of the type torch's code needs.
    for name in vars(_RendezvousState()):
        if name not in fields:
            return f"its field {name!r} is missing"
        check = _FIELDS.get(name)
        if check is not None and not check(fields[name]):
            return f"its field {name!r} holds {str(fields[name])[:80]}"
    return None


def check_state(data: bytes, where: str) -> bytes:
    """``data`` if it is a rendezvous state as torch's handler pickles it; else a
    RendezvousStateError that says ``where`` it was read (e.g. "the key torch.rendezvous.job
    of the c10d store") and why. Nothing ``data`` names is ever called."""
    read_state(data, where)
    return data


def read_state(data: bytes, where: str) -> _RendezvousState:
    """The state ``data`` holds, unpickled as :func:`check_state` checks it."""
    try:
        state = _StateUnpickler(io.BytesIO(data)).load()
        why = _why_not(state)
    except Exception as exc:  # noqa: BLE001 -- bytes that are no pickle raise any kind
        why = f"{type(exc).__name__}: {exc}" if not isinstance(
            exc, pickle.UnpicklingError) else str(exc)
    if why is None:
        return state
    raise RendezvousStateError(f"{where} holds {data[:40]!r}{'...' if len(data) > 40 else ''}"
                               f", not a rendezvous state as torch's handler writes it: "
                               f"{why}")


class CheckedBackend(RendezvousBackend):
    """``backend``, with every state it hands torch's handler passed through
    :func:`check_state` first (``where`` names the state's place in errors)."""

    def __init__(self, backend: RendezvousBackend, where: str) -> None:
        self._backend = backend
        self._where = where

    @property
    def name(self) -> str:
        return self._backend.name

    def get_state(self) -> tuple[bytes, Token] | None:
        found = self._read(self._backend.get_state)
        return None if found is None else (check_state(found[0], self._where), found[1])

    def set_state(self, state: bytes, token: Token | None = None
                  ) -> tuple[bytes, Token, bool] | None:
        found = self._read(lambda: self._backend.set_state(state, token))
        return None if found is None else (check_state(found[0], self._where), *found[1:])

    @property
    def where(self) -> str:
        """Where the state lives, as errors name it."""
        return self._where

    def _read(self, call):  # noqa: ANN001, ANN202 -- get_state's or set_state's answer
        """``call()``, its RendezvousStateError (e.g. c10d's: the state is no base64)
        naming where the state is."""
        try:
            return call()
        except RendezvousStateError as exc:
            cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
            raise RendezvousStateError(f"{self._where} cannot be read: "
                                       f"{str(exc).rstrip('.')}{cause}") from exc


def checked_handler(store: Store, backend: RendezvousBackend, where: str,
                    params: RendezvousParameters) -> RendezvousHandler:
    """torch's dynamic handler over ``backend``, reading its state through
    :func:`check_state` (``where`` names the state's place); :func:`backend_of` finds
    the backend again (for :mod:`.gone_nodes`)."""
    checked = CheckedBackend(backend, where)
    handler = create_handler(store, checked, params)
    _BACKENDS[handler] = checked
    return handler


def backend_of(handler: RendezvousHandler) -> CheckedBackend | None:
    """The backend of ``handler`` when :func:`checked_handler` made it, else None (e.g.
    our etcd handler, which is not torch's dynamic one)."""
    return _BACKENDS.get(handler)


def create_c10d_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's c10d handler (its registry's ``c10d`` factory, the same store and backend),
    reading its state through :func:`check_state`."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    backend, store = create_backend(params)
    return checked_handler(store, backend,
                           f"the key torch.rendezvous.{params.run_id} of the c10d store", params)
