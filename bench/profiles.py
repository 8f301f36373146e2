"""The two profiles: ``full`` (the numbers in BENCHMARKS.md) and ``smoke`` (CI).

Sizes are chosen for a 2-core CPU: with 2 workers x 1 thread, one optimizer
step of the ``full`` MLP (512 -> 1024 -> 1024 -> 10, batch 128 per worker,
~1.6 M parameters) takes ~30 ms with gloo. ``smoke`` only proves that every
code path still runs: tiny model, one repetition, 2 epochs, no recovery or
scaling runs, a 1 MiB instead of ~100 MB checkpoint (and 1 MiB instead of
100/400 MB for storage, 2 MB sharded checkpoints instead of 128/400 MB).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.interval_figure import IntervalWorkload
from bench.measure import FaultPlan
from bench.workload import WorkloadConfig


@dataclass(frozen=True)
class Profile:
    """Workloads and repetitions of every figure.

    ``main`` serves figures 1, 2 and 5 (the same runs); ``checkpoint_payload_mb``
    is added to the state of the figure 3 runs to bring it to ~100 MB;
    ``storage_sizes_mb`` are the checkpoint sizes of figure 7, ``shard_reads_mb``
    and ``local_tier_mb`` those of the sharded checkpoints of figures 10 and 11.
    """

    name: str
    repeat: int
    workers: int
    timeout_s: float
    main: WorkloadConfig
    checkpoint: WorkloadConfig
    recovery: WorkloadConfig
    scaling: WorkloadConfig
    scaling_workers: tuple[int, ...]
    storage_sizes_mb: tuple[int, ...] = (100, 400)
    shard_reads_mb: float = 128  # figure 10's 4-rank sharded checkpoint
    local_tier_mb: float = 400  # figure 11's 2-rank sharded checkpoint
    peer_restore_mb: float = 256  # figure 10b's share of each node
    background_steps: int = 12  # figure 11b's bound: steps timed per phase
    digest_mib: int = 256  # figure 16: the bytes each checksum runs over
    figures: tuple[str, ...] | None = None  # None: every figure of bench.figures.FIGURES
    rendezvous_agents: tuple[int, ...] = (2, 4, 8, 16)
    rendezvous_launchers: tuple[str, ...] = ("torchrun", "torchrun-unshared", "c10d", "etcd",
                                             "etcd-v3", "c10d-wrapped", "etcd-wrapped")
    rendezvous_recovery: bool = True
    # figure 8b continued: a lost node without and with a spare (elastic-train launch only)
    node_loss_launchers: tuple[str, ...] = ("etcd-wrapped", "c10d-wrapped", "etcd", "c10d")
    scale_nodes: tuple[int, ...] = (8, 32, 64, 128, 256, 512, 1024)
    scale_backends: tuple[str, ...] = ("c10d", "etcd-v3", "etcd")
    scale_timeout_s: float = 60.0
    overhead: WorkloadConfig = WorkloadConfig()
    overhead_pairs: int = 12
    fault: FaultPlan = field(default=FaultPlan(how="sigkill", epoch=1, step=5, rank=1,
                                               recover_within_s=30.0))
    faults: tuple[str, ...] = ("exception", "exit", "sigkill")  # figure 4's rows
    soak_faults: int = 50  # figure 14
    # Figure 15 (skipped without CUDA): full, the reference workload -- a 13.7 M
    # parameter MLP (512 -> 2048 x 4 -> 10) with Adam; smoke, the tiny one with Adam.
    gpu: WorkloadConfig = WorkloadConfig(input_dim=512, hidden=2048, layers=4, batch=256,
                                         steps_per_epoch=40, epochs=3, optimizer="adam",
                                         lr=1e-3)
    gpu_faults: tuple[str, ...] = ("exception", "sigkill", "exit")
    interval: IntervalWorkload = IntervalWorkload()  # figure 17's job
    live_steps: int = 400  # figure 17b's steps (of figure 12's model)
    # figure 18: goodput ledgers read, (days, faults)
    ledger_reads: tuple[tuple[float, int], ...] = ((54, 4), (54, 400), (365, 4), (365, 2700))
    metrics_reports: tuple[int, ...] = (10, 100, 600)  # figure 19: report counts timed


_FULL_MODEL = WorkloadConfig(input_dim=512, hidden=1024, layers=2, batch=128)

FULL = Profile(
    name="full", repeat=3, workers=2, timeout_s=300,
    main=_FULL_MODEL.replace(steps_per_epoch=25, epochs=6),
    # model + momentum = 12.6 MB; the payload brings the checkpoint to ~100 MB.
    checkpoint=_FULL_MODEL.replace(steps_per_epoch=5, epochs=4, payload_mb=88),
    recovery=_FULL_MODEL.replace(steps_per_epoch=25, epochs=3),
    scaling=_FULL_MODEL.replace(steps_per_epoch=15, epochs=4),
    scaling_workers=(1, 2, 4),
    # Short runs, many of them: 2 steady epochs of 60 steps (~2 s) after a warm-up epoch.
    overhead=_FULL_MODEL.replace(steps_per_epoch=60, epochs=3), overhead_pairs=12,
)

_TINY_MODEL = WorkloadConfig(input_dim=32, hidden=64, layers=2, batch=16)

SMOKE = Profile(
    name="smoke", repeat=1, workers=2, timeout_s=120,
    main=_TINY_MODEL.replace(steps_per_epoch=5, epochs=2),
    checkpoint=_TINY_MODEL.replace(steps_per_epoch=5, epochs=2, payload_mb=1),
    recovery=_TINY_MODEL.replace(steps_per_epoch=5, epochs=2),
    scaling=_TINY_MODEL.replace(steps_per_epoch=5, epochs=2),
    scaling_workers=(1, 2),
    storage_sizes_mb=(1,), shard_reads_mb=2, local_tier_mb=2, peer_restore_mb=2,
    background_steps=2, digest_mib=4,
    # gpu: one line without CUDA (its device count is all it costs here)
    figures=("cold_start", "steps", "checkpoint", "memory", "storage", "rendezvous",
             "rendezvous_scale", "overhead", "straggler_cost", "data_position", "gpu",
             "digest_cost", "interval", "live_cost", "ledger_read", "metrics_row"),
    rendezvous_agents=(2,), rendezvous_launchers=("c10d",), rendezvous_recovery=False,
    fault=FaultPlan(how="sigkill", epoch=1, step=2, rank=1, recover_within_s=30.0),
    faults=("exit",),
    soak_faults=3,
    scale_nodes=(4,), scale_backends=("etcd",), scale_timeout_s=30.0,
    overhead=_TINY_MODEL.replace(steps_per_epoch=5, epochs=2), overhead_pairs=2,
    gpu=_TINY_MODEL.replace(steps_per_epoch=5, epochs=2, optimizer="adam", lr=1e-3),
    interval=IntervalWorkload(steps=20, steps_per_epoch=10, step_s=0.05, save_s=0.05,
                              fault_every_s=0.5, min_gap_s=3.0, timeout_s=120.0,
                              policies=("should_checkpoint", "live")),
    live_steps=60,
    ledger_reads=((1, 4), (1, 100)), metrics_reports=(10, 40),
)

PROFILES = {p.name: p for p in (FULL, SMOKE)}
