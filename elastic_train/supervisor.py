"""Runs this node's agent for a run, for ``fit()`` and ``elastic-train launch`` alike.

:class:`RunSupervisor` wires the agent's events to the run's record
(``run.json``: failures, final status) and to the live view and callbacks
(:class:`~elastic_train.progress.RunMonitor`), and uploads the workers' logs
to remote storage when the run ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from elastic_train.agent import AgentSpec, Interrupted, run_agent
from elastic_train.callbacks import RunContext, UserCallback
from elastic_train.errors import RendezvousLostError, WorkerFailure
from elastic_train.progress import RunMonitor
from elastic_train.run_record import RunRecord
from elastic_train.storage import RunStorage

logger = logging.getLogger(__name__)


class RunSupervisor:
    """One node's run of the agent, recorded and shown.

    ``record`` is the run's :class:`RunRecord` when this process owns
    ``run.json`` from the start (``fit()``); ``begin_record`` creates it at the
    first rendezvous that makes this node group rank 0 (``launch``).
    """

    def __init__(self, storage: RunStorage, name: str, unlimited_restarts: bool, *,
                 record: RunRecord | None = None,
                 begin_record: Callable[[], RunRecord] | None = None,
                 callbacks: list[UserCallback] | None = None, verbose: int = 1,
                 local_ranks: set[int] | None = None,
                 streams: frozenset[str] = frozenset({"stdout", "stderr"}),
                 train_loop_config: dict | None = None):
        self.storage = storage
        self.train_loop_config = train_loop_config
        self.record = record
        self.begin_record = begin_record
        self.unlimited = unlimited_restarts
        self.callbacks = list(callbacks or [])
        self.verbose = verbose
        self.local_ranks = local_ranks
        self.streams = streams
        self.name = name
        self.preempted_out = False

    def run(self, spec: AgentSpec) -> list[WorkerFailure]:
        """Runs the agent; returns the final failures. Raises ``Interrupted`` on a signal.

        ``preempted_out`` tells afterwards whether the preemption budget ran out.
        """
        context = RunContext(self.name, self.storage, self.train_loop_config)
        monitor = RunMonitor(context, self.callbacks, spec.log_dir,
                             verbose=self.verbose, local_ranks=self.local_ranks,
                             streams=self.streams,
                             nproc_per_node=spec.nproc_per_node)

        def on_rendezvous(group_rank: int, nodes: int) -> None:
            monitor.note_rendezvous(group_rank, nodes)
            if group_rank == 0 and self.record is None and self.begin_record is not None:
                self.record = self.begin_record()
            elif self.record is not None:
                self.record.note_rendezvous()

        def on_failure(failures: list[WorkerFailure], restarts_left: int, kind: str) -> None:
            # The agent tells the budget before torch takes this restart off it.
            monitor.note_failure(failures, restarting=restarts_left > 0)
            if self.record is not None:
                self.record.record_failure(failures, max(restarts_left - 1, 0),
                                           self.unlimited, kind)

        monitor.start()
        try:
            failures, self.preempted_out = run_agent(spec, on_failure=on_failure,
                                                     on_rendezvous=on_rendezvous)
        except Interrupted:
            self._set_status("interrupted")
            raise
        except RendezvousLostError as exc:
            self._set_status("failed", error=str(exc))
            raise
        except BaseException:
            self._set_status("failed", error="The driver stopped unexpectedly.")
            raise
        finally:
            monitor.stop()
            self._upload_logs(spec.log_dir)
        return failures

    def _set_status(self, status: str, **extra: object) -> None:
        if self.record is not None:
            self.record.set_status(status, **extra)

    def _upload_logs(self, log_dir: str | None) -> None:
        if log_dir and not self.storage.is_local:
            try:
                self.storage.upload_logs(log_dir)
            except Exception:
                logger.warning("Could not upload the logs in %s to %s.", log_dir,
                               self.storage.display_path, exc_info=True)
