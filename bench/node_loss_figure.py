"""Figure 8b (continued): a lost node, without and with a hot spare (#26 items 2 and 3).

``python -m bench --only node_loss`` runs figure 8b's recovery
(:func:`bench.rendezvous_figure.recover`) for ``elastic-train launch`` only, in two
shapes, repetitions interleaved:

- no spare: 3 agents (``--nnodes 2:3``), one SIGKILLed with its worker, the 2 survivors
  go on at world size 2;
- a spare: 2 agents (``--nnodes 2 --spares 1``) and a third parked as a spare, one of
  the two SIGKILLed with its worker; the spare takes its place, world size 2 again.

Each cell is the seconds from the kill to the first all-reduce at world size 2 (every
rank in it: it is a collective), per repetition, and the worker processes started on
the nodes that survived (the spare's own new worker is not counted). The goals are
#26's: with ``@restart_in_process``, survivors step again within 2 s in their own
processes; without it within 3 s; with a spare, the full world size steps within 3 s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.procs import free_port
from bench.rendezvous_figure import (
    ETCD_LAUNCHERS,
    LAUNCHERS,
    NO_SPARE,
    WITH_SPARE,
    Launcher,
    Loss,
    Recovery,
    etcd_endpoint,
    recover,
)
from bench.report import Table
from bench.stats import Target

if TYPE_CHECKING:
    from bench.suite import Suite

LOSSES = (NO_SPARE, WITH_SPARE)
TITLES = {NO_SPARE.key: "1 of 3 lost (`--nnodes 2:3`)",
          WITH_SPARE.key: "1 of 2 lost, a spare waiting (`--nnodes 2 --spares 1`)"}


def goal(launcher: Launcher, loss: Loss) -> Target:
    """#26's goal for the seconds to stepping again at world size 2."""
    wrapped = launcher.worker == "restartable"
    return Target(2.0 if wrapped and not loss.spares else 3.0, at_least=False)


def node_loss(suite: Suite) -> list[Table]:
    """Figure 8b (continued): a lost node, without and with a spare, per launcher."""
    profile, echo = suite.profile, suite.echo
    launchers = [LAUNCHERS[key] for key in profile.node_loss_launchers]
    recovered: dict[tuple[str, str], list[Recovery]] = {}
    errors: list[str] = []
    with etcd_endpoint(any(x in launchers for x in ETCD_LAUNCHERS)) as etcd:
        usable = [x for x in launchers if x not in ETCD_LAUNCHERS or etcd is not None]
        for rep in range(profile.repeat):
            for loss in LOSSES:
                for launcher in usable:
                    endpoint = etcd if launcher in ETCD_LAUNCHERS and etcd else \
                        f"127.0.0.1:{free_port()}"
                    what = f"{launcher.label}, {TITLES[loss.key]}, rep {rep + 1}"
                    times = recover(launcher, endpoint, profile.timeout_s, loss)
                    if times.error:
                        errors.append(f"{what}: {times.error}")
                        suite.fatal_failures += 1
                        echo(f"  [node_loss] {what}: FAILED, {times.error[:300]}")
                        continue
                    recovered.setdefault((launcher.key, loss.key), []).append(times)
                    echo(f"  [node_loss] {what}: restarted {times.restarted}, stepping "
                         f"{times.resumed}, {times.new_processes} new processes")
    return [_table(launchers, usable, recovered, errors)]


def _each(values: list[float | None], digits: int) -> str:
    return ", ".join("—" if v is None else f"{v:.{digits}f}" for v in values) or "n/a"


def _table(launchers: list[Launcher], usable: list[Launcher],
           recovered: dict[tuple[str, str], list[Recovery]], errors: list[str]) -> Table:
    table = Table("Figure 8b (continued): a node SIGKILLed with its worker, without and with "
                  "a spare → stepping again at world size 2 (s, each repetition)",
                  ["launcher, backend", "node lost", "worker restarted",
                   "stepping at world size 2", "new worker processes on the survivors",
                   "goal (#26), slowest run"])
    for loss in LOSSES:
        for launcher in launchers:
            if launcher not in usable:
                table.add(launcher.label, TITLES[loss.key],
                          *["not available here (no etcd binary)"] * 4)
                continue
            runs = recovered.get((launcher.key, loss.key), [])
            stepping = [r.resumed for r in runs]
            target = goal(launcher, loss)
            stepped = [v for v in stepping if v is not None]
            slowest = max(stepped) if runs and len(stepped) == len(runs) else None
            table.add(launcher.label, TITLES[loss.key], _each([r.restarted for r in runs], 2),
                      _each(stepping, 2), _each([r.new_processes for r in runs], 0),
                      f"{target.describe()} s {target.verdict(slowest)}")
    table.notes += [
        "Agents of `elastic-train launch`, one worker each (bench/rdzv_worker.py: gloo, an "
        "all-reduce every 50 ms), all on this machine; the c10d store's host (the first "
        "agent) is never the one killed. With a spare, it is started once the job of 2 "
        "steps, and the kill waits until it is parked (etcd: its spare key; c10d: torch's "
        "redundancy list).",
        "'worker restarted': rank 0's next attempt started (its own process with "
        "@restart_in_process, else a new one); 'stepping at world size 2': rank 0's first "
        "all-reduce after the kill, which every rank -- the spare's new one included -- "
        "joined. 'new worker processes on the survivors': started after the kill on the "
        "nodes that were in the job (the spare's worker is new by nature, not counted).",
        "Goals (#26): without a spare, ≤ 2.0 s in the survivors' own processes with "
        "@restart_in_process, ≤ 3.0 s without; with a spare, the full world size stepping "
        "≤ 3.0 s.",
        *[f"FAILED {error}" for error in errors],
    ]
    return table
