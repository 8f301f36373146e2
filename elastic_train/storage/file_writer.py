"""A separate process that writes staged state into single files with ``torch.save``.

The training process hands it a state already copied into shared memory (see
:mod:`elastic_train.torch.async_save`): only the shared blocks' handles cross the pipe,
and the pickling, serialising and writing happen in the writer, which holds no GIL
the training needs. One request is written at a time; the writer dies with the
process that started it (:mod:`.parent_watch`).

Example::

    writer = FileWriterProcess()
    done = writer.write(staged_state, "/tmp/ckpt/model.pt")   # a concurrent Future
    done.result()                                             # the file is complete
    writer.close()
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.multiprocessing as mp

from elastic_train.storage import background_priority


class FileWriterProcess:
    """A writer process, started at the first :meth:`write` (a new interpreter, spawned,
    so nothing of the training process -- CUDA, threads, locks -- is inherited)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="file-writer")
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Any = None

    def write(self, state: Any, path: str) -> Future:
        """Writes ``state`` to ``path`` (``torch.save``) in the writer process; the future
        completes when the file is complete, or raises the writer's error."""
        return self._executor.submit(self._write, state, path)

    def close(self) -> None:
        """Kills the writer (a write in flight fails) and waits for it to end."""
        with self._lock:
            if self._process is not None:
                self._process.kill()
                self._process.join()
                self._conn.close()
        self._executor.shutdown(wait=True)

    def _start(self) -> None:
        context = mp.get_context("spawn")
        self._conn, child_end = context.Pipe()
        self._process = context.Process(target=_serve, args=(child_end, os.getpid()),
                                        name="checkpoint-file-writer", daemon=True)
        self._process.start()
        child_end.close()  # recv() then fails at once when the writer dies

    def _write(self, state: Any, path: str) -> None:
        with self._lock:
            if self._process is None:
                self._start()
            conn, process = self._conn, self._process
        try:
            conn.send((path, state))
            answer = conn.recv()
        except (EOFError, OSError) as exc:
            process.join(timeout=5)
            raise RuntimeError(f"the checkpoint writer process (pid {process.pid}) ended "
                               f"while writing {path} (exit code {process.exitcode})") from exc
        if answer is not None:
            raise RuntimeError(f"writing {path}: {answer}")


def _serve(conn: Any, owner_pid: int) -> None:  # pragma: no cover -- the writer process
    """The writer: one ``(path, state)`` request at a time, answered with None or the
    error's text (an exception may not pickle); ends when its owner ends or closes the
    pipe."""
    background_priority.settle_writer(owner_pid)
    while True:
        try:
            path, state = conn.recv()
        except EOFError:
            return
        try:
            torch.save(state, path)
            answer = None
        except Exception as exc:  # noqa: BLE001 -- it is the answer
            answer = f"{type(exc).__name__}: {exc}"
        del state
        conn.send(answer)
