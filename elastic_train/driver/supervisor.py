"""Runs this node's agent for a run and wires its events to the record and the live view.

:class:`RunSupervisor` wires the agent's events to the run's record
(``run.json``: failures, nodes that left, final status) and to the live view and
callbacks (:class:`~elastic_train.driver.run_monitor.RunMonitor`), records this
node's own departure where every node's admission reads it
(:mod:`elastic_train._internal.departures`), feeds the run's metric exporters when it has
any (:mod:`elastic_train.driver.node_metrics`), and uploads the workers' logs to remote storage
when the run ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from elastic_train._internal.departures import Departure
from elastic_train._internal.redaction import redact_url
from elastic_train.agent import node_policy
from elastic_train.agent.api import (
    AgentEvents,
    AgentOutcome,
    AgentSpec,
    Interrupted,
    run_agent,
    sends_nodes_away,
)
from elastic_train.agent.inprocess.restarts import Recovery
from elastic_train.agent.no_progress_guard import Progress
from elastic_train.agent.node_liveness import answers
from elastic_train.agent.node_policy import NodeVerdict
from elastic_train.agent.restart_budget import Decision
from elastic_train.agent.zygote import server as zygote
from elastic_train.callbacks import RunContext, UserCallback
from elastic_train.driver.console import ConsoleView
from elastic_train.driver.metrics_feed import MetricsFeed
from elastic_train.driver.node_metrics import NodeMetrics
from elastic_train.driver.run_monitor import RunMonitor
from elastic_train.driver.run_record import RunRecord
from elastic_train.errors import NodeLeftError, RendezvousLostError, StorageError, WorkerFailure
from elastic_train.goodput.breakdown import breakdown
from elastic_train.rendezvous_config import LOCAL_ENDPOINT, RendezvousConfig
from elastic_train.storage import RunStorage
from elastic_train.storage.run_state import LaunchRecord, RunStatus
from elastic_train.stragglers import Straggler, StragglerConfig

logger = logging.getLogger(__name__)

RECORDER_ANSWER_S = 2.0  # a recording driver's beacon that does not answer within this is gone


@dataclass(frozen=True)
class _Heard:
    """The group's latest change this node's agent saw while another node recorded the
    run: a failure (its workers, the budget's decision, the root cause elsewhere), or
    with ``decision`` None a node waiting to join."""

    known_at: float  # when the agent knew (time.time())
    failures: list[WorkerFailure] = field(default_factory=list)
    decision: Decision | None = None
    cause: WorkerFailure | None = None


class RunSupervisor:
    """One node's run of the agent, recorded and shown.

    One driver records a launch, whatever the group ranks of later rounds (with etcd, group
    rank 0 goes to the first node of a round: after a failure, often not the recording
    one). ``begin_record`` creates the run's :class:`RunRecord` at the first rendezvous
    that makes this node group rank 0 (on a single node: the first) while no other
    driver records the launch: the launch record in ``run.json`` names the recording
    driver's beacon (``LaunchRecord.recorder``), and a driver still there answers it.
    ``record`` is None on the other nodes. A node that becomes group rank 0 later takes
    the record over only once that driver is gone (:meth:`_take_over`;
    ``begin_record``'s argument says which of the two it is), and as the job's group
    rank 0 at its end, when the recorder left without ending the launch
    (:meth:`take_over_if_orphaned`).
    ``check_lease`` runs at every rendezvous, before a group starts: it raises when
    the run was taken over.
    """

    def __init__(self, storage: RunStorage, name: str, *,
                 begin_record: Callable[[bool], RunRecord],
                 check_lease: Callable[[], None] | None = None,
                 callbacks: list[UserCallback] | None = None, verbose: int = 1,
                 view: ConsoleView | None = None, train_loop_config: dict | None = None,
                 stragglers: StragglerConfig | None = None,
                 metrics: NodeMetrics | None = None):
        self.storage = storage
        self.record: RunRecord | None = None
        self.train_loop_config = train_loop_config
        self.begin_record = begin_record
        self.check_lease = check_lease
        self.callbacks = list(callbacks or [])
        self.verbose = verbose
        self.view = view
        self.name = name
        self.stragglers = stragglers
        self.metrics = metrics
        self.departures_kept = False  # whether the job sends nodes away (set by run)
        self._monitor: RunMonitor | None = None
        self._formed = False  # a group with this node formed before (see _take_over)
        self._group_rank: int | None = None  # this node's in the latest round
        self._heard: _Heard | None = None  # the group's latest change, while another records

    def run(self, spec: AgentSpec) -> AgentOutcome:
        """Runs the agent; returns how it ended. Raises ``Interrupted`` on a signal."""
        context = RunContext(self.name, self.storage, self.train_loop_config)
        monitor = self._monitor = RunMonitor(
            context, self.callbacks, spec.log_dir, verbose=self.verbose, view=self.view,
            nproc_per_node=spec.nproc_per_node, stragglers=self.stragglers,
            on_straggler=self._note_straggler, waiting_for=_server(spec.rendezvous),
            feed=MetricsFeed(self.metrics, self.storage) if self.metrics else None)
        events = self._agent_events(spec, monitor)
        # Only a job that sends nodes away keeps departures: the others never look for any.
        self.departures_kept = sends_nodes_away(spec, events)
        monitor.start()
        try:
            outcome = run_agent(spec, events)
        except Interrupted:
            self._set_status(RunStatus.INTERRUPTED)
            raise
        except RendezvousLostError as exc:
            self._set_status(RunStatus.FAILED, error=str(exc))
            raise
        except BaseException:
            self._set_status(RunStatus.FAILED, error="The driver stopped unexpectedly.")
            raise
        finally:
            self._note_zygote_errors()
            monitor.stop()
            self._upload_logs(spec.log_dir)
        if outcome.left is not None and outcome.left.cool_off_s > 0:
            self._record_departure(outcome.left)
        self._note_departures()
        return outcome

    def _agent_events(self, spec: AgentSpec, monitor: RunMonitor) -> AgentEvents:
        """The agent's events, wired to the live view, the record and the metrics."""

        def on_rendezvous(group_rank: int, nodes: int) -> None:
            if self.check_lease is not None:
                self.check_lease()
            monitor.note_rendezvous(group_rank, nodes)
            if self.metrics is not None:
                self.metrics.note_rendezvous(nodes * spec.nproc_per_node)
            if group_rank == 0 and self.record is None:
                self._claim_record()
            elif self.record is not None:
                self.record.note_rendezvous()
            self._formed, self._heard = True, None  # what was heard: this round's only
            self._group_rank = group_rank
            self._note_zygote_errors()
            self._note_departures()

        def on_failure(failures: list[WorkerFailure], decision: Decision,
                       cause: WorkerFailure | None = None) -> None:
            self._note_zygote_errors()
            monitor.note_failure(failures, restarting=decision.restart)
            if self.metrics is not None:
                self.metrics.note_failure(decision.kind.value, decision.restart,
                                          min((f.timestamp for f in failures), default=None))
            if self.record is not None:
                self.record.record_failure(failures, decision, cause)
            else:
                self._heard = _Heard(time.time(), failures, decision, cause)

        def on_recovered(recovery: Recovery) -> None:
            monitor.note_recovered()
            if self.metrics is not None:
                self.metrics.note_recovered()
            if self.record is not None:
                self.record.note_recovery(recovery.replaced)
            self._heard = None  # recovered in process: the recording node saw it too

        def on_join() -> None:
            if self.record is not None:
                self.record.note_join()
            else:
                self._heard = _Heard(time.time())

        return AgentEvents(
            on_failure=on_failure, on_rendezvous=on_rendezvous, on_recovered=on_recovered,
            on_join=on_join,
            progress=lambda: read_progress(self.storage),
            leave_request=self._leave_request if self._replaces_stragglers else None)

    def _claim_record(self) -> None:
        """As group rank 0, not recording: records the run (begins the launch, or takes
        its record over) unless the driver that records the latest launch is still there."""
        launch = self._running_launch()
        if launch is not None and answers(launch.recorder, RECORDER_ANSWER_S):
            logger.info("Group rank 0 here; the run is recorded by the driver on %s (pid %d).",
                        launch.host, launch.pid)
            return
        self.record = self._take_over() if self._formed else self.begin_record(False)

    def take_over_if_orphaned(self) -> None:
        """At this node's end, as the last round's group rank 0 and not recording: takes
        the record over when the launch is still running and its recording driver is gone
        -- it left the job while this node's last rendezvous still heard its beacon --
        so that someone ends the launch."""
        if self.record is not None or self._group_rank != 0:
            return
        try:
            launch = self._running_launch()
            if launch is None or answers(launch.recorder, RECORDER_ANSWER_S):
                return
            # A driver that ended its launch wrote so before its beacon closed: read again.
            again = self._running_launch()
        except StorageError as exc:
            logger.warning("Could not read whether the run's recording driver ended it: %s",
                           exc)
            return
        if again is not None and again.recorder == launch.recorder:
            self.record = self._take_over()

    def _running_launch(self) -> LaunchRecord | None:
        """The run's latest launch, when it is still running and names its recording
        driver's beacon (a job of one node has none: nobody else could record it)."""
        state = self.storage.read_run_state()
        launch = state.launches[-1] if state is not None and state.launches else None
        if launch is None or launch.status is not RunStatus.RUNNING or not launch.recorder:
            return None
        return launch

    def _take_over(self) -> RunRecord:
        """This node became group rank 0 after the node that recorded the run was lost:
        it records the run from here on, starting with what it saw of the loss (the
        failure or the join it heard of, and the group formed again), so the run's record
        and its goodput ledger account for that time as detection and rendezvous. A
        failure the lost node recorded before it went (still open in ``run.json``) is
        not recorded twice: only its rendezvous is closed. With nothing heard, the time
        since rank 0's last ledger line stays unaccounted (``other``)."""
        record = self.begin_record(True)
        heard = self._heard
        if heard is None:
            return record
        if heard.decision is None:
            record.note_join(heard.known_at)
        elif not record.failure_open:
            record.record_failure(heard.failures, heard.decision, heard.cause,
                                  known_at=heard.known_at)
        record.note_rendezvous()
        return record

    def say_goodput(self) -> None:
        """The run's last console line, on the node that records it: ETTR and the time
        lost by cause, from the run's goodput ledger (:mod:`elastic_train.goodput.breakdown`)."""
        if self.record is None or self._monitor is None or not self.verbose:
            return
        try:
            goodput = breakdown(self.storage.read_ledger())
        except StorageError as exc:
            logger.warning("Could not read the goodput ledger: %s", exc)
            return
        self._monitor.console.lines([f"[elastic-train] goodput of {self.name}: "
                                     f"{goodput.describe()}"])

    def _record_departure(self, left: NodeLeftError) -> None:
        """This node left with a cooling-off period: recorded in the run directory, where
        every admission reads it (see :mod:`elastic_train._internal.departures`)."""
        departure = Departure(left.node, left.reason, time.time(), left.cool_off_s)
        try:
            self.storage.write_departure(departure)
        except StorageError:
            logger.warning("Could not record in %s that %s; it may be admitted again before "
                           "its cooling-off period is over.", self.storage.display_path,
                           departure.describe(), exc_info=True)

    def _note_departures(self) -> None:
        """On the node that records the run: the nodes that left since the last look go
        into ``run.json`` and onto the console (which node, why, for how long)."""
        if self.record is None or not self.departures_kept:
            return
        try:
            departures = self.storage.read_departures()
        except StorageError:
            logger.warning("Could not read which nodes left the job", exc_info=True)
            return
        for departure in self.record.note_departures(departures):
            logger.warning("%s.", departure.describe())

    def _note_zygote_errors(self) -> None:
        """Records in ``run.json`` the worker zygotes that failed to start since the last
        look (on the node that records the run; the others log them only)."""
        if self.record is not None:
            self.record.note_zygote_errors([e.to_json() for e in zygote.take_start_errors()])

    @property
    def _replaces_stragglers(self) -> bool:
        return self.stragglers is not None and self.stragglers.replace

    def _note_straggler(self, straggler: Straggler) -> None:
        """Records a node named slow in ``run.json`` (on the node that records the run);
        on the node named, when stragglers are replaced, says that it will leave."""
        if self.record is not None:
            self.record.note_straggler(straggler)
        if self._replaces_stragglers and self._monitor is not None \
                and self._monitor.slow_here == straggler:
            logger.warning("This node is the straggler: its agent is asked to leave the job "
                           "for a spare.")

    def _leave_request(self) -> NodeVerdict | None:
        """Asked by the agent at each look (replacing stragglers): leave, when this node
        is the straggler named in the run of slow reports still going on."""
        straggler = self._monitor.slow_here if self._monitor is not None else None
        if straggler is None or self.stragglers is None:
            return None
        return node_policy.leave(f"straggler: {straggler.describe()}",
                                 self.stragglers.cool_off_s)

    def _set_status(self, status: RunStatus, error: str | None = None) -> None:
        if self.record is not None:
            self.record.set_status(status, error)

    def _upload_logs(self, log_dir: str | None) -> None:
        if log_dir and not self.storage.is_local:
            try:
                self.storage.upload_logs(log_dir)
            except StorageError as exc:  # it names the operation, the file and the cause
                logger.warning("Could not upload the logs in %s: %s", log_dir, exc)
            except Exception:
                logger.warning("Could not upload the logs in %s to %s.", log_dir,
                               self.storage.display_path, exc_info=True)


def _server(rendezvous: RendezvousConfig) -> str | None:
    """The server a job meets at (etcd, another node's store), which it waits for before
    its first rendezvous -- where nothing listens, until its join timeout; None for a
    node's own store."""
    if rendezvous.endpoint == LOCAL_ENDPOINT:
        return None
    return f"the rendezvous ({rendezvous.backend} at {redact_url(rendezvous.endpoint)})"


def read_progress(storage: RunStorage) -> Progress | None:
    """How far the run is, from its storage: the furthest reported iteration and the newest
    committed checkpoint (None when the storage cannot be read now)."""
    try:
        rows = storage.read_metrics()
        newest, looked = -1, 0
        for row in reversed(rows):
            name = row.get("checkpoint_dir_name")
            if not name:
                continue
            if storage.checkpoints.is_committed(name):
                newest = int(name.rsplit("_", 1)[1])
                break
            looked += 1
            if looked == 3:  # at most two are in flight: older ones were committed or lost
                break
        iteration = max((int(r.get("training_iteration", 0)) for r in rows), default=0)
        return Progress(iteration, newest)
    except Exception:  # noqa: BLE001 -- the guard then counts this failure as neither
        logger.debug("Could not read the run's progress", exc_info=True)
        return None
