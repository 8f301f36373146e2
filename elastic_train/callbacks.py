"""Driver-side callbacks: ``RunConfig(callbacks=[...])``, in Ray Train v2's shape.

The driver watches the run directory while the workers train and calls
``after_report`` for every row rank 0 reports (``metrics`` is a one-element
list: rank 0's row; Ray passes one dict per worker), in order, with its
checkpoint once that checkpoint is committed (as in Ray Train), and
``after_exception`` when the run fails. A row holds the user's metrics and the
fields the project adds (:data:`elastic_train._internal.metric_rows.AUTO_FIELDS`), among them
each report's step time and straggler score (``step_time_s``, ``slowest_rank``,
``slowest_rank_score``, ``slowest_node``; see :mod:`elastic_train.stragglers`).
Built in: :class:`CSVLoggerCallback` (``progress.csv``) and
:class:`TensorBoardLoggerCallback` (``tensorboard/``), both in the run directory.

Example::

    class PrintLoss(elastic_train.UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            print("loss", metrics[0]["loss"])

    RunConfig(callbacks=[PrintLoss(), CSVLoggerCallback()])
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from elastic_train._internal.metric_rows import plotted
from elastic_train.checkpoint import Checkpoint
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.run_state import PROGRESS_FILE, TENSORBOARD_DIR

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunContext:
    """What a callback knows about the run.

    ``train_loop_config`` is the trainer's (Ray v2's ``TrainRunContext`` has it
    too); None for runs of ``elastic-train launch``, which have none.
    """

    run_name: str
    storage: RunStorage
    train_loop_config: dict[str, Any] | None = None

    @property
    def run_path(self) -> str:
        return self.storage.display_path


class UserCallback:
    """Base class of callbacks; override the hooks you need."""

    def after_report(self, run_context: RunContext, metrics: list[dict[str, Any]],
                     checkpoint: Checkpoint | None) -> None:
        """After each report of rank 0 (``metrics[0]``), with its checkpoint if any.

        The checkpoint is handed over only once it is committed -- complete and
        visible in the run directory -- so a callback may copy or log it at once.
        With ASYNC uploads (our default) that is when the upload ends, so this call
        comes later than the ``report()``, and the reports after it wait with it. A
        checkpoint that never became visible (its upload was cut short by a failure)
        comes as None, with its metrics.
        """

    def after_exception(self, run_context: RunContext,
                        worker_exceptions: dict[int, Exception]) -> None:
        """When the run fails: the exceptions of the failed workers, by rank."""

    def after_run(self, run_context: RunContext) -> None:
        """When the run ends, however it ends (flush and upload files here)."""


class CSVLoggerCallback(UserCallback):
    """Writes the run's whole history to ``<run>/progress.csv`` (one column per metric).

    Rewritten from ``metrics.jsonl`` at most every ``every_s`` seconds while the
    run goes on and once at its end, so it is readable during training and a
    resumed run's file holds each iteration once.
    """

    FILE = PROGRESS_FILE

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self._written = -math.inf

    def after_report(self, run_context: RunContext, metrics: list[dict[str, Any]],
                     checkpoint: Checkpoint | None) -> None:
        if time.monotonic() - self._written >= self.every_s:
            self._write(run_context)

    def after_run(self, run_context: RunContext) -> None:
        self._write(run_context)

    def _write(self, run_context: RunContext) -> None:
        self._written = time.monotonic()
        storage = run_context.storage
        rows = storage.read_metrics()
        if not rows:
            return
        columns = list(dict.fromkeys(k for row in rows for k in row))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
        fsutil.write_bytes_atomic(storage.fs, fsutil.join(storage.run_path, self.FILE),
                                  text.getvalue().encode())


class TensorBoardLoggerCallback(UserCallback):
    """Writes numeric metrics as TensorBoard scalars to ``<run>/tensorboard/``.

    Needs the ``tensorboard`` package (``pip install elastic-train[tensorboard]``).
    The step is ``training_iteration``. For remote storage the event file is
    written locally and uploaded when the run ends.
    """

    DIR = TENSORBOARD_DIR

    def __init__(self) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError("TensorBoardLoggerCallback needs tensorboard: pip install "
                              "tensorboard (or elastic-train[tensorboard]).") from exc
        self._writer_class = SummaryWriter
        self._writer: Any = None
        self._local_dir: str | None = None

    def _writer_for(self, storage: RunStorage) -> Any:
        if self._writer is None:
            if storage.is_local:
                self._local_dir = fsutil.join(storage.run_path, self.DIR)
            else:
                self._local_dir = tempfile.mkdtemp(prefix="elastic_train_tb_")
            self._writer = self._writer_class(log_dir=self._local_dir)
        return self._writer

    def after_report(self, run_context: RunContext, metrics: list[dict[str, Any]],
                     checkpoint: Checkpoint | None) -> None:
        row = metrics[0]
        writer = self._writer_for(run_context.storage)
        step = int(row.get("training_iteration", 0))
        for key, value in plotted(row).items():
            writer.add_scalar(key, value, global_step=step)
        writer.flush()

    def after_run(self, run_context: RunContext) -> None:
        if self._writer is None:
            return
        self._writer.close()
        storage = run_context.storage
        if not storage.is_local:
            target = fsutil.join(storage.run_path, self.DIR)
            for name in os.listdir(self._local_dir):
                storage.fs.put_file(os.path.join(self._local_dir, name),
                                    fsutil.join(target, name))
            shutil.rmtree(self._local_dir, ignore_errors=True)
        self._writer = None
