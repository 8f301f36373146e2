"""Which restart budget a failed attempt spends: the agent charges it
(:mod:`elastic_train.agent.restart_budget`), ``run.json`` records it
(:mod:`elastic_train.storage.run_state`) and ``elastic-train show`` prints it.

Example::

    kind = FailureKind.PEER if only_a_peer_failed else FailureKind.FAILURE
"""

from __future__ import annotations

import enum


class FailureKind(str, enum.Enum):
    """The budget a failed attempt spent; the value is what ``run.json`` holds."""

    FAILURE = "failure"        # a worker of this node failed: FailureConfig.max_failures
    PEER = "peer"              # only because a peer on another node failed: free here
    PREEMPTION = "preemption"  # after a preemption notice: max_preemption_failures
