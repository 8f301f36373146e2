"""Figure 15, the GPU proof: in-process restarts on nccl against torchrun, on a real card.

One worker per visible GPU (at least one), nccl, the profile's ``gpu`` workload
(full: a 13.7 M-parameter MLP with Adam, a ~160 MiB checkpoint every epoch).
Per repetition, every variant runs once without a fault -- its cold start
(launch → first step on rank 0) and the reference for its final weights -- and
once per fault (an exception, a SIGKILL, an exit on the last rank, first attempt
only, ``max_restarts=1``); the figure times the fault → every rank's first step
again, checks that the final weights are bit-identical to the fault-free run's,
and records each attempt's device memory at its start (``torch.cuda.memory_allocated``
and the peak so far: what a survivor of an in-process restart still holds) and
whether the restarted rank's process is the same one. The card and the torch
version come from the workers (``torch.cuda.get_device_name``).

Variants: (a') torchrun (the floor; a store prefix per restart, as in figure 4),
(c) ``fit()`` (in-process restarts), (c) again without the zygote's standby
(``ELASTIC_TRAIN_STANDBY=0``: what the pre-warmed CUDA context saves a replaced
rank), (d') ``elastic-train launch`` with an ``@restart_in_process`` main.

Without CUDA the figure is one line, "not available: no CUDA device". This
process never asks the CUDA runtime itself (it would poison its forks): devices
are counted by :func:`elastic_train._internal.devices.count`, in a short-lived child.

Dev switches (environment):

- ``BENCH_GPU_DRY_RUN=1``: the same figure on CPU (gloo, ``device="cpu"``), to prove
  the plumbing where there is no GPU; its numbers are not GPU numbers.
- ``BENCH_GPU_WORKERS=N``: N workers instead of one per GPU.
- ``BENCH_GPU_BUDGET_S=S``: start another repetition only while the figure's elapsed
  time plus the first repetition's duration stays within S seconds (a device session
  has little time; the table says how many ran).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from bench.measure import Sample
from bench.report import Table
from bench.stats import Summary, fmt_ratio, ratio
from bench.variants import ET_EPOCH, ET_LAUNCH_INPROC, ET_NO_STANDBY, FLOOR_NS
from bench.workload import parameter_count

if TYPE_CHECKING:
    from bench.suite import Suite

DRY_RUN_ENV = "BENCH_GPU_DRY_RUN"
WORKERS_ENV = "BENCH_GPU_WORKERS"
BUDGET_ENV = "BENCH_GPU_BUDGET_S"
NO_CUDA = "not available: no CUDA device"
VARIANTS = (FLOOR_NS, ET_EPOCH, ET_NO_STANDBY, ET_LAUNCH_INPROC)
FAULT_NAMES = {"exception": "exception in the train function",
               "sigkill": "worker SIGKILLed", "exit": "worker exits (code 1)"}
TITLE = "Figure 15"


def gpu(suite: Suite) -> list[Table]:
    dry_run = os.environ.get(DRY_RUN_ENV) == "1"
    if dry_run:
        gpus = 0
    else:
        from elastic_train._internal import devices  # counts in a forked child: no CUDA call here

        gpus = devices.count("cuda")
        if not gpus:
            suite.echo(f"  [gpu] {NO_CUDA} (elastic_train._internal.devices.count('cuda') == 0); "
                       f"skipped ({DRY_RUN_ENV}=1 runs it on CPU)")
            table = Table(f"{TITLE} — GPU: {NO_CUDA}", ["figure", "result"])
            table.add("in-process restarts on nccl vs torchrun", NO_CUDA)
            return [table]
    workers = int(os.environ.get(WORKERS_ENV) or max(1, gpus))
    runs = _run_all(suite, workers, "cpu" if dry_run else "cuda")
    return _tables(suite, runs, workers, dry_run)


Runs = dict[str, dict[str, list[Sample]]]  # fault ("" = none) -> variant key -> samples


def _run_all(suite: Suite, workers: int, device: str) -> Runs:
    profile = suite.profile
    base = profile.gpu.replace(device=device, probe=True)
    variants = suite.variants(*VARIANTS)
    budget = float(os.environ.get(BUDGET_ENV) or 0)
    runs: Runs = {how: {v.key: [] for v in variants} for how in ("", *profile.gpu_faults)}
    start = time.monotonic()
    first_rep_s = 0.0
    for rep in range(profile.repeat):
        elapsed = time.monotonic() - start
        if rep and budget and elapsed + first_rep_s > budget:
            suite.echo(f"  [gpu] stopping after {rep} repetition(s): another would end past "
                       f"{BUDGET_ENV}={budget:.0f} s")
            break
        for how in runs:
            fault = replace(profile.fault, how=how, rank=workers - 1,
                            recover_within_s=max(profile.fault.recover_within_s, 60.0)) \
                if how else None
            got = suite.run_set(f"gpu/{how or 'no fault'}/rep {rep + 1}", variants, base,
                                workers, max_restarts=1 if how else 0, fault=fault,
                                failures_are_results=bool(how), repeat=1)
            for key, samples in got.items():
                runs[how][key] += samples
                suite.echo(f"  [gpu] {key}, {how or 'no fault'}: {_brief(samples[0], how, runs)}")
        if rep == 0:
            first_rep_s = time.monotonic() - start
    return runs


def _brief(s: Sample, how: str, runs: Runs) -> str:
    """One progress line: what a log cut short by a timeout still shows."""
    parts = [f"first step {s.cold_first_step_s:.2f} s" if s.cold_first_step_s else
             "no first step"]
    if how:
        parts.append("no recovery" if s.recovery_s is None
                     else f"fault → stepping again {s.recovery_s:.2f} s")
        reference = _reference(runs[""].get(s.variant, []))
        if s.final_digest and reference:
            parts.append("weights " + ("bit-identical" if s.final_digest == reference
                                       else "DIFFER from the fault-free run"))
    elif s.final_digest:
        parts.append(f"weights {s.final_digest[:12]}")
    for a in s.attempts:
        if a.get("memory_allocated_mb") is not None:
            parts.append(f"rank {a['rank']} attempt {a['restart']} starts with "
                         f"{a['memory_allocated_mb']:.0f} MiB allocated")
    return "; ".join(parts)


def _reference(samples: list[Sample]) -> str | None:
    """The final weights digest of the variant's first fault-free run that has one."""
    return next((s.final_digest for s in samples if s.final_digest), None)


def _device(runs: Runs) -> dict:
    """The first ``attempt`` event of any run: device name, torch and CUDA versions."""
    return next((a for by_variant in runs.values() for samples in by_variant.values()
                 for s in samples for a in s.attempts), {})


def _nvidia_smi_name() -> str | None:
    """The card's name from nvidia-smi (a separate process: no CUDA call here)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out[0].replace(", ", ", driver ") if out else None


def _over(samples: list[Sample], get: Callable[[Sample], float | None]) -> Summary:
    return Summary.of([get(s) for s in samples])


def _identical(samples: list[Sample], reference: str | None) -> str:
    if reference is None:
        return "no fault-free reference"
    done = [s for s in samples if s.final_digest]
    same = sum(s.final_digest == reference for s in done)
    verdict = "yes" if done and same == len(samples) else "NO"
    return f"{verdict} ({same}/{len(samples)})"


def _restarted_in(samples: list[Sample], rank: int) -> str:
    """Whether the failed rank's second attempt ran in the same process as its first."""
    kinds = set()
    for s in samples:
        pids = {a["restart"]: a["pid"] for a in s.attempts if a["rank"] == rank}
        if 0 in pids and 1 in pids:
            kinds.add("same process" if pids[0] == pids[1] else "new process")
    return " / ".join(sorted(kinds)) or "—"


def _memory(samples: list[Sample]) -> str:
    """Device memory at the second attempt's start, largest over ranks (median over runs):
    allocated, and the peak the process reached before it."""
    def at_restart(s: Sample, key: str) -> float | None:
        values = [a[key] for a in s.attempts if a["restart"] == 1 and a.get(key) is not None]
        return max(values) if values else None
    allocated = _over(samples, lambda s: at_restart(s, "memory_allocated_mb"))
    peak = _over(samples, lambda s: at_restart(s, "max_memory_allocated_mb"))
    if not allocated.ok:
        return "n/a"
    return f"{allocated.median:.0f} (peak before: {peak.median:.0f})"


def _bad_forks(runs: Runs) -> int:
    return sum(bool(a.get("bad_fork")) for by_variant in runs.values()
               for samples in by_variant.values() for s in samples for a in s.attempts)


def _tables(suite: Suite, runs: Runs, workers: int, dry_run: bool) -> list[Table]:
    profile = suite.profile
    cfg = profile.gpu
    device = _device(runs)
    card = device.get("device") or _nvidia_smi_name() or "unknown device"
    where = (f"DRY RUN on CPU, gloo ({DRY_RUN_ENV}=1): plumbing only, no GPU numbers"
             if dry_run else f"{card}, nccl")
    versions = f"torch {device.get('torch', '?')}, CUDA {device.get('cuda') or '—'}"
    reps = max(len(s) for s in runs[""].values())
    variants = [v for v in VARIANTS if v.key in runs[""]]
    table = Table(f"{TITLE} — GPU ({where}; {versions}; {workers} worker(s)) — a fault mid-epoch: "
                  "fault → every rank's first step again (s, median (min–max))",
                  ["fault", "variant", "recovered", "fault → every rank stepping again",
                   "ratio to (a')", "final weights = fault-free run's", "restarted in",
                   "device memory at attempt 2's start, MiB"])
    for how in profile.gpu_faults:
        floor = _over(runs[how][FLOOR_NS.key], lambda s: s.recovery_s)
        for variant in variants:
            samples = runs[how][variant.key]
            rec = _over(samples, lambda s: s.recovery_s)
            table.add(FAULT_NAMES[how], variant.label,
                      f"{sum(s.recovery_s is not None for s in samples)}/{len(samples)}",
                      rec.fmt(), "floor" if variant is FLOOR_NS else fmt_ratio(ratio(rec, floor)),
                      _identical(samples, _reference(runs[""][variant.key])),
                      _restarted_in(samples, workers - 1), _memory(samples))
    fault = profile.fault
    table.notes += [
        f"Workload: MLP {cfg.input_dim} → {' → '.join([str(cfg.hidden)] * cfg.layers)} → "
        f"{cfg.classes} ({parameter_count(cfg):,} parameters), {cfg.optimizer} "
        f"(lr {cfg.lr}), batch {cfg.batch} per worker, {cfg.epochs} epochs × "
        f"{cfg.steps_per_epoch} steps, a checkpoint (model + optimizer) at the end of each "
        "epoch except for (a'); on CUDA deterministic algorithms (warn only) and "
        "CUBLAS_WORKSPACE_CONFIG=:4096:8.",
        f"Rank {workers - 1} fails after step {fault.step + 1} of epoch {fault.epoch + 1}, "
        "first attempt only; --max-restarts 1 / FailureConfig(max_failures=1). (a') starts "
        "over, the others resume from the epoch's checkpoint; both must end with the same "
        "weights as the variant's fault-free run (SHA-256 of the final state_dict).",
        "Device memory: torch.cuda.memory_allocated() at the start of the second attempt "
        "(before it builds anything), largest over ranks, and max_memory_allocated() then: "
        "a survivor of an in-process restart must have freed the failed attempt's tensors; "
        "a new process starts from 0.",
        f"{reps} repetition(s); each variant's fault-free runs are in figure 15b.",
    ]
    if _bad_forks(runs):
        table.notes.append(f"WARNING: {_bad_forks(runs)} attempt(s) ran in a process torch "
                           "marked a bad fork (its CUDA would not start).")
    return [table, _cold_start_table(runs, variants, where, versions)]


def _cold_start_table(runs: Runs, variants: list, where: str, versions: str) -> Table:
    clean = runs[""]
    floor_first = _over(clean[FLOOR_NS.key], lambda s: s.cold_first_step_s)
    floor_end = _over(clean[FLOOR_NS.key], lambda s: s.cold_end_s)
    floor_digest = _reference(clean[FLOOR_NS.key])
    table = Table(f"{TITLE}b — GPU ({where}; {versions}) — cold start without a fault "
                  "(s, median (min–max))",
                  ["variant", "launch → first step", "ratio to (a')", "launch → job end",
                   "ratio to (a')", "runs ok", "final weights = (a')'s"])
    for variant in variants:
        samples = clean[variant.key]
        first = _over(samples, lambda s: s.cold_first_step_s)
        end = _over(samples, lambda s: s.cold_end_s)
        digest = _reference(samples)
        same = "—" if variant is FLOOR_NS else (
            "n/a" if not (digest and floor_digest) else
            "yes" if digest == floor_digest else "no")
        table.add(variant.label, first.fmt(), "floor" if variant is FLOOR_NS
                  else fmt_ratio(ratio(first, floor_first)), end.fmt(),
                  "floor" if variant is FLOOR_NS else fmt_ratio(ratio(end, floor_end)),
                  f"{sum(s.ok for s in samples)}/{len(samples)}", same)
    table.notes.append("Launch: the harness starts the command; first step: rank 0's first "
                       "optimizer step done (loss.item() returned). Job end includes (c)'s "
                       "and (d')'s checkpoint uploads and every process's exit.")
    return table
