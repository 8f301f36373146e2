"""Console output: rank prefixes, partial lines, filters, and no replay of earlier launches."""

from __future__ import annotations

import io
import os

from elastic_train.driver.console import Console, LogTail


def _log(root, session: str, attempt: int, local_rank: int, stream: str, text: str) -> str:
    directory = os.path.join(root, session, f"attempt_{attempt}", str(local_rank))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{stream}.log")
    with open(path, "a") as f:
        f.write(text)
    return path


def _tail(root, **kwargs) -> tuple[LogTail, io.StringIO]:
    out = io.StringIO()
    return LogTail(str(root), Console(out), lambda r: f"[rank{r}]: ", **kwargs), out


def test_new_lines_get_prefixes_and_partial_lines_wait(tmp_path):
    tail, out = _tail(tmp_path)
    path = _log(tmp_path, "run_a", 0, 1, "stdout", "hello\nwor")
    tail.poll()
    assert out.getvalue() == "[rank1]: hello\n"
    with open(path, "a") as f:
        f.write("ld\n")
    tail.poll()
    assert out.getvalue() == "[rank1]: hello\n[rank1]: world\n"


def test_a_restore_does_not_replay_earlier_launches(tmp_path):
    """fit() again / elastic-train restore reuse the run's log directory."""
    _log(tmp_path, "run_first", 0, 0, "stdout", "old line\n")
    tail, out = _tail(tmp_path)
    _log(tmp_path, "run_second", 0, 0, "stdout", "new line\n")
    tail.poll(final=True)
    assert out.getvalue() == "[rank0]: new line\n"


def test_rank_and_stream_filters(tmp_path):
    tail, out = _tail(tmp_path, local_ranks={1}, streams=frozenset({"stderr"}))
    _log(tmp_path, "s", 0, 0, "stderr", "rank zero\n")
    _log(tmp_path, "s", 0, 1, "stdout", "to stdout\n")
    _log(tmp_path, "s", 0, 1, "stderr", "to stderr")
    tail.poll(final=True)
    assert out.getvalue() == "[rank1]: to stderr\n"


def test_status_line_counts_checkpoints_still_uploading(tmp_path):
    from elastic_train.callbacks import RunContext
    from elastic_train.driver.progress import RunMonitor
    from elastic_train.storage import RunStorage
    from elastic_train.storage.checkpoint_store import MARKER

    storage = RunStorage.open(str(tmp_path / "results"), "run")
    storage.ensure_writable()
    storage.write_metrics([{"training_iteration": i, "loss": 1.0 / i,
                            "checkpoint_dir_name": f"checkpoint_{i - 1:06d}"}
                           for i in (1, 2, 3)])
    committed = tmp_path / "results" / "run" / "checkpoint_000000"
    committed.mkdir()
    (committed / MARKER).write_text("{}")
    monitor = RunMonitor(RunContext("run", storage), [], str(tmp_path / "logs"),
                         stream=io.StringIO())
    monitor._poll_metrics()
    line = monitor.status_line()
    assert "iter 3" in line and "uploading 2" in line
    (tmp_path / "results" / "run" / "checkpoint_000002").mkdir()
    (tmp_path / "results" / "run" / "checkpoint_000002" / MARKER).write_text("{}")
    monitor._poll_metrics()
    assert "uploading" not in monitor.status_line()
