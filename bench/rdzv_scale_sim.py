"""One case of figure 9: N simulated nodes as rendezvous handlers in threads of this process.

    python -m bench.rdzv_scale_sim BACKEND NODES ENDPOINT TIMEOUT_S

BACKEND is ``c10d`` (torch's DynamicRendezvousHandler over its TCPStore backend;
ENDPOINT is a free port this process hosts the store on), ``etcd-v3`` (torch's
DynamicRendezvousHandler over our etcd v3 backend) or ``etcd`` (our native
handler); for the etcd ones ENDPOINT is the etcd server. Every node uses the
rendezvous settings ``elastic-train launch`` gives that backend (last call 2 s;
heartbeat 1 s x 3 for torch's handler, torch's 5 s x 3 for ours) with
``--nnodes NODES-1:NODES``.

1. The NODES handlers are created (an agent's start; not timed), then all call
   ``next_rendezvous()`` at once: *form* is the time until the last one returned.
2. One node (never the c10d store's host) is lost: its heartbeats (or lease
   refreshes) stop and it never calls again. The others call
   ``next_rendezvous()`` again at once, as their agents would after their workers
   failed, having first dropped it from the rendezvous as their agents do once
   they know it is gone (node liveness: its beacon refuses their probe):
   *re-form* is the time from the loss until all survivors are in one round.

Between the phases each simulating process asks every handler
``num_nodes_waiting()`` every 0.1 s, as an agent's monitor does while its workers
run (our etcd handler opens its watch of the next round on such a call).

Prints one JSON line: the times (null if not complete within TIMEOUT_S), the
ranks and world sizes seen, and -- for the etcd backends -- the requests and
bytes etcd served during each phase, from its own metrics, and its steady load
while the formed job runs (``idle_per_s``: requests, bytes and lease refreshes
per second over ``IDLE_S`` seconds between the phases).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from elastic_train._internal.rendezvous_backends import lookup
from elastic_train.agent.rendezvous import gone_nodes
from elastic_train.agent.rendezvous.registry import register as register_backend


def etcd_counters(endpoint: str) -> tuple[int, int, int]:
    """(gRPC calls started, bytes received + sent, lease refreshes) so far, from etcd's
    /metrics; health checks excluded. A call through etcd's HTTP gateway is one gRPC
    call; a lease refresh is one keep-alive message (a process's batch of refreshes is
    one call of many messages, where real nodes send one message each)."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as response:
        text = response.read().decode()
    calls = sum(float(m.group(2)) for m in re.finditer(
        r'^grpc_server_started_total\{grpc_method="(\w+)",grpc_service="etcdserverpb[^}]*\} (\S+)',
        text, re.M))
    size = sum(float(m.group(1)) for m in re.finditer(
        r"^etcd_network_client_grpc_(?:received|sent)_bytes_total (\S+)", text, re.M))
    refreshes = sum(float(m.group(1)) for m in re.finditer(
        r'^grpc_server_msg_received_total\{grpc_method="LeaseKeepAlive"[^}]*\} (\S+)',
        text, re.M))
    return int(calls), int(size), int(refreshes)


IDLE_S = 10.0  # how long the formed job is left alone to measure etcd's steady load


def make_handlers(backend: str, nodes: int, endpoint: str, timeout_s: float, run_id: str,
                  indices: list[int]) -> list[RendezvousHandler]:
    """The handlers of nodes ``indices`` of the job (node 0 first: with c10d, the host)."""
    table_entry = lookup(backend, "backend")
    register_backend(table_entry)
    settings = {**table_entry.defaults, "join_timeout": int(timeout_s), "close_timeout": 10}
    params = [RendezvousParameters(backend, endpoint, run_id, nodes - 1, nodes,
                                   local_addr="127.0.0.1", **settings) for _ in indices]
    made: list[RendezvousHandler | None] = [None] * len(indices)

    def make(i: int) -> None:
        made[i] = get_rendezvous_handler(params[i])

    if indices and indices[0] == 0:
        make(0)
    run_threads(make, len(indices), start=1 if indices and indices[0] == 0 else 0)
    return [h for h in made if h is not None]


def run_threads(work: Callable[[int], None], count: int, start: int = 0) -> None:
    threads = [threading.Thread(target=work, args=(i,), daemon=True)
               for i in range(start, count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def rendezvous(handlers: list[RendezvousHandler], started: float, timeout_s: float,
               target: int, gone: frozenset[int] = frozenset(),
               ranks: list[int | None] | None = None) -> dict[str, object]:
    """Every handler's ``next_rendezvous()`` at once, each then acting as torch's agent
    does: while its round is not the whole job and ``num_nodes_waiting()`` is positive
    (one monitor thread asks every handler every 0.1 s, the agent's monitor
    interval), it calls ``next_rendezvous()`` again. Before its first call, a handler
    of rank ``ranks[i]`` forgets the group ranks ``gone`` as its agent does once node
    liveness knew them gone (:mod:`elastic_train.agent.rendezvous.gone_nodes`; the
    probe itself, milliseconds on a network, is not simulated). Returns the seconds
    from ``started`` until all handlers are in a round of ``target`` nodes (None if
    not within ``timeout_s`` or a call failed), the failures, the ranks and worlds
    seen (``by_handler``: each handler's rank) and this process's CPU seconds."""
    agents = _Agents(handlers, started, timeout_s, target, gone, ranks)
    cpu = time.process_time()
    watcher = threading.Thread(target=agents.monitor, daemon=True)
    watcher.start()
    run_threads(agents.run, len(handlers))
    agents.formed.set()
    watcher.join()
    return agents.result(time.process_time() - cpu)


class _Agents:
    """The simulated agents of one :func:`rendezvous`, one per handler, and what they saw."""

    def __init__(self, handlers: list[RendezvousHandler], started: float, timeout_s: float,
                 target: int, gone: frozenset[int], ranks: list[int | None] | None):
        self.handlers, self.started, self.timeout_s = handlers, started, timeout_s
        self.target, self.gone, self.ranks = target, gone, ranks
        self.latest: list[tuple[int, int] | None] = [None] * len(handlers)
        self.wake = [threading.Event() for _ in handlers]
        self.errors: list[str] = []
        self.formed = threading.Event()
        self.finished: list[float] = []
        self.lock = threading.Lock()
        self.whole = 0  # how many handlers are in a round of them all

    def run(self, i: int) -> None:
        """Agent ``i``: forgets the nodes gone, then joins rounds until the whole job is
        in one (or the time is up, or a call failed)."""
        try:
            if self.gone and self.ranks is not None and (rank := self.ranks[i]) is not None \
                    and (left := gone_nodes.forget(self.handlers[i], set(self.gone))) is not None:
                gone_nodes.seal_when_joined(self.handlers[i], left, rank, self.timeout_s)
            while not self.formed.is_set() and time.monotonic() < self.started + self.timeout_s:
                self._joined(i, self.handlers[i].next_rendezvous())
                self.wake[i].wait(max(self.started + self.timeout_s - time.monotonic(), 0))
                self.wake[i].clear()
        except Exception as exc:  # reported in the result
            self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            self.formed.set()
        finally:
            self.wake[i].set()

    def _joined(self, i: int, info: Any) -> None:
        """Agent ``i`` is in a round (``info``: torch's ``RendezvousInfo``); the job is
        formed once every agent is in a round of ``target`` nodes."""
        with self.lock:
            if self.latest[i] is not None and self.latest[i][1] == self.target:
                self.whole -= 1
            self.latest[i] = (info.rank, info.world_size)
            self.whole += info.world_size == self.target
            if self.whole == len(self.handlers):
                self.finished.append(time.monotonic())
                self.formed.set()

    def monitor(self) -> None:
        """Torch's agent monitor: wakes an agent whose handler sees nodes waiting."""
        while not self.formed.wait(0.1) and time.monotonic() < self.started + self.timeout_s:
            for i, handler in enumerate(self.handlers):
                if self.latest[i] is not None and handler.num_nodes_waiting() > 0:
                    self.wake[i].set()
        for event in self.wake:
            event.set()

    def result(self, cpu_s: float) -> dict[str, object]:
        """What :func:`rendezvous` returns."""
        latest = self.latest
        ok = not self.errors and self.finished
        return {"seconds": self.finished[0] - self.started if ok else None,
                "errors": sorted(set(self.errors))[:3],
                "ranks": [x[0] for x in latest if x], "worlds": sorted({x[1] for x in latest if x}),
                "by_handler": [x[0] if x else None for x in latest], "cpu_s": cpu_s}


def lose(handler: RendezvousHandler) -> None:
    """The node dies: whatever keeps it alive in the rendezvous stops, nothing is sent."""
    if hasattr(handler, "_stop_heartbeats"):  # torch's DynamicRendezvousHandler
        handler._stop_heartbeats()
    else:  # ours: its leases (the node's, its liveness record's) are no longer refreshed,
        handler.release()  # its watches end


def part(backend: str, nodes: int, endpoint: str, timeout_s: float, run_id: str,
         index: int, parts: int) -> None:
    """A simulating process: nodes ``index, index + parts, ...`` of the job; follows the
    coordinator's commands on stdin (FORM/LOSE <wall time>, EXIT), answering on stdout."""
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as elastic-train launch sets
    # A thread waiting for the GIL wakes every switch interval to ask for it: with
    # hundreds of simulated nodes runnable at once (all learn of a seal together),
    # the default 5 ms makes those wake-ups alone saturate this machine's cores.
    sys.setswitchinterval(0.05)
    indices = list(range(index, nodes, parts))
    handlers = make_handlers(backend, nodes, endpoint, timeout_s, run_id, indices)
    asking = threading.Lock()  # held by a phase; between phases the monitor goes on asking

    def monitor_between_phases() -> None:
        """As an agent's monitor while its workers run: num_nodes_waiting() every 0.1 s."""
        while True:
            with asking:
                for handler in handlers:
                    handler.num_nodes_waiting()
            time.sleep(0.1)

    threading.Thread(target=monitor_between_phases, daemon=True).start()
    print("READY", flush=True)
    ranks: list[int | None] = []
    for line in sys.stdin:
        command, *args = line.split()
        if command == "EXIT":
            break
        at = float(args[0])
        gone = frozenset(map(int, args[1:]))  # LOSE: the lost node's rank, known gone
        with asking:  # taken before the start, so that a sweep in progress is not timed
            time.sleep(max(at - time.time(), 0))
            started = time.monotonic() - (time.time() - at)
            if command == "LOSE" and indices[-1] == nodes - 1:
                lose(handlers.pop())
            result = rendezvous(handlers, started, timeout_s, nodes - (command == "LOSE"),
                                gone, ranks)
        ranks = result["by_handler"]  # type: ignore[assignment]
        if indices[-1] == nodes - 1 and ranks:
            result["last_rank"] = ranks[-1]  # the node a LOSE loses
        print("DONE " + json.dumps(result), flush=True)


def main(backend: str, nodes: int, endpoint: str, timeout_s: float) -> dict[str, object]:
    """Runs the case over simulating processes (two per core, at least 16 nodes each);
    returns the times of both phases and etcd's cost per node. More processes than that
    only contend for the cores: with 8 on 2 cores, a 1,024-node re-form took 3.1-3.6 s
    instead of 2.1-2.5 s, and starved lease refreshes expired 100-300 liveness leases
    mid-phase (each then renewed, and its node's join sent again)."""
    parts = min(2 * (os.cpu_count() or 1), max(1, nodes // 16))
    run_id = f"scale-{uuid.uuid4().hex[:8]}"
    procs = []
    for index in range(parts):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "bench.rdzv_scale_sim", "--part", str(index), str(parts),
             run_id, backend, str(nodes), endpoint, str(timeout_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        if index == 0:  # node 0 (with c10d, the store's host) is up before the others
            assert procs[0].stdout is not None and procs[0].stdout.readline().strip() == "READY"
    try:
        for proc in procs[1:]:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        result: dict[str, object] = {"backend": backend, "nodes": nodes, "processes": parts}
        def count() -> tuple[int, int, int]:
            return etcd_counters(endpoint) if backend != "c10d" else (0, 0, 0)

        counters = [count()]
        lost = ""
        for phase, command in (("form", "FORM"), ("reform", "LOSE")):
            result[phase] = _phase(procs, f"{command} {{at}} {lost}".strip(),
                                   nodes - (command == "LOSE"))
            lost = str(result[phase].pop("last_rank", ""))  # type: ignore[union-attr]
            counters.append(count())
            result[phase + "_cost"] = [(b - a) / nodes for a, b in
                                       zip(counters[-2], counters[-1], strict=True)]
            if result[phase]["seconds"] is None:  # type: ignore[index]
                break
            if phase == "form":  # etcd's load while the job runs: the nodes' refreshes
                time.sleep(IDLE_S)
                idle = count()
                result["idle_per_s"] = [(b - a) / IDLE_S for a, b in
                                        zip(counters[-1], idle, strict=True)]
                counters.append(idle)
        return result
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _phase(procs: list[subprocess.Popen[str]], command: str, target: int) -> dict[str, object]:
    """One phase in every simulating process at once (``command`` with ``{at}`` for the
    wall time it starts at); their results combined."""
    at = time.time() + 0.5
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(command.format(at=at) + "\n")
        proc.stdin.flush()
    parts = []
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        parts.append(json.loads(line.split(" ", 1)[1]) if line.startswith("DONE ") else
                     {"seconds": None, "errors": ["a simulating process died"]})
    times = [p["seconds"] for p in parts]
    ranks = sorted(r for p in parts for r in p.get("ranks", []))
    ok = None not in times and ranks == list(range(target))
    lost = [p["last_rank"] for p in parts if p.get("last_rank") is not None]
    return {"seconds": max(times) if ok else None,
            "errors": sorted({e for p in parts for e in p["errors"]})[:3],
            "worlds": sorted({w for p in parts for w in p.get("worlds", [])}),
            "cpu_s": sum(p.get("cpu_s", 0.0) for p in parts),
            **({"last_rank": lost[0]} if lost else {})}


if __name__ == "__main__":
    if sys.argv[1] == "--part":
        index_, parts_, run_id_, backend_, nodes_, endpoint_, timeout_ = sys.argv[2:9]
        part(backend_, int(nodes_), endpoint_, float(timeout_), run_id_, int(index_),
             int(parts_))
    else:
        backend_, nodes_, endpoint_, timeout_ = sys.argv[1:5]
        print(json.dumps(main(backend_, int(nodes_), endpoint_, float(timeout_))), flush=True)
    os._exit(0)  # handlers of a failed case may still be blocked in their threads
