"""An agent that ends stops its rendezvous handler's heartbeats, but leaves the
rendezvous open: torch's c10d handler, real store and timer.

Before, an interrupted agent (SIGTERM: the rendezvous stays open for the other nodes)
left torch's keep-alive timer running; a heartbeat in a store call when the launcher's
interpreter finalized aborted it ("terminate called without an active exception",
SIGABRT instead of exit code 143; seen on node 1 of the Slurm requeue test).
"""

from __future__ import annotations

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry

from elastic_train.agent.api import Interrupted, _released
from tests.support.servers import free_port

pytestmark = [pytest.mark.timeout(60), pytest.mark.compat]  # torch_compat reads private names


def _formed_handler(port: int, run_id: str):
    """A c10d handler that formed a one-node round (its heartbeats run every second)."""
    handler = rdzv_registry.get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{port}", run_id=run_id, min_nodes=1,
        max_nodes=2, keep_alive_interval=1, last_call_timeout=1))
    handler.next_rendezvous()
    return handler


def test_an_interrupted_agent_stops_torchs_heartbeats_and_keeps_the_rendezvous_open():
    handler = _formed_handler(free_port(), "interrupted")
    try:
        timer = handler._keep_alive_timer._thread
        assert timer.is_alive()
        with pytest.raises(Interrupted), _released(handler):
            raise Interrupted(15)
        assert not timer.is_alive()  # stopped, and waited for
        assert not handler.is_closed()  # the other nodes may go on
    finally:
        handler.shutdown()
