"""Figure 8: rendezvous -- forming a job of N agents, and re-forming it after one dies.

Every agent is a node of its own on this machine, with one worker
(:mod:`bench.rdzv_worker`: started with ``--no-python`` to form a job, so that
the rows differ by the rendezvous alone; for recovery, a Python script each
launcher runs its own way, torchrun as a fresh interpreter, ``elastic-train
launch`` forked from its worker zygote), against the launchers in the same run:
torchrun's own c10d with its defaults (and, for recovery, with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), ``elastic-train launch`` with c10d,
and ``elastic-train launch`` with our native etcd handler and with torch's dynamic
handler over etcd (``etcd-v3``), against an etcd server on 127.0.0.1 that this
figure starts, when the ``etcd`` binary is installed.

- Forming: N agents started at once (``--nnodes N``); the time from the start
  until every worker has started. It includes N agents' Python start-up on
  the same cores, alike for every launcher.
- Recovery: 3 agents (``--nnodes 2:3``) train with a gloo all-reduce; one
  agent and its worker are SIGKILLed (the node is lost); the time until the
  survivors' rank-0 worker process restarted, and until its first all-reduce
  at world size 2. The c10d store's host (the first agent) is never the one
  killed: with c10d that loss is not survivable. :data:`WITH_SPARE` loses a node
  of 2 while a third waits parked as a spare (``--nnodes 2 --spares 1``); figure
  8b continued (:mod:`bench.node_loss_figure`) times both shapes."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.procs import descendants, free_port
from bench.rdzv_worker import NODE_VARIABLE
from bench.report import Table
from bench.stats import Summary, Target
from bench.variants import REPO

if TYPE_CHECKING:
    from bench.suite import Suite

WORKER = os.path.join(REPO, "bench", "rdzv_worker.py")
RECOVERY_WITHIN_S = 90.0
FORMING_WITHIN_S = 180.0
# Our 1 s heartbeat (3 missed = lost) drops agents that this 2-core machine starves
# for 3 s: 16 agents (and once 8) at a load of ~9 never formed a job, dropped in a
# loop; torch's 5 s formed it. The forming runs use torch's interval for our rows too,
# so that they time the rendezvous rather than the starvation.
FORMING_CONF = "keep_alive_interval=5"
SPARE_PARKS_WITHIN_S = 60.0
OUR_RECOVERY_TARGET = Target(5.0, at_least=False)  # issue 17: node loss -> training in 5 s


@dataclass(frozen=True)
class Launcher:
    """One row: how an agent of a job is started."""

    key: str
    label: str
    settings: str  # the recovery-relevant rendezvous settings, for the table
    env: tuple[tuple[str, str], ...] = ()
    forms: bool = True  # also a row of the forming table (not only of recovery)
    backend: str = ""  # elastic-train's --rdzv-backend, when it is not the key
    worker: str = "train"  # the recovery worker's mode (see bench.rdzv_worker)

    @property
    def rdzv_backend(self) -> str:
        """elastic-train's ``--rdzv-backend`` (torchrun rows: c10d)."""
        return self.backend or (self.key if self.key.startswith("etcd") else "c10d")

    def command(self, nnodes: str, endpoint: str, run_id: str, out_dir: str, mode: str,
                storage: str, rdzv_conf: str = "", spares: int = 0) -> list[str]:
        flags = ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-endpoint", endpoint,
                 "--rdzv-id", run_id, "--max-restarts", "3"]
        if rdzv_conf and not self.key.startswith("torchrun"):
            flags += ["--rdzv-conf", rdzv_conf]
        if spares and not self.key.startswith("torchrun"):  # torchrun parks them unasked
            flags += ["--spares", str(spares)]
        # Forming: the same light command for every launcher, so the rows differ by the
        # rendezvous alone. Recovery: a Python script, run the way each launcher runs one.
        worker = ["--no-python", sys.executable, WORKER, out_dir, mode] if mode == "stamp" \
            else [WORKER, out_dir, mode]
        if self.key.startswith("torchrun"):
            return [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "c10d",
                    *flags, *worker]
        return [sys.executable, "-m", "elastic_train.cli", "launch", "--rdzv-backend",
                self.rdzv_backend, *flags,
                "--storage-path", storage, *worker]


TORCHRUN = Launcher("torchrun", "torchrun, c10d (torch's defaults)",
                    "heartbeat 5 s x 3, last call 30 s")
TORCHRUN_UNSHARED = Launcher(
    "torchrun-unshared", "torchrun, c10d, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
    "heartbeat 5 s x 3, last call 30 s", env=(("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),),
    forms=False)
ET_C10D = Launcher("c10d", "elastic-train launch, c10d", "heartbeat 1 s x 3, last call 2 s")
ET_ETCD = Launcher("etcd", "elastic-train launch, etcd (ours, native)",
                   "lease 5 s x 3, last call 2 s")
ET_ETCD_V3 = Launcher("etcd-v3", "elastic-train launch, etcd-v3 (torch's dynamic handler)",
                      "heartbeat 1 s x 3, last call 2 s")
ET_C10D_WRAPPED = Launcher("c10d-wrapped", "elastic-train launch, c10d, @restart_in_process",
                           "heartbeat 1 s x 3, last call 2 s", forms=False, backend="c10d",
                           worker="restartable")
ET_ETCD_WRAPPED = Launcher("etcd-wrapped",
                           "elastic-train launch, etcd (ours, native), @restart_in_process",
                           "lease 5 s x 3, last call 2 s", forms=False, backend="etcd",
                           worker="restartable")
ETCD_LAUNCHERS = (ET_ETCD, ET_ETCD_V3, ET_ETCD_WRAPPED)
LAUNCHERS = {x.key: x for x in (TORCHRUN, TORCHRUN_UNSHARED, ET_C10D, ET_C10D_WRAPPED,
                                *ETCD_LAUNCHERS)}


@dataclass(frozen=True)
class Recovery:
    """Seconds from the kill to the survivors' restarted rank-0 worker process and to its
    first all-reduce (None: not within the wait); ``error`` when the run itself broke."""

    restarted: float | None = None
    resumed: float | None = None
    new_processes: int | None = None  # worker processes started on the surviving nodes
    error: str = ""


def _lines(path: str) -> list[list[str]]:
    try:
        with open(path) as f:
            return [line.split() for line in f if line.strip()]
    except OSError:
        return []


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


class Job:
    """The agents of one job, each in a session of its own; :meth:`close` kills what is left."""

    def __init__(self, launcher: Launcher, nnodes: str, endpoint: str, work: str,
                 rdzv_conf: str = "", spares: int = 0):
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", **dict(launcher.env)}
        self.out = os.path.join(work, "out")
        os.makedirs(self.out)
        self.work = work
        self.launcher, self.endpoint = launcher, endpoint
        self.run_id = run_id = f"bench-{os.path.basename(work)}"
        self._command = functools.partial(launcher.command, nnodes, endpoint, run_id, self.out,
                                          storage=os.path.join(work, "runs"),
                                          rdzv_conf=rdzv_conf, spares=spares)
        self.agents: list[subprocess.Popen[bytes]] = []
        self._logs: list[object] = []

    def start(self, mode: str, count: int = 1) -> None:
        for _ in range(count):
            node = len(self.agents)  # its workers' "pids" lines name it (bench/rdzv_worker.py)
            log = open(os.path.join(self.work, f"agent{node}.log"), "wb")  # noqa: SIM115
            self._logs.append(log)
            self.agents.append(subprocess.Popen(
                self._command(mode=mode), env={**self.env, NODE_VARIABLE: str(node)}, cwd=REPO,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True))

    def spare_parked(self) -> bool:
        """Whether a spare waits parked in the rendezvous: a spare's key of our etcd handler
        (``r/<round>/s/<node>``), or a node in the redundancy list of torch's c10d state."""
        backend = self.launcher.rdzv_backend
        if backend == "etcd":
            from tests.support.etcd_server import run_keys  # on sys.path (etcd_endpoint)

            return any(b"/s/" in key for key in run_keys(self.endpoint, self.run_id))
        if backend != "c10d":
            raise ValueError(f"no spare check for --rdzv-backend {backend}")
        from tests.support.rendezvous_state import c10d_spare_parked

        time.sleep(0.5)  # c10d's store is the first agent's: a light poll
        return c10d_spare_parked(self._store, self.run_id)

    @functools.cached_property
    def _store(self) -> Any:
        """One client of the c10d store for every poll (with a new client per poll, the
        job's two nodes were twice found dropped from torch's state by the spare)."""
        from tests.support.rendezvous_state import c10d_store

        return c10d_store(self.endpoint)

    def kill_node(self, index: int) -> None:
        """SIGKILLs agent ``index`` and its workers at once, as a lost node."""
        agent = self.agents[index]
        for pid in [agent.pid, *descendants(agent.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        agent.wait()

    def wait(self, timeout_s: float) -> bool:
        """Whether every agent exited 0 within ``timeout_s`` (killed ones excepted)."""
        deadline = time.monotonic() + timeout_s
        for agent in self.agents:
            try:
                code = agent.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
            if code not in (0, -signal.SIGKILL):
                return False
        return True

    def tail(self) -> str:
        with open(os.path.join(self.work, "agent0.log"), "rb") as f:
            return f.read()[-600:].decode(errors="replace")

    def close(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                self.kill_node(self.agents.index(agent))
        for log in self._logs:
            log.close()  # type: ignore[attr-defined]


@contextlib.contextmanager
def _job(launcher: Launcher, nnodes: str, endpoint: str, rdzv_conf: str = "",
         spares: int = 0) -> Iterator[Job]:
    work = tempfile.mkdtemp(prefix="bench-rdzv-")
    job = Job(launcher, nnodes, endpoint, work, rdzv_conf, spares)
    try:
        yield job
    finally:
        job.close()
        shutil.rmtree(work, ignore_errors=True)


def form(launcher: Launcher, agents: int, endpoint: str, timeout_s: float) -> float | str:
    """Seconds from starting ``agents`` agents at once to every worker started, or an error."""
    with _job(launcher, str(agents), endpoint, FORMING_CONF) as job:
        started = time.time()
        job.start("stamp", agents)
        starts = os.path.join(job.out, "starts")
        if not _wait_for(lambda: len(_lines(starts)) >= agents, timeout_s):
            return (f"{len(_lines(starts))}/{agents} workers started in {timeout_s:.0f} s: "
                    f"...{job.tail()}")
        formed = max(float(line[0]) for line in _lines(starts)) - started
        if not job.wait(60):
            return f"agents did not exit cleanly: ...{job.tail()}"
        return formed


@dataclass(frozen=True)
class Loss:
    """How figure 8b loses a node: the job's ``--nnodes``, its spares, which agent dies.

    Agent 0 is never the one killed: it hosts the c10d store. The job steps at world size
    2 after the loss either way: 3 shrink to 2, or a spare takes the lost node's place."""

    key: str
    nnodes: str
    spares: int
    working: int  # agents in the job before the loss (the spares wait besides)
    killed: int

    @property
    def agents(self) -> int:
        return self.working + self.spares


NO_SPARE = Loss("no-spare", "2:3", spares=0, working=3, killed=2)
WITH_SPARE = Loss("spare", "2", spares=1, working=2, killed=1)


def recover(launcher: Launcher, endpoint: str, timeout_s: float,
            loss: Loss = NO_SPARE) -> Recovery:
    """Times from SIGKILLing one agent of the job (and its worker) to its stepping again at
    world size 2: without a spare, 1 of 3 (``--nnodes 2:3``); with one, 1 of 2 (``--nnodes
    2 --spares 1``) while a third agent waits parked."""
    with _job(launcher, loss.nnodes, endpoint, spares=loss.spares) as job:
        steps, starts = os.path.join(job.out, "steps"), os.path.join(job.out, "starts")
        pids = os.path.join(job.out, "pids")
        job.start(launcher.worker)
        time.sleep(1.5)  # the first agent binds the c10d endpoint: it hosts the store
        job.start(launcher.worker, loss.working - 1)
        if not _wait_for(lambda: any(w == str(loss.working) for _, w in _lines(steps)),
                         timeout_s):
            return Recovery(error=f"the {loss.working} agents did not form a job: "
                                  f"...{job.tail()}")
        job.start(launcher.worker, loss.spares)  # once the job has its nodes: they park
        if loss.spares and not _wait_for(job.spare_parked, SPARE_PARKS_WITHIN_S):
            return Recovery(error=f"the spare did not park: ...{job.tail()}")
        time.sleep(1.0)
        if any(agent.poll() is not None for agent in job.agents):
            return Recovery(error=f"an agent exited before the loss: ...{job.tail()}")
        before = len(_lines(pids))
        killed_at = time.time()
        job.kill_node(loss.killed)

        def after_kill(path: str) -> float | None:
            times = [float(t) - killed_at for t, w in _lines(path)
                     if w == "2" and float(t) > killed_at]
            return min(times) if times else None

        _wait_for(lambda: after_kill(steps) is not None, RECOVERY_WITHIN_S)
        spares = {str(node) for node in range(loss.working, loss.agents)}
        survivors = [pid for pid, node in _lines(pids)[before:] if node not in spares]
        result = Recovery(after_kill(starts), after_kill(steps), len(survivors))
        open(os.path.join(job.out, "stop"), "w").close()
        if result.resumed is not None and not job.wait(60):
            return Recovery(error=f"the survivors did not exit cleanly: ...{job.tail()}")
        return result


@contextlib.contextmanager
def etcd_endpoint(wanted: bool) -> Iterator[str | None]:
    """An etcd server of this figure's own (v3 API only), or None if not wanted or installed."""
    if not wanted:
        yield None
        return
    sys.path.insert(0, REPO)
    from tests.support.etcd_server import EtcdServer, etcd_binary  # the tests' fixture

    binary = etcd_binary()
    if binary is None:
        yield None
        return
    server = EtcdServer(binary)
    server.start()
    try:
        yield server.endpoint
    finally:
        server.stop()


def rendezvous(suite: Suite) -> list[Table]:
    """Figure 8: forming a job of N agents, and recovering from a lost one, per launcher."""
    profile, echo = suite.profile, suite.echo
    launchers = [LAUNCHERS[key] for key in profile.rendezvous_launchers]
    formed: dict[tuple[str, int], list[float]] = {}
    recovered: dict[str, list[Recovery]] = {}
    errors: list[str] = []

    def failed(what: str, error: str) -> None:
        errors.append(f"{what}: {error}")
        suite.fatal_failures += 1
        echo(f"  [rendezvous] {what}: FAILED, {error[:300]}")

    with etcd_endpoint(any(x in launchers for x in ETCD_LAUNCHERS)) as etcd:
        usable = [x for x in launchers if x not in ETCD_LAUNCHERS or etcd is not None]

        def endpoint(launcher: Launcher) -> str:
            return etcd if launcher in ETCD_LAUNCHERS and etcd else f"127.0.0.1:{free_port()}"

        for _ in range(profile.repeat):
            for agents in profile.rendezvous_agents:
                for launcher in (x for x in usable if x.forms):
                    what = f"{launcher.label}, {agents} agents form"
                    outcome = form(launcher, agents, endpoint(launcher),
                                   min(profile.timeout_s, FORMING_WITHIN_S))
                    if isinstance(outcome, str):
                        failed(what, outcome)
                    else:
                        formed.setdefault((launcher.key, agents), []).append(outcome)
                        echo(f"  [rendezvous] {what}: {outcome:.2f} s")
            for launcher in usable if profile.rendezvous_recovery else []:
                what = f"{launcher.label}, recovery"
                times = recover(launcher, endpoint(launcher), profile.timeout_s)
                if times.error:
                    failed(what, times.error)
                    continue
                recovered.setdefault(launcher.key, []).append(times)
                echo(f"  [rendezvous] {what}: worker restarted {times.restarted}, "
                     f"training resumed {times.resumed}")
    tables = [_forming_table(profile.rendezvous_agents, launchers, usable, formed)]
    if profile.rendezvous_recovery:
        tables.append(_recovery_table(usable, recovered))
    for table in tables:
        table.notes += [f"FAILED {error}" for error in errors]
    return tables


def _forming_table(agents: tuple[int, ...], launchers: list[Launcher], usable: list[Launcher],
                   formed: dict[tuple[str, int], list[float]]) -> Table:
    table = Table("Figure 8a: forming a job -- N agents started at once → every worker "
                  "started (s)", ["launcher, backend", *[f"{n} agents" for n in agents]])
    for launcher in (x for x in launchers if x.forms):
        if launcher not in usable:
            table.add(launcher.label, *["not available here (no etcd binary)"] * len(agents))
            continue
        table.add(launcher.label,
                  *[Summary.of(formed.get((launcher.key, n), [])).fmt(2) for n in agents])
    table.notes += [
        "One agent per node, all on this machine, 1 worker each (bench/rdzv_worker.py "
        "stamp, started with --no-python by every launcher); `--nnodes N`, so no last call.",
        "Includes N agents' Python start-up competing for the same cores (alike for every "
        "row); the differences between rows are the rendezvous.",
        f"elastic-train rows use `--rdzv-conf {FORMING_CONF}` (torch's heartbeat): with our "
        "1 s default, 16 agents on this 2-core machine under load never formed -- starved "
        "agents missed 3 heartbeats and were dropped, again and again. On an oversubscribed "
        "machine raise keep_alive_interval.",
    ]
    return table


def _recovery_table(usable: list[Launcher], recovered: dict[str, list[Recovery]]) -> Table:
    table = Table("Figure 8b: recovery -- 1 of 3 agents SIGKILLed with its worker → the "
                  "survivors' worker restarted, and their first all-reduce (s)",
                  ["launcher, backend", "worker restarted", "training resumed",
                   "new worker processes", "rendezvous settings", "target (ours)"])
    for launcher in usable:
        runs = recovered.get(launcher.key, [])
        resumed = Summary.of([r.resumed for r in runs])
        cell = resumed.fmt(2)
        if len(resumed.values) < len(runs):
            cell += f" ({len(runs) - len(resumed.values)} of {len(runs)}: not within " \
                    f"{RECOVERY_WITHIN_S:.0f} s)"
        verdict = "" if launcher.key.startswith("torchrun") else \
            f"{OUR_RECOVERY_TARGET.describe()} s " \
            f"{OUR_RECOVERY_TARGET.verdict(resumed.median if resumed.ok else None)}"
        table.add(launcher.label, Summary.of([r.restarted for r in runs]).fmt(2), cell,
                  Summary.of([r.new_processes for r in runs]).fmt(0), launcher.settings,
                  verdict)
    table.notes += [
        "`--nnodes 2:3`; workers all-reduce a flag every 50 ms (gloo) and notice the lost "
        "peer in that collective; the killed agent is never the c10d store's host.",
        "'worker restarted': the survivors' new rank-0 process started (detection, stopping "
        "the failed group, rendezvous); 'training resumed': its first all-reduce, after "
        "the worker's start-up (torchrun: a new interpreter importing torch; elastic-train: "
        "a fork of its zygote) and the gloo group's set-up on this machine.",
        "@restart_in_process rows: the worker's main is wrapped; 'worker restarted' is the "
        "start of rank 0's next attempt in its own process, after the agents' wait for the "
        "lost node (--unwind-timeout + 5 s, 10 + 5 by default) and their rendezvous. 'new "
        "worker processes': started on the surviving nodes after the kill.",
        "torch's default agent store is shared by every round: a restarted group can hang in "
        "init_process_group on the previous round's keys (the issue's trap); "
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 avoids it, as elastic-train launch does.",
    ]
    return table
