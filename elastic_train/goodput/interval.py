"""How often to checkpoint: Young/Daly's optimum from the job's own save cost and failures.

A checkpoint every ``T`` seconds of training costs ``C/T`` of the time in saves, and a
failure (one every ``MTBF`` seconds) loses ``T/2`` of work on average: the waste
``C/T + T/(2*MTBF)`` is least at ``T = sqrt(2*C*MTBF)`` (Young 1974; Daly 2006 adds
higher-order terms that matter only when ``C`` nears ``MTBF``). ``C`` is what the job
measured (training's wait on its saves, :mod:`elastic_train.goodput.breakdown`'s checkpoint
time per checkpoint); ``MTBF`` the run's wall time over its failures, or
:data:`PRIOR_MTBF_S` until it saw one.

:func:`is_due` is ``elastic_train.should_checkpoint()``'s rule, a pure function of
values every rank holds alike; :func:`advise` is what ``elastic-train show`` prints.

Example::

    optimum(save_cost_s=2.0, mtbf_s=3600.0)   # 120.0 s of training between checkpoints
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from elastic_train.goodput.breakdown import Cause, Goodput

PRIOR_MTBF_S = 3600.0  # the MTBF assumed until the run has seen a failure: one an hour


def optimum(save_cost_s: float, mtbf_s: float) -> float:
    """Young/Daly's interval between checkpoints, ``sqrt(2*C*MTBF)``, in seconds."""
    return math.sqrt(2.0 * max(save_cost_s, 0.0) * max(mtbf_s, 0.0))


def mtbf(observed_s: float, failures: int, prior_s: float = PRIOR_MTBF_S) -> float:
    """The mean time between failures: ``observed_s / failures``; until a failure was
    seen, the longer of ``prior_s`` and the time seen without one."""
    return observed_s / failures if failures > 0 else max(prior_s, observed_s)


def waste(interval_s: float, save_cost_s: float, mtbf_s: float) -> float:
    """The first-order share of time lost to saves and redone work at ``interval_s``."""
    if interval_s <= 0 or mtbf_s <= 0:
        return math.inf
    return save_cost_s / interval_s + interval_s / (2.0 * mtbf_s)


def is_due(since_checkpoint_s: float, next_report_s: float | None, save_cost_s: float | None,
           mtbf_s: float) -> bool:
    """Whether the next report should carry a checkpoint: when the training time since
    the last one will pass the optimum by then (``since_checkpoint_s`` at the latest
    report plus ``next_report_s``, the latest interval between reports). Without a
    measured save cost, yes (the save measures it); before any interval is known, no."""
    if save_cost_s is None:
        return True
    if next_report_s is None:
        return False
    return since_checkpoint_s + next_report_s >= optimum(save_cost_s, mtbf_s)


@dataclass(frozen=True)
class IntervalAdvice:
    """The interval a run used beside the optimum, and what the difference cost.

    ``used_s``: training seconds (productive and redone) per checkpoint; ``extra_s``: the
    first-order waste per second of training at ``used_s`` less that at ``optimum_s``,
    times the run's productive seconds (what the difference cost; 0 at the optimum).
    """

    used_s: float
    optimum_s: float
    save_cost_s: float
    mtbf_s: float
    failures: int
    extra_s: float

    def describe(self) -> str:
        seen = (f"{self.failures} failure(s) seen" if self.failures
                else f"none seen: a prior of {PRIOR_MTBF_S:.0f} s")
        return (f"a checkpoint every {self.used_s:.2f} s of training ({self.save_cost_s:.3f} s "
                f"each); Young/Daly's optimum sqrt(2*C*MTBF) = {self.optimum_s:.2f} s with MTBF "
                f"{self.mtbf_s:.1f} s ({seen}): the difference cost about {self.extra_s:.1f} s")


def advise(goodput: Goodput) -> IntervalAdvice | None:
    """The advice for a run from its ledger; None before its first checkpoint."""
    if goodput.checkpoints == 0:
        return None
    seconds = goodput.seconds
    save_cost = seconds[Cause.CHECKPOINT] / goodput.checkpoints
    used = (seconds[Cause.PRODUCTIVE] + seconds[Cause.RECOMPUTE]) / goodput.checkpoints
    mean = mtbf(goodput.wall_s, goodput.failures)
    best = optimum(save_cost, mean)
    extra = (waste(used, save_cost, mean) - waste(best, save_cost, mean)) \
        * seconds[Cause.PRODUCTIVE] if best > 0 else 0.0
    return IntervalAdvice(used, best, save_cost, mean, goodput.failures, max(extra, 0.0))
