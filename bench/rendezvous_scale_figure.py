"""Figure 9: rendezvous at scale -- N simulated nodes form a round, and form it again
after one is lost, for torch's c10d, torch's dynamic handler over etcd, and ours.

Each case is :mod:`bench.rdzv_scale_sim` in a process of its own (which spreads
the N handlers over two simulating processes per core), against an etcd 3.4 server on
127.0.0.1 that this figure starts (a fresh one per case, so that no case pays for
the leftovers of another), or torch's TCPStore for c10d. A backend that failed at
some N is not run at larger N.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bench.rdzv_scale_sim import IDLE_S
from bench.rendezvous_figure import etcd_endpoint
from bench.report import Table
from bench.stats import Target
from bench.variants import REPO

if TYPE_CHECKING:
    from bench.suite import Suite

BACKENDS = {
    "c10d": "c10d: torch's dynamic handler, TCPStore backend",
    "etcd-v3": "etcd-v3: torch's dynamic handler over etcd",
    "etcd": "etcd: ours (etcd_native)",
}
FORM_TARGET = Target(10.0, at_least=False)  # seconds, at 1,024 nodes
REFORM_TARGET = Target(2.0, at_least=False)  # issue #26: a lost node costs two seconds


@contextlib.contextmanager
def _endpoint(backend: str) -> Iterator[str | None]:
    """A fresh etcd server (None if not installed), or a free port for c10d's store."""
    if backend != "c10d":
        with etcd_endpoint(True) as endpoint:
            yield endpoint
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield f"127.0.0.1:{port}"  # free a moment ago; node 0 binds it


def simulate(backend: str, nodes: int, timeout_s: float) -> dict[str, object]:
    """One case; the simulation's result, or one with ``error`` set."""
    with _endpoint(backend) as endpoint:
        if endpoint is None:
            return {"error": "not available here (no etcd binary)"}
        command = [sys.executable, "-m", "bench.rdzv_scale_sim", backend, str(nodes),
                   endpoint, str(timeout_s)]
        env = {**os.environ, "PYTHONPATH": REPO}
        try:
            proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=3 * timeout_s + 120)
        except subprocess.TimeoutExpired:
            return {"error": f"did not end within {3 * timeout_s + 120:.0f} s"}
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if not lines:
            return {"error": f"exit code {proc.returncode}: {proc.stderr[-300:]}"}
        return json.loads(lines[-1])


def _cell(result: dict[str, object], phase: str) -> str:
    if "error" in result:
        return str(result["error"])
    outcome = result.get(phase)
    if not isinstance(outcome, dict):
        return "—"
    if outcome["seconds"] is None:
        errors = outcome.get("errors") or ["not formed"]
        return "FAILED: " + "; ".join(str(e)[:80] for e in errors[:1])
    cost = result.get(f"{phase}_cost")
    text = f"{outcome['seconds']:.2f}"
    if isinstance(cost, list) and cost[0]:
        text += f" ({cost[0]:.1f} req, {cost[1] / 1024:.1f} KiB)"
    return text


def rendezvous_scale(suite: Suite) -> list[Table]:
    """Figure 9: forming and re-forming a round of N simulated nodes, per backend."""
    profile, echo = suite.profile, suite.echo
    results: dict[tuple[str, int], dict[str, object]] = {}
    for backend in profile.scale_backends:
        failed_at = None
        for nodes in profile.scale_nodes:
            if failed_at is not None:
                results[(backend, nodes)] = {"error": f"not run (failed at {failed_at} nodes)"}
                continue
            result = simulate(backend, nodes, profile.scale_timeout_s)
            results[(backend, nodes)] = result
            form, reform = _cell(result, "form"), _cell(result, "reform")
            echo(f"  [rendezvous_scale] {backend}, {nodes} nodes: form {form}, "
                 f"re-form {reform}")
            if "error" in result or not all(
                    isinstance(result.get(p), dict) and result[p]["seconds"] is not None
                    for p in ("form", "reform")):
                failed_at = nodes
    return [_table(profile.scale_backends, profile.scale_nodes, results, profile.scale_timeout_s)]


def _table(backends: tuple[str, ...], sizes: tuple[int, ...],
           results: dict[tuple[str, int], dict[str, object]], timeout_s: float) -> Table:
    table = Table("Figure 9: rendezvous at scale -- N simulated nodes form a round, and form "
                  "it again after one is lost (s; etcd requests and bytes per node)",
                  ["backend", "phase", *[f"{n} nodes" for n in sizes]])
    for backend in backends:
        for phase, label in (("form", "form"), ("reform", "re-form after a loss")):
            table.add(BACKENDS[backend], label,
                      *[_cell(results.get((backend, n), {"error": "—"}), phase) for n in sizes])
    largest = max(sizes)
    ours = results.get(("etcd", largest), {})
    for phase, target in (("form", FORM_TARGET), ("reform", REFORM_TARGET)):
        outcome = ours.get(phase)
        seconds = outcome["seconds"] if isinstance(outcome, dict) else None
        table.notes.append(f"Goal, ours at {largest} nodes, {phase}: {target.describe()} s "
                           f"{target.verdict(seconds)}")
    idle = ours.get("idle_per_s")
    if isinstance(idle, list):
        table.notes.append(
            f"etcd's steady load, ours at {largest} nodes (the formed job left alone "
            f"{IDLE_S:.0f} s): {idle[0]:.0f} requests/s, {idle[2]:.0f} lease refreshes/s, "
            f"{idle[1] / 1024:.0f} KiB/s -- each node's liveness lease (1 s TTL asked, 2 s "
            "granted by etcd's defaults, refreshed 3 times per TTL) and its node lease (15 s, "
            "every 5 s).")
    table.notes += [
        "Method: `python -m bench.rdzv_scale_sim BACKEND N ENDPOINT TIMEOUT` per cell: N "
        "rendezvous handlers (no agents, no workers) in threads of two processes per core on "
        "this machine, against an etcd 3.4 server on 127.0.0.1 (a fresh one per cell) or torch's "
        "TCPStore hosted by node 0; `--nnodes N-1:N` with the settings `elastic-train launch` "
        "gives each backend (last call 2 s; heartbeat 1 s x 3 for torch's handler, torch's "
        "5 s x 3 for ours). Form: all handlers call next_rendezvous() at once, then act as "
        "torch's agent (re-rendezvous while num_nodes_waiting() > 0), until all are in one "
        "round; between the phases every handler is asked num_nodes_waiting() every 0.1 s, "
        "as an agent's monitor asks while its workers run. Re-form: one node's heartbeats "
        "(our lease refreshes) stop, the others call "
        "next_rendezvous() again at once, until all survivors are in one round.",
        "Requests and bytes: what etcd itself counted (gRPC calls started, bytes received + "
        "sent), divided by N; they include the lease and heartbeat refreshes during the phase.",
        f"A cell fails after {timeout_s:.0f} s (join timeout); a backend that failed is not "
        "run at larger N.",
        "Limits: all N nodes share this machine's 2 cores with etcd (a real etcd has its own), "
        "so client CPU that real nodes spend in parallel is spent here in turn; timings move "
        "with the machine's load (±30 % between runs seen). A process refreshes the leases of "
        "its simulated nodes in one request, where real nodes send one keep-alive message each "
        "on their own stream: the refreshes/s above are those messages. "
        "What a simulation cannot show: network latency and loss between nodes, etcd on "
        "other machines (a 3-member cluster commits through raft), agents' and workers' "
        "start-up, and the c10d TCPStore connections every real node opens.",
    ]
    return table
