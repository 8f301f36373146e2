"""An agent that fails -- an exception, an interrupt, a lost rendezvous -- stops its
rendezvous handler's background work, so that in a notebook or a sweep the node's etcd
keys expire (#24, item 10): the etcd-v3 keyspace's lease thread and the etcd handler's
node lease refresh stop, and the rendezvous stays open for the other nodes. A real etcd
server; the agent's run is replaced by one that fails."""

from __future__ import annotations

import threading
import uuid
from types import SimpleNamespace

import pytest

pytest.importorskip("etcd3gw")

from torch.distributed.elastic.agent.server.api import SignalException  # noqa: E402
from torch.distributed.elastic.rendezvous import RendezvousParameters  # noqa: E402
from torch.distributed.elastic.rendezvous import registry as rdzv_registry  # noqa: E402

from elastic_train._internal.rendezvous_backends import lookup  # noqa: E402
from elastic_train.agent import api  # noqa: E402
from elastic_train.agent.rendezvous import etcd_lease  # noqa: E402
from elastic_train.agent.rendezvous.registry import register  # noqa: E402
from elastic_train.rendezvous_config import RendezvousConfig  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


class FailingAgent:
    def __init__(self, handler, error):
        self.handler, self.error, self.peer_root = handler, error, None

    def get_worker_group(self):
        return SimpleNamespace(spec=SimpleNamespace(rdzv_handler=self.handler))

    def run(self):
        self.handler.next_rendezvous()  # joined: the lease and its refresh are live
        raise self.error


def lease_threads(run_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"etcd-lease-{run_id}" and t.is_alive()]


@pytest.mark.parametrize("backend", ["etcd-v3", "etcd"])
@pytest.mark.parametrize("error", [RuntimeError("a bug in the agent"), KeyboardInterrupt(),
                                   SignalException("SIGTERM", 15)])
def test_a_failed_agent_stops_its_handlers_refreshes_and_leaves_it_open(
        etcd_endpoint, monkeypatch, backend, error):
    run_id = uuid.uuid4().hex
    register(lookup(backend, "backend"))
    params = RendezvousParameters(backend=backend, endpoint=etcd_endpoint, run_id=run_id,
                                  min_nodes=1, max_nodes=2, last_call_timeout=1)
    handler = rdzv_registry.get_rendezvous_handler(params)
    monkeypatch.setattr(api, "_train_agent", lambda spec, events: FailingAgent(handler, error))
    spec = SimpleNamespace(
        rendezvous=RendezvousConfig(backend=backend, endpoint=etcd_endpoint, run_id=run_id),
        agent_logs=True, process=SimpleNamespace(signals_to_handle="SIGTERM"))

    with pytest.raises((type(error), api.Interrupted)):
        api.run_agent(spec)

    assert lease_threads(run_id) == []  # etcd-v3: the keyspace's lease thread
    node_lease = getattr(handler, "_lease", None)  # etcd: the node's lease, refreshed
    assert node_lease is None or node_lease not in etcd_lease._REFRESHER._due
    assert not handler.is_closed()  # left open: the other nodes may go on without us
