"""How many spares wait to take a node's place, asked of any rendezvous handler.

A spare is a node that came when the job had ``max_nodes`` already (``--spares``): it
waits, not counted, and joins the next round that has room. Where it waits depends on
the handler, and this is the one place that knows:

- torch's dynamic handler (``c10d``, ``etcd-v3``): in its state's ``redundancy_list``,
  read through the checked reader (:mod:`.torch_state`); a spare counts while its
  heartbeat is younger than the handler's ``keep_alive_interval`` x
  ``keep_alive_max_attempt`` (an older one is dead, as torch's own sanitizing says);
- our ``etcd`` handler (:mod:`.etcd_native`): its spare keys of the next round,
  under each spare's lease (:meth:`~.etcd_native.EtcdNativeHandler.spares_waiting`);
- any other handler (``static``): none.

Asked by a node about to leave for a spare (:mod:`elastic_train.agent.leave_for_spare`):
one read of the rendezvous state, never a write.

Example::

    if waiting(worker_group.spec.rdzv_handler) > 0:
        ...  # leaving now, a spare takes this node's ranks at the next round
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from torch.distributed.elastic.rendezvous import RendezvousHandler
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

from elastic_train.agent.rendezvous.torch_state import backend_of, read_state


def waiting(handler: RendezvousHandler) -> int:
    """The spares waiting in ``handler``'s rendezvous now (0 for a handler without any)."""
    if callable(own := getattr(handler, "spares_waiting", None)):
        return int(own())
    backend = backend_of(handler)
    if backend is None:
        return 0
    found = backend.get_state()
    if found is None:
        return 0
    settings = getattr(handler, "settings", None)
    expiry = settings.keep_alive_interval * settings.keep_alive_max_attempt \
        if settings is not None else None
    return alive_spares(read_state(found[0], backend.where), expiry)


def alive_spares(state: _RendezvousState, expiry: timedelta | None,
                 now: datetime | None = None) -> int:
    """The nodes of ``state``'s redundancy list whose heartbeat is younger than ``expiry``
    (all of them when it is None)."""
    if expiry is None:
        return len(state.redundancy_list)
    oldest = (now or datetime.now(timezone.utc)) - expiry
    return sum(1 for node in state.redundancy_list
               if (beat := state.last_heartbeats.get(node)) is not None and beat >= oldest)
