"""The node's storage settings in this process: its local tier's directory, whether
uploads are kept there, the run's storage retry budget and the node's replica server.

Storage never reads the environment. A worker sets these values once, as it starts,
from its worker plan (:func:`elastic_train.worker.worker_plan.install`); what reads
checkpoints outside the worker's session -- :meth:`.LocalTier.of_node`,
:class:`~elastic_train.storage.dcp.CheckpointReader`, ``Checkpoint.as_directory()``
-- takes them from here. Outside a run's workers they stay the defaults: no local
tier, the default retry budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elastic_train.storage.peer_replicas import PeerRing
    from elastic_train.storage.replica_server import NodeReplica


@dataclass(frozen=True)
class NodeSettings:
    """Attributes:
        tier_root: The node's local tier (None: none, outside a run's workers).
        keep_uploads: Whether the uploader keeps its staged files in the tier
            (``ELASTIC_TRAIN_LOCAL_TIER=0`` turns it off).
        retry_budget_s: ``RunConfig.storage_retry_timeout_s`` (None: the default).
        replica: This node's replica server, its key and certificate (None: none; see
            :mod:`.peer_replicas`).
        peers: Every node's replica server, as the ranks agreed at this attempt's start
            (None: no copies on peers).
    """

    tier_root: str | None = None
    keep_uploads: bool = True
    retry_budget_s: float | None = None
    replica: NodeReplica | None = None
    peers: PeerRing | None = None


_current = NodeSettings()


def current() -> NodeSettings:
    """This process's node settings (the defaults until :func:`use`)."""
    return _current


def use(settings: NodeSettings) -> None:
    """Makes ``settings`` this process's node settings (a worker, at its start, and
    with the attempt's ``peers`` as its ranks join)."""
    global _current
    _current = settings
