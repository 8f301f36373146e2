"""The figures, by name: the one table of what each measures, its goal, and its function.

Each entry of :data:`FIGURES` names the figure as BENCHMARKS.md heads it (its number and
subject), the goal its tables judge with PASS or MISS ("" where a figure only informs),
and the function that measures it and returns its tables. The functions live in the
modules imported below (figures 1-3, 5 and 6 in :mod:`bench.main_figures`, 16 in
:mod:`bench.digest_cost`, the others in a ``bench/*_figure.py`` each); :mod:`bench.suite`
runs the measurements they share. ``python -m bench`` offers the names, runs the figures
in this order, and a profile runs all of them unless it names some.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.data_position_figure import GOAL_PERCENT as POSITION_PERCENT
from bench.data_position_figure import GOAL_RESUME_MS, data_position
from bench.digest_cost import digest_cost
from bench.gpu_figure import gpu
from bench.interval_figure import interval
from bench.ledger_read_figure import YEAR_TARGET, ledger_read
from bench.live_cost import live_cost
from bench.main_figures import (
    AGENT_MEMORY_TARGET,
    COLD_START_TARGET,
    STEPS_EPOCH_TARGET,
    STEPS_STEP_TARGET,
    checkpoint,
    cold_start,
    memory,
    scaling,
    steps,
)
from bench.metrics_row_figure import FLAT_TARGET, metrics_row
from bench.node_loss_figure import node_loss
from bench.nodes_figure import nodes
from bench.overhead_figure import GOAL_PERCENT as OVERHEAD_PERCENT
from bench.overhead_figure import overhead
from bench.peer_figure import PEER_TARGET, peer_restore
from bench.recovery_figure import RECOVERY_TARGET, recovery
from bench.rendezvous_figure import OUR_RECOVERY_TARGET, rendezvous
from bench.rendezvous_scale_figure import FORM_TARGET, REFORM_TARGET, rendezvous_scale
from bench.report import Table
from bench.sharded_figure import BLOCKED_TARGET, STEPS_TARGET, TIER_TARGET, local_tier, shard_reads
from bench.soak_figure import RSS_GROWTH, soak
from bench.storage_figure import storage
from bench.straggler_cost_figure import GOAL_PERCENT as SCORING_PERCENT
from bench.straggler_cost_figure import straggler_cost
from bench.suite import Suite


@dataclass(frozen=True)
class Figure:
    """One figure of BENCHMARKS.md.

    Attributes:
        number: Its number there ("8b (continued)": a figure that extends another).
        subject: What it measures, in a few words.
        goal: What its PASS/MISS cells judge; "" for a figure that only informs.
        measure: Runs it and returns its tables.
    """

    number: str
    subject: str
    goal: str
    measure: Callable[[Suite], list[Table]]

    @property
    def heading(self) -> str:
        return f"Figure {self.number}: {self.subject}"


FIGURES: dict[str, Figure] = {
    "cold_start": Figure(
        "1", "cold start", f"elastic-train's first step {COLD_START_TARGET.describe()} × "
        "torchrun's (a)", cold_start),
    "steps": Figure(
        "2", "steady-state steps/s", f"steps/s {STEPS_EPOCH_TARGET.describe()} × torchrun's "
        f"(a); {STEPS_STEP_TARGET.describe()} with a metrics report every other step", steps),
    "checkpoint": Figure("3", "time a 100 MiB checkpoint blocks rank 0", "", checkpoint),
    "recovery": Figure(
        "4", "a worker fails mid-epoch: fault → every rank stepping again",
        f"in-process restarts {RECOVERY_TARGET.describe()} s", recovery),
    "memory": Figure(
        "5", "peak memory", f"agent/driver {AGENT_MEMORY_TARGET.describe()} MiB over "
        "torchrun's agent", memory),
    "scaling": Figure("6", "scaling with the number of workers", "", scaling),
    "storage": Figure("7", "checkpoint storage: report() blocking and upload throughput", "",
                      storage),
    "rendezvous": Figure(
        "8", "rendezvous: forming a job, and a lost node",
        f"our launchers recover from a lost node {OUR_RECOVERY_TARGET.describe()} s",
        rendezvous),
    "rendezvous_scale": Figure(
        "9", "rendezvous at scale (simulated nodes)",
        f"ours at 1,024 nodes: form {FORM_TARGET.describe()} s, re-form "
        f"{REFORM_TARGET.describe()} s", rendezvous_scale),
    "shard_reads": Figure("10", "bytes a restart downloads per node (sharded checkpoint, S3)",
                          "", shard_reads),
    "peer_restore": Figure(
        "10b", "a wiped node restores its share from a peer or the store",
        f"peer {PEER_TARGET.describe()} × the store's time and × a 1 Gbit/s store's least",
        peer_restore),
    "local_tier": Figure(
        "11", "a restart with a 400 MB sharded checkpoint, and what a save blocks",
        f"restart from S3 with the local tier {TIER_TARGET.describe()} × local disk; "
        f"async_save's call {BLOCKED_TARGET.describe()} × a bare copy; steps during a write "
        f"{STEPS_TARGET.describe()} × without", local_tier),
    "node_loss": Figure(
        "8b (continued)", "a lost node, without and with a spare",
        "stepping again ≤ 2 s (in process, no spare), else ≤ 3 s (#26)", node_loss),
    "overhead": Figure("12", "steady-state cost per step",
                       f"elastic-train's cost ≤ {OVERHEAD_PERCENT:g} % of a step", overhead),
    "straggler_cost": Figure(
        "12b", "what straggler scoring adds to a report()",
        f"≤ {SCORING_PERCENT:g} % of a step at a report per epoch", straggler_cost),
    "data_position": Figure(
        "12c", "elastic data positions",
        f"≤ {POSITION_PERCENT:g} % of a step per batch; a resume at 90 % of an epoch "
        f"< {GOAL_RESUME_MS:g} ms slower than at 0 %", data_position),
    "nodes": Figure("13", "a worker fails on one node of a 3-node job", "", nodes),
    "soak": Figure(
        "14", "the soak: one fit() run, one fault after another",
        "finished, nothing lost, bit-identical weights, no leaks, RSS growth "
        f"≤ +{RSS_GROWTH.bound * 100:g} %", soak),
    "gpu": Figure("15", "GPU: in-process restarts on nccl", "", gpu),
    "digest_cost": Figure("16", "what a checkpoint file's checksums cost", "", digest_cost),
    "interval": Figure(
        "17", "checkpoint interval on the same faults: every step, every epoch, "
        "should_checkpoint()", "should_checkpoint() takes less wall time than both others, "
        "and its ranks get the same answers", interval),
    "live_cost": Figure("17b", "what LiveState.step_done() costs a step",
                        "≤ 0.5 % of a 22 ms step on the CPU clock", live_cost),
    "ledger_read": Figure(
        "18", "reading the goodput ledger", f"a year-long ledger read in "
        f"{YEAR_TARGET.describe()} s", ledger_read),
    "metrics_row": Figure(
        "19", "a report's metrics row and ledger line on S3, against the reports before it",
        f"the row's cost at 600 reports {FLAT_TARGET.describe()} × at 10 (flat)", metrics_row),
}
