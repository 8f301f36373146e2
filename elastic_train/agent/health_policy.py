"""A node policy built in: a node checks its health, and leaves after failing too often.

:class:`HealthPolicy` (a :class:`~.node_policy.NodePolicy`) runs the node's health
checks (:mod:`.health_checks`) before the node joins a round and after every
failure charged to it; a node whose check fails, or that was charged with
``failures_in_a_row`` failures one after the other, leaves the job
(:class:`~elastic_train.errors.NodeLeftError`, naming the check and what it
found, recorded in ``run.json``) and is not admitted again for ``cool_off_s``
seconds (default 600), even if its agent is started again at once. The others go
on without it (``--nnodes MIN:MAX``) or with a spare that takes its place.

Its settings are class attributes, so a policy is named by its dotted path alone
(as :func:`~.node_policy.load` builds it); change them in a subclass::

    class MyNodes(HealthPolicy):
        failures_in_a_row = 3
        def checks(self):
            return [DeviceCheck("cuda", min_free_bytes=8 * 2**30),
                    CommandCheck(("/opt/site/gpu-burn-check", "--quick"))]

    # elastic-train launch --rdzv-conf node_policy=my_pkg.policies:MyNodes ...

A node checks only itself: a round's sealer admits the others (each checked itself
before joining). Checks take time before every round (a CUDA context on each
device: about a second per GPU), which is why this policy is opt-in.
"""

from __future__ import annotations

from collections.abc import Sequence

from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.agent.health_checks import DeviceCheck, HealthCheck, run_checks
from elastic_train.agent.node_policy import (
    ADMITTED,
    STAY,
    Admission,
    Candidate,
    ChargedFailures,
    NodePolicy,
    NodeVerdict,
    leave,
    refused,
)


class HealthPolicy(NodePolicy):
    """Checks before each round and after each charged failure; leaves on a failed check
    or after ``failures_in_a_row`` charged failures (0: never for that)."""

    failures_in_a_row: int = 2
    cool_off_s: float = 600.0  # how long a node that left stays out (see .cooling_off)

    def checks(self) -> Sequence[HealthCheck]:
        """The node's checks; by default its CUDA devices (none: nothing to check)."""
        return [DeviceCheck("cuda")]

    def admit(self, candidate: Candidate) -> Admission:
        if not candidate.here:
            return ADMITTED
        failed = self._failed_check()
        return ADMITTED if failed is None else refused(failed, self.cool_off_s)

    def after_failure(self, charged: ChargedFailures) -> NodeVerdict:
        if charged.kind is not FailureKind.FAILURE:
            return STAY
        failed = self._failed_check()
        if failed is not None:
            return leave(failed, self.cool_off_s)
        if 0 < self.failures_in_a_row <= charged.in_a_row:
            return leave(f"{charged.in_a_row} failures in a row charged to it",
                         self.cool_off_s)
        return STAY

    def _failed_check(self) -> str | None:
        """The first failed check, as one line; None when all passed."""
        for result in run_checks(self.checks()):
            if not result.ok:
                return f"health check '{result.name}' failed: {result.detail}"
        return None
