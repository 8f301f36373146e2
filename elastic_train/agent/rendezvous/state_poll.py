"""How often torch's dynamic handler re-reads its state while our agent waits in it.

torch's DynamicRendezvousHandler (``c10d``, ``etcd-v3``) pauses a second between reads
of its stored state while it waits for other nodes (``_delay(seconds=1)`` in
``_DistributedRendezvousOpExecutor.run``). A re-form after a lost node takes about
three such reads on each survivor -- leave the old round, join the new one, see it
complete -- and torch's state holder serves a cached copy for a second after each
read: most of the 2.8 s figure 13 measured for ``c10d`` with ``@restart_in_process``
(1.1-1.5 s with both shortened). Inside :func:`polling`, our agent's rendezvous pauses
:func:`interval_s` instead: 0.1 s up to 16 nodes, then growing with the node count
to torch's second at 160 nodes, so the store never serves more reads per second
than 160 nodes polling at torch's pace would send it.

A shorter pause alone would re-read a cached copy: the handler's state holder reads
the store at most once per ``cache_duration`` (1 s). :func:`read_every` lowers that for
our agent's handler, to the same interval.

The pause is a module-level function of torch's. It is replaced once in the process
by one that asks the calling thread: only a thread inside :func:`polling` pauses
less, so another user of torch's handler in the same process (the user's own code
under ``fit()``) keeps torch's second. Our ``etcd`` handler does not poll (it
watches), and is unaffected.

Example::

    read_every(handler, interval_s(max_nodes=4))
    with polling(interval_s(max_nodes=4)):   # 0.1 s between reads
        handler.next_rendezvous()
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

TORCH_PAUSE_S = 1  # what torch's handler asks for between reads of its state
FASTEST_S = 0.1
_READS_PER_S = 160  # the store's reads per second at torch's pace with 160 nodes

_this_thread = threading.local()
_torch_delay: Callable[[Any], None] | None = None


def interval_s(max_nodes: int) -> float:
    """The pause between reads for a job of at most ``max_nodes`` nodes."""
    return min(float(TORCH_PAUSE_S), max(FASTEST_S, max_nodes / _READS_PER_S))


def read_every(handler: Any, every_s: float) -> None:
    """Lets torch's dynamic ``handler`` read its stored state as often as every
    ``every_s`` seconds (its state holder's cache); another handler is left alone."""
    holder = getattr(handler, "_state_holder", None)
    if isinstance(handler, dynamic_rendezvous.DynamicRendezvousHandler) \
            and hasattr(holder, "_cache_duration"):
        holder._cache_duration = every_s


@contextlib.contextmanager
def polling(every_s: float) -> Iterator[None]:
    """torch's handler, called on this thread meanwhile, reads its state every
    ``every_s`` seconds while it waits."""
    _install()
    previous = getattr(_this_thread, "every_s", None)
    _this_thread.every_s = every_s
    try:
        yield
    finally:
        _this_thread.every_s = previous


def _delay(seconds: Any) -> None:
    every_s = getattr(_this_thread, "every_s", None)
    if every_s is not None and seconds == TORCH_PAUSE_S:
        time.sleep(every_s)
    else:
        assert _torch_delay is not None
        _torch_delay(seconds)


def _install() -> None:
    global _torch_delay
    if dynamic_rendezvous._delay is not _delay:
        _torch_delay = dynamic_rendezvous._delay
        dynamic_rendezvous._delay = _delay
