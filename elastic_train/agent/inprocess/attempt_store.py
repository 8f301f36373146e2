"""How the agents of a multi-node job agree on an in-process restart: keys in the round's store.

The rendezvous round's store (torch's ``WorkerGroup.store``, prefixed by the
round) is shared by every agent of the job and outlives any worker. Keys live
under ``elastic_train/inproc/<attempt>/``, so attempts never read each other's:

- ``count``/``failed``: the first node to see attempt N fail names its root
  failure (later nodes only add to the count);
- ``primary``: some node failed by itself (a death, a hang, an error raised
  outside torch's communication code), not only through a broken collective;
- ``stop``: a node gave up (its budget is spent) -- the others must not wait;
- ``ready`` (of attempt N+1): how many nodes have their workers ready;
- ``master_port`` (of attempt N+1): where rank 0 hosts the next ``env://`` store,
  chosen by group rank 0's agent (``launch``).

On a single node nothing is written: there is nobody to tell. No wait here
goes on for a node known gone (``gone()``: the group ranks known gone, from
:class:`~elastic_train.agent.node_liveness.NodeLiveness`, asked at most every
``GONE_EVERY_S``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from torch.distributed.elastic.agent.server.api import WorkerGroup

from elastic_train.agent.node_liveness import nobody
from elastic_train.errors import WorkerFailure

_KEYS = "elastic_train/inproc"
GONE_EVERY_S = 0.1


def _key(attempt: int, name: str) -> str:
    return f"{_KEYS}/{attempt}/{name}"


def several(group: WorkerGroup) -> bool:
    return (group.group_world_size or 1) > 1


def announced(group: WorkerGroup, attempt: int) -> WorkerFailure | None:
    """The root failure another node announced for ``attempt``, if any."""
    if not several(group) or not group.store.check([_key(attempt, "failed")]):
        return None
    return WorkerFailure.from_json(json.loads(group.store.get(_key(attempt, "failed"))))


def announce(group: WorkerGroup, attempt: int, root: WorkerFailure | None,
             primary: bool) -> None:
    """Tells the other nodes that ``attempt`` failed here (and whether by itself)."""
    if not several(group):
        return
    if root is not None and group.store.add(_key(attempt, "count"), 1) == 1:
        group.store.set(_key(attempt, "failed"), json.dumps(root.to_json()))
    if primary:
        group.store.set(_key(attempt, "primary"), "1")


def failed_by_itself_elsewhere(group: WorkerGroup, attempt: int, wait_s: float,
                               gone: Callable[[], set[int]] = nobody) -> bool:
    """Whether some node says, within ``wait_s``, that it failed by itself in ``attempt``,
    or is known gone (a lost node failed by itself, and cannot say so)."""
    deadline = time.monotonic() + wait_s
    ask = _every(GONE_EVERY_S)
    while True:
        if group.store.check([_key(attempt, "primary")]) or ask() and gone():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def give_up(group: WorkerGroup, attempt: int) -> None:
    if several(group):
        group.store.set(_key(attempt, "stop"), "1")


def share_port(group: WorkerGroup, target: int, port: int | None) -> int | None:
    """Group rank 0's choice of the next store port, for every node (call after
    :func:`all_ready`, which group rank 0 reaches only once it has published it)."""
    if port is not None:
        group.store.set(_key(target, "master_port"), str(port))
        return port
    return int(group.store.get(_key(target, "master_port")))


def all_ready(group: WorkerGroup, attempt: int, timeout_s: float,
              membership_changed: Callable[[], bool],
              gone: Callable[[], set[int]] = nobody) -> bool:
    """The agents' barrier: every node's workers are ready for attempt ``attempt + 1``.
    False when a node gave up, ``membership_changed()`` (a node is waiting to join:
    asked twice a second), a node is known ``gone()`` (asked every ``GONE_EVERY_S``), or
    ``timeout_s`` passed (a node that never came)."""
    key = _key(attempt + 1, "ready")
    group.store.add(key, 1)
    nodes = group.group_world_size or 1
    deadline = time.monotonic() + timeout_s
    look, ask = _every(0.5), _every(GONE_EVERY_S)
    while group.store.add(key, 0) < nodes:
        if group.store.check([_key(attempt, "stop")]) or time.monotonic() > deadline:
            return False
        if look() and membership_changed():  # the nodes must rendezvous again
            return False
        if ask() and gone():
            return False
        time.sleep(0.01)
    return True


def _every(interval_s: float) -> Callable[[], bool]:
    """True at the first call, then once ``interval_s`` passed since the last True."""
    due = [0.0]

    def now_due() -> bool:
        if time.monotonic() < due[0]:
            return False
        due[0] = time.monotonic() + interval_s
        return True

    return now_due
