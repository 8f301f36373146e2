"""The no-progress guard: stop restarting when restarts bring nothing.

A run that fails the same way before it reaches its next checkpoint would
otherwise restart forever with ``max_failures=-1`` -- and a scheduler that
requeues a failed job (Slurm's requeue, a Kubernetes restart policy) would
burn the allocation doing it. The invariant: after ``limit`` consecutive
restarts whose attempts ended without a new committed checkpoint and without a
report past the furthest iteration the run had reached, the run stops, and
the reason names the failure that repeats.

Preemptions are not the run's fault: they neither count nor reset the count
(see :mod:`.restart_budget`, which consults this guard).

Example::

    guard = NoProgressGuard(limit=2, start=Progress(iteration=10, checkpoint=3))
    guard.check(Progress(12, 4), "rank 1: ValueError: nan")  # None: progress
    guard.check(Progress(12, 4), "rank 1: ValueError: nan")  # None: 1 restart without
    guard.check(Progress(12, 4), "rank 1: ValueError: nan")  # the reason to stop
"""

from __future__ import annotations

from dataclasses import dataclass, field

from elastic_train.errors import WorkerFailure

OFF = -1


@dataclass(frozen=True)
class Progress:
    """How far a run got: its furthest reported ``training_iteration`` and the index of
    its newest committed checkpoint (-1: none)."""

    iteration: int = 0
    checkpoint: int = -1

    def beyond(self, other: Progress) -> bool:
        return self.iteration > other.iteration or self.checkpoint > other.checkpoint

    def furthest(self, other: Progress) -> Progress:
        return Progress(max(self.iteration, other.iteration),
                        max(self.checkpoint, other.checkpoint))


def signature(failure: WorkerFailure) -> str:
    """A failure as the guard names it: the rank and the first line of its error (or how
    its process ended, when it left no error) -- what stays the same when it repeats."""
    first = (failure.message or "").strip().splitlines() if failure.traceback else []
    how = first[0] if first else (f"killed by {failure.signal_name}" if failure.signal_name
                                  else f"exited with code {failure.exitcode}")
    return f"rank {failure.rank}: {how}"


@dataclass
class NoProgressGuard:
    """Counts consecutive attempts that failed without progress (the first attempt of
    this launch is not a restart and does not count). ``limit=-1`` turns it off."""

    limit: int
    start: Progress = field(default_factory=Progress)
    _best: Progress | None = None
    _streak: list[str] = field(default_factory=list)
    _failed_attempts: int = 0

    def check(self, progress: Progress | None, failure: str) -> str | None:
        """After a failed attempt: the one-line reason to stop, or None to go on.
        ``progress``: how far the run is now (None: unknown, which counts as neither)."""
        self._failed_attempts += 1
        best = self._best or self.start
        if progress is None:
            return None
        if progress.beyond(best):
            self._best, self._streak = progress.furthest(best), []
            return None
        self._best = best
        if self._failed_attempts > 1:  # the attempt that just failed was a restart
            self._streak.append(failure)
        if self.limit == OFF or len(self._streak) < self.limit:
            return None
        return self._reason(best)

    def _reason(self, best: Progress) -> str:
        where = (f"no checkpoint after checkpoint_{best.checkpoint:06d}"
                 if best.checkpoint >= 0 else "no checkpoint")
        repeated = (f"each failed with {self._streak[-1]}" if len(set(self._streak)) == 1
                    else f"the last failed with {self._streak[-1]}")
        return (f"no progress in {len(self._streak)} consecutive restarts ({where}, no report "
                f"past iteration {best.iteration}); {repeated}")
