"""torch's dynamic rendezvous state over a backend that keeps it in memory, with torch's
compare-and-set (a write with a stale token is refused), and a handler over it: for the
unit tests of what we read and write of that state (gone nodes, spares)."""

from __future__ import annotations

import pickle
from datetime import datetime, timezone

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousBackend,
    _NodeDesc,
    _RendezvousState,
)

from elastic_train.agent.rendezvous.torch_state import _BACKENDS, CheckedBackend

NOW = datetime.now(timezone.utc)
A, B, C, SPARE = (_NodeDesc(f"host{i}", 100 + i, 0) for i in range(4))


class MemoryBackend(RendezvousBackend):
    """torch's backend contract in memory; ``meddle`` runs once before the next write (a
    node that writes first)."""

    def __init__(self, state: _RendezvousState):
        self.blob, self.token, self.meddle = pickle.dumps(state), 0, None

    @property
    def name(self) -> str:
        return "memory"

    def get_state(self):
        return self.blob, self.token

    def set_state(self, state, token=None):
        if self.meddle is not None:
            meddle, self.meddle = self.meddle, None
            meddle(self)
        if token != self.token:
            return self.blob, self.token, False
        self.blob, self.token = state, self.token + 1
        return self.blob, self.token, True

    def state(self) -> _RendezvousState:
        return pickle.loads(self.blob)


def finished_round() -> _RendezvousState:
    """Round 4, complete, of nodes A, B and C (ranks 0-2), all just heard from."""
    state = _RendezvousState()
    state.round, state.complete = 4, True
    state.participants = {A: 0, B: 1, C: 2}
    state.last_heartbeats = {A: NOW, B: NOW, C: NOW}
    return state


def handler_over(backend: MemoryBackend) -> object:
    """A stand-in for torch's dynamic handler whose state is ``backend``'s, as the checked
    reader finds it."""
    handler = type("Handler", (), {})()
    _BACKENDS[handler] = CheckedBackend(backend, "memory")
    return handler
