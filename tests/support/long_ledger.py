"""A long goodput ledger made up for tests and the benchmark: one launch, rank 0's
``work`` line every ``every_s`` seconds, a checkpoint every ``per_checkpoint`` lines, and
``faults`` faults spread evenly over the run, each followed by a rendezvous and an
attempt that restores the last checkpoint. What each fault costs is known exactly, so
a test can check :func:`~elastic_train.goodput.breakdown.breakdown` by hand."""

from __future__ import annotations

from typing import Any

STEPS_PER_LINE = 10  # iterations between two work lines
PRODUCTIVE_S = 8.0   # of each line's gap; the rest: 1 s checkpoint, 1 s stragglers
DETECTION_S, RENDEZVOUS_S, STARTUP_S, RESTORE_S = 1.0, 2.0, 1.0, 1.0


def _work(t: float, iteration: int, checkpoint: bool) -> dict[str, Any]:
    return {"event": "work", "t": t, "from_iteration": iteration - STEPS_PER_LINE,
            "iteration": iteration, "productive": PRODUCTIVE_S, "checkpoint": 1.0,
            "stragglers": 1.0, "checkpoints": int(checkpoint)}


def _restart(failed_at: float, restored: int, live: bool) -> list[dict[str, Any]]:
    """A fault at ``failed_at`` and the attempt after it, which restores ``restored``
    (``live``: goes on from a survivor's copy of it, taken a second before the fault)."""
    detected = failed_at + DETECTION_S
    formed = detected + RENDEZVOUS_S
    ready = formed + STARTUP_S + RESTORE_S
    lines = [{"event": "fault", "t": detected, "failed_at": failed_at, "kind": "failure"},
             {"event": "rendezvous", "t": formed},
             {"event": "attempt", "t": ready, "started": formed + STARTUP_S,
              "restored_iteration": None if live else restored}]
    return lines + ([{"event": "live", "t": ready, "iteration": restored, "step": restored,
                      "taken_at": failed_at - 1.0}] if live else [])


def long_ledger(seconds: float, faults: int, every_s: float = 10.0,
                per_checkpoint: int = 6, live: bool = False) -> list[dict[str, Any]]:
    """The ledger of a run of ``seconds`` (see the module). Each fault comes half a gap
    after a work line: that line's work, and every line's since the last checkpoint,
    is lost (``live``: each attempt goes on from a survivor's copy of the last line's
    iteration instead)."""
    lines = int(seconds // every_s)
    fault_after = {round((k + 1) * lines / (faults + 1)) for k in range(faults)}
    entries = [{"event": "launch", "t": 0.0},
               {"event": "attempt", "t": 2.0, "started": 1.0, "restored_iteration": None}]
    t, iteration, checkpointed = 2.0, 0, 0
    for line in range(1, lines + 1):
        t, iteration = t + every_s, iteration + STEPS_PER_LINE
        if line % per_checkpoint == 0:
            checkpointed = iteration
        entries.append(_work(t, iteration, line % per_checkpoint == 0))
        if line in fault_after:
            restored = iteration if live else checkpointed
            entries += _restart(t + every_s / 2, restored, live)
            t, iteration = entries[-1]["t"], restored
    return [*entries, {"event": "end", "t": t + 1.0, "status": "finished"}]
