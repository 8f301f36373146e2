"""The failure policy: which budget a failed attempt spends, and whether the group restarts.

One object decides, from the kind of failure alone, so the policy is tested
without a process (torch's agent only carries the decision out):

- ``FAILURE`` -- a worker of this node failed: spends ``max_failures``
  (``FailureConfig.max_failures``; -1 = unlimited).
- ``PEER`` -- this node's workers failed only because a peer on another node
  did: free here; that node's agent charges its own budget.
- ``PREEMPTION`` -- the group knew of a preemption notice: spends
  ``max_preemptions`` (``FailureConfig.max_preemption_failures``), never
  ``max_failures``.

A failure whose root is a worker's ``ConfigError`` (a mistake in the run's settings) is
never restarted, whatever is left of the budget: a restart would raise it again.

Whatever is left of the budget, a failure or peer failure after too many
restarts without progress stops the run (the :mod:`.no_progress_guard`).

Example::

    budget = RestartBudget(max_failures=1, max_preemptions=-1)
    budget.charge(FailureKind.FAILURE).restart   # True: 0 restarts left
    budget.charge(FailureKind.FAILURE).restart   # False: the budget is spent
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.agent.no_progress_guard import NoProgressGuard, Progress
from elastic_train.agent.node_policy import NodeVerdict

UNLIMITED = -1


@dataclass(frozen=True)
class Decision:
    """What to do after one failed attempt.

    ``restarts_left``: restarts of the budget it was charged to that remain
    after this one (-1: unlimited). ``preemption_budget_spent``: the run stops
    because of preemptions, not failures. ``no_progress``: the run stops because
    restarts bring no progress (see :mod:`.no_progress_guard`), with the reason.
    ``leave``: this node leaves the job (the node policy's verdict, see
    :mod:`.node_policy`): its group does not restart, the other nodes' do.
    ``config_error``: the run stops because a worker raised a ``ConfigError``.
    """

    kind: FailureKind
    restart: bool
    restarts_left: int
    preemption_budget_spent: bool = False
    no_progress: str | None = None  # why the run stops although its budget is not spent
    leave: NodeVerdict | None = None
    config_error: bool = False


@dataclass
class RestartBudget:
    """Counts failed attempts per budget; :meth:`charge` says whether to restart."""

    max_failures: int
    max_preemptions: int = UNLIMITED
    failures: int = 0
    preemptions: int = 0
    peer_failures: int = 0
    guard: NoProgressGuard | None = None

    @staticmethod
    def _spend(limit: int, used: int) -> tuple[bool, int]:
        """(whether attempt number ``used`` may restart, restarts left after it)."""
        if limit == UNLIMITED:
            return True, UNLIMITED
        return used <= limit, max(limit - used, 0)

    @property
    def restarts_left(self) -> int:
        """Restarts of the failure budget that remain now (-1: unlimited)."""
        return self._spend(self.max_failures, self.failures)[1]

    def charge(self, kind: FailureKind, progress: Progress | None = None,
               failure: str = "", config_error: bool = False) -> Decision:
        """Spends one attempt of ``kind``'s budget; the decision for the group.

        ``progress`` (how far the run is now) and ``failure`` (the root failure's
        :func:`~.no_progress_guard.signature`) feed the no-progress guard, if any;
        ``config_error``: this node's root failure is a ``ConfigError`` (no restart).
        """
        if kind is FailureKind.PREEMPTION:
            self.preemptions += 1
            restart, left = self._spend(self.max_preemptions, self.preemptions)
            return Decision(kind, restart, left, preemption_budget_spent=not restart)
        if kind is FailureKind.PEER:
            self.peer_failures += 1
            decision = Decision(kind, True, self._spend(self.max_failures, self.failures)[1])
        else:
            self.failures += 1
            decision = Decision(kind, *self._spend(self.max_failures, self.failures))
            if config_error:
                return dataclasses.replace(decision, restart=False, config_error=True)
        reason = self.guard.check(progress, failure) if self.guard is not None else None
        if decision.restart and reason is not None:
            return Decision(kind, False, decision.restarts_left, no_progress=reason)
        return decision
