"""The figures, by name: which module measures each, and the table each one prints.

Figure 7 (storage) lives in :mod:`bench.storage_figure`, figure 8 (rendezvous) in
:mod:`bench.rendezvous_figure` (its lost node without and with a spare, 8b continued, in
:mod:`bench.node_loss_figure`), figure 9 (rendezvous at scale) in
:mod:`bench.rendezvous_scale_figure`, figures 10 and 11 (sharded checkpoints) in
:mod:`bench.sharded_figure`, figure 12 (overhead per step) in
:mod:`bench.overhead_figure` (12b, what straggler scoring costs, in
:mod:`bench.straggler_cost_figure`), figure 13 (a failure on one of three nodes) in
:mod:`bench.nodes_figure`, figure 14 (the soak) in :mod:`bench.soak_figure`, figure 15
(GPU: restarts on nccl) in :mod:`bench.gpu_figure`, figure 16 (the checkpoint interval
on the same faults) in :mod:`bench.interval_figure`; each
runs processes of its own.

Figures 1-3, 5 and 6 live in :mod:`bench.main_figures`; :mod:`bench.suite` runs them
all. :data:`FIGURES` is the one table of figures, in the order they run: ``python -m
bench`` offers its names, and a profile runs all of them unless it names some.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.data_position_figure import data_position
from bench.gpu_figure import gpu
from bench.interval_figure import interval
from bench.main_figures import checkpoint, cold_start, memory, scaling, steps
from bench.node_loss_figure import node_loss
from bench.nodes_figure import nodes
from bench.overhead_figure import overhead
from bench.peer_figure import peer_restore
from bench.recovery_figure import recovery
from bench.rendezvous_figure import rendezvous
from bench.rendezvous_scale_figure import rendezvous_scale
from bench.report import Table
from bench.sharded_figure import local_tier, shard_reads
from bench.soak_figure import soak
from bench.storage_figure import storage
from bench.straggler_cost_figure import straggler_cost
from bench.suite import Suite

FIGURES: dict[str, Callable[[Suite], list[Table]]] = {
    "cold_start": cold_start, "steps": steps, "checkpoint": checkpoint, "recovery": recovery,
    "memory": memory, "scaling": scaling, "storage": storage, "rendezvous": rendezvous,
    "rendezvous_scale": rendezvous_scale, "shard_reads": shard_reads,
    "peer_restore": peer_restore, "local_tier": local_tier, "node_loss": node_loss,
    "overhead": overhead, "straggler_cost": straggler_cost, "data_position": data_position,
    "nodes": nodes, "soak": soak, "gpu": gpu, "interval": interval,
}
