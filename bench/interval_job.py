"""Figure 17's job: ``fit()`` under each checkpoint policy, with the same faults by the clock.

``python -m bench.interval_job CONFIG_JSON OUT_JSON`` runs, one after the other in this
process, a 2-rank ``fit()`` per policy of ``policies``: ``steps`` steps of ``step_s``
seconds each (a sleep: the figure is about time, not compute, on a machine other runs
share), checkpointing every step (``"step"``), every ``steps_per_epoch`` (``"epoch"``)
or when ``elastic_train.should_checkpoint(prior_mtbf_s=fault_every_s)`` says
(``"should_checkpoint"``); ``"live"`` checkpoints every epoch and keeps its state live
(:class:`elastic_train.torch.LiveState`): a fault rolls back to the last step, not the
last checkpoint. A save is a real ``torch.save`` plus ``save_s`` of sleep (a
larger state's write), reported SYNC, so its cost is the job's own to measure. Rank 1
raises when the run's wall time passes the next of :func:`fault_times` (seeded,
exponential gaps of mean ``fault_every_s``, never shorter than ``min_gap_s``): every
policy meets the same faults at the same times since its ``fit()`` began, as a
cluster's failures come by the clock. Each rank writes every answer it got from
``should_checkpoint()``, which must be the same on both.

What comes out, per policy: the run's goodput ledger (``Result.goodput``), whether the
run finished, whether the ranks' answers agreed, and for ``"live"`` the seconds from
each fault to the next completed step.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time

import torch

import elastic_train as et
from elastic_train.torch import LiveState, TorchTrainer


def _due(config: dict, step: int) -> bool:
    policy = config["policy"]
    if policy == "step":
        return True
    if policy in ("epoch", "live"):
        return (step + 1) % config["steps_per_epoch"] == 0
    return et.should_checkpoint(prior_mtbf_s=config["fault_every_s"])


def fault_times(config: dict) -> list[float]:
    """Seconds after ``fit()`` began at which rank 1 fails, the same for every policy."""
    draw, times = random.Random(config["fault_seed"]), [0.0]
    while times[-1] < config["timeout_s"]:
        times.append(times[-1] + max(config["min_gap_s"],
                                     draw.expovariate(1 / config["fault_every_s"])))
    return times[1:]


def _fault_due(config: dict, rank: int) -> bool:
    """Rank 1, once the run's wall time passed its next fault time."""
    if rank != 1:
        return False
    path = config["faults_file"]
    with open(path) as f:
        injected = int(f.read() or 0)
    if time.time() - config["began"] < config["fault_times"][injected]:
        return False
    with open(path, "w") as f:
        f.write(str(injected + 1))
    return True


def _note(config: dict, name: str, value: float) -> None:
    with open(os.path.join(config["work"], name), "a") as f:
        f.write(f"{value}\n")


def _start(config: dict) -> tuple[int, LiveState | None]:
    """The step to start at, and the live state of the ``"live"`` policy."""
    if config["policy"] == "live":
        live = LiveState(model=torch.nn.Linear(8, 8))
        return live.restore(), live
    if (checkpoint := et.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            return torch.load(os.path.join(d, "state.pt"))["step"], None
    return 0, None


def _fault_to_step(config: dict) -> list[float]:
    """Seconds from each fault to the first step completed after it (``"live"``)."""
    def read(name: str) -> list[float]:
        path = os.path.join(config["work"], name)
        return [float(v) for v in open(path).read().split()] if os.path.exists(path) else []

    firsts = read("first-steps")
    return [min((f - t for f in firsts if f > t), default=float("nan"))
            for t in read("faults-at")]


def train(config: dict) -> None:
    rank = et.get_context().get_world_rank()
    start, live = _start(config)
    answers = open(os.path.join(config["work"], f"answers-{rank}.jsonl"), "a")
    for step in range(start, config["steps"]):
        time.sleep(config["step_s"])
        if _fault_due(config, rank):
            _note(config, "faults-at", time.time())
            raise RuntimeError(f"injected fault at step {step}")
        if live is not None:
            live.step_done()
            if step == start and rank == 0:
                _note(config, "first-steps", time.time())
        due = _due(config, step)
        answers.write(json.dumps([start, step, due]) + "\n")
        answers.flush()
        if not due:
            et.report({"step": step + 1})
            continue
        if live is not None:
            with live.checkpoint() as checkpoint:
                time.sleep(config["save_s"])
                et.report({"step": step + 1}, checkpoint=checkpoint,
                          checkpoint_upload_mode=et.CheckpointUploadMode.SYNC)
            continue
        with tempfile.TemporaryDirectory() as d:
            torch.save({"step": step + 1}, os.path.join(d, "state.pt"))
            time.sleep(config["save_s"])
            et.report({"step": step + 1}, checkpoint=et.Checkpoint.from_directory(d),
                      checkpoint_upload_mode=et.CheckpointUploadMode.SYNC)


def _answers_agree(work: str) -> bool:
    """Each (attempt start, step) both ranks asked about got one answer on both."""
    seen: list[dict] = []
    for rank in (0, 1):
        with open(os.path.join(work, f"answers-{rank}.jsonl")) as f:
            seen.append({(s, i): due for s, i, due in map(json.loads, f)})
    both = seen[0].keys() & seen[1].keys()
    return bool(both) and all(seen[0][k] == seen[1][k] for k in both)


def _fit(config: dict) -> dict:
    """One policy's run: what came out of it."""
    os.makedirs(config["work"], exist_ok=True)
    with open(config["faults_file"], "w") as f:
        f.write("0")
    config["began"] = time.time()
    result = TorchTrainer(
        train, train_loop_config=config, scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=config["storage"], name=config["policy"],
                                verbose=0,
                                failure_config=et.FailureConfig(
                                    max_failures=-1, max_restarts_without_progress=-1)),
    ).fit()
    return {"finished": result.error is None, "goodput": result.goodput.to_json(),
            "answers_agree": (_answers_agree(config["work"])
                              if config["policy"] == "should_checkpoint" else None),
            "fault_to_step_s": _fault_to_step(config) if config["policy"] == "live" else []}


def main(config_path: str, out_path: str) -> None:
    with open(config_path) as f:
        config = json.load(f)
    config["fault_times"] = fault_times(config)
    out = {}
    for policy in config["policies"]:
        work = os.path.join(config["work"], policy)
        out[policy] = _fit({**config, "policy": policy, "work": work,
                            "faults_file": os.path.join(work, "faults")})
        with open(out_path, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
