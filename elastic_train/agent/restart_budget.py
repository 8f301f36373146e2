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

Example::

    budget = RestartBudget(max_failures=1, max_preemptions=-1)
    budget.charge(FailureKind.FAILURE).restart   # True: 0 restarts left
    budget.charge(FailureKind.FAILURE).restart   # False: the budget is spent
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_train.storage.run_state import FailureKind

UNLIMITED = -1


@dataclass(frozen=True)
class Decision:
    """What to do after one failed attempt.

    ``restarts_left``: restarts of the budget it was charged to that remain
    after this one (-1: unlimited). ``preemption_budget_spent``: the run stops
    because of preemptions, not failures.
    """

    kind: FailureKind
    restart: bool
    restarts_left: int
    preemption_budget_spent: bool = False


@dataclass
class RestartBudget:
    """Counts failed attempts per budget; :meth:`charge` says whether to restart."""

    max_failures: int
    max_preemptions: int = UNLIMITED
    failures: int = 0
    preemptions: int = 0
    peer_failures: int = 0

    @staticmethod
    def _spend(limit: int, used: int) -> tuple[bool, int]:
        """(whether attempt number ``used`` may restart, restarts left after it)."""
        if limit == UNLIMITED:
            return True, UNLIMITED
        return used <= limit, max(limit - used, 0)

    def charge(self, kind: FailureKind) -> Decision:
        """Spends one attempt of ``kind``'s budget; the decision for the group."""
        if kind is FailureKind.PEER:
            self.peer_failures += 1
            return Decision(kind, True, self._spend(self.max_failures, self.failures)[1])
        if kind is FailureKind.PREEMPTION:
            self.preemptions += 1
            restart, left = self._spend(self.max_preemptions, self.preemptions)
            return Decision(kind, restart, left, preemption_budget_spent=not restart)
        self.failures += 1
        return Decision(kind, *self._spend(self.max_failures, self.failures))
