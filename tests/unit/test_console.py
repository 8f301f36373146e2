"""Console output: rank prefixes, partial lines, filters, and no replay of earlier launches."""

from __future__ import annotations

import io
import os

from elastic_train.driver.console import Console, ConsoleView, LogTail


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


def test_a_worker_that_takes_another_rank_in_process_gets_its_new_prefix(tmp_path):
    """After an in-process re-form the worker writes on into the same log file under
    another rank (before: the prefix was fixed when the file was first seen)."""
    out = io.StringIO()
    node = {"rank": 1}
    tail = LogTail(str(tmp_path), Console(out), lambda r: f"[node{node['rank']} rank{r}]: ")
    path = _log(tmp_path, "run_a", 0, 0, "stdout", "before\n")
    tail.poll()
    node["rank"] = 0  # the node's group rank in the new world
    with open(path, "a") as f:
        f.write("after\n")
    tail.poll()
    assert out.getvalue() == "[node1 rank0]: before\n[node0 rank0]: after\n"


def test_a_restore_does_not_replay_earlier_launches(tmp_path):
    """fit() again / elastic-train restore reuse the run's log directory."""
    _log(tmp_path, "run_first", 0, 0, "stdout", "old line\n")
    tail, out = _tail(tmp_path)
    _log(tmp_path, "run_second", 0, 0, "stdout", "new line\n")
    tail.poll(final=True)
    assert out.getvalue() == "[rank0]: new line\n"


def test_rank_and_stream_filters(tmp_path):
    view = ConsoleView(local_ranks=frozenset({1}), streams_by_rank={1: frozenset({"stderr"})})
    tail, out = _tail(tmp_path, view=view)
    _log(tmp_path, "s", 0, 0, "stderr", "rank zero\n")
    _log(tmp_path, "s", 0, 1, "stdout", "to stdout\n")
    _log(tmp_path, "s", 0, 1, "stderr", "to stderr")
    tail.poll(final=True)
    assert out.getvalue() == "[rank1]: to stderr\n"


def test_status_line_counts_checkpoints_still_uploading(tmp_path):
    from elastic_train.callbacks import RunContext
    from elastic_train.driver.run_monitor import RunMonitor
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


def test_a_node_that_stays_slow_is_named_on_the_console_and_shown_in_the_status(tmp_path):
    from elastic_train.callbacks import RunContext
    from elastic_train.driver.run_monitor import RunMonitor
    from elastic_train.storage import RunStorage
    from elastic_train.stragglers import StragglerConfig, step_fields

    storage = RunStorage.open(str(tmp_path / "results"), "run")
    storage.ensure_writable()
    storage.write_metrics([{"training_iteration": i, **step_fields([0.1, 0.3], [0, 1])}
                           for i in (1, 2, 3)])
    named, out = [], io.StringIO()
    monitor = RunMonitor(RunContext("run", storage), [], str(tmp_path / "logs"),
                         stream=out, stragglers=StragglerConfig(window=3),
                         on_straggler=named.append)
    monitor._poll_metrics()
    assert [(s.node, s.rank, s.since_iteration) for s in named] == [(1, 1, 1)]
    assert "straggler: node 1 (rank 1) steps 3.0x slower" in out.getvalue()
    assert "slowest rank 1 3.0x" in monitor.status_line()


def test_the_named_node_knows_it_is_the_straggler_until_its_round_ends(tmp_path):
    """``slow_here``: what the supervisor asks to request a replacement. On node 1 only,
    while the slow reports go on; a rendezvous renumbers the nodes: the watch starts over."""
    from elastic_train.callbacks import RunContext
    from elastic_train.driver.run_monitor import RunMonitor
    from elastic_train.storage import RunStorage
    from elastic_train.stragglers import StragglerConfig, step_fields

    storage = RunStorage.open(str(tmp_path / "results"), "run")
    storage.ensure_writable()
    storage.write_metrics([{"training_iteration": i, **step_fields([0.1, 0.3], [0, 1])}
                           for i in (1, 2)])

    def monitor_on(group_rank: int) -> RunMonitor:
        monitor = RunMonitor(RunContext("run", storage), [], str(tmp_path / "logs"),
                             stream=io.StringIO(), stragglers=StragglerConfig(window=2))
        monitor.note_rendezvous(group_rank, 2)
        monitor._poll_metrics()
        return monitor

    assert monitor_on(0).slow_here is None
    here = monitor_on(1)
    assert here.slow_here is not None and here.slow_here.node == 1
    here.note_rendezvous(1, 2)  # the same round's numbers: it stands
    assert here.slow_here is not None
    here.note_rendezvous(0, 2)  # another round: node 1 is someone else now
    assert here.slow_here is None
    steady = monitor_on(1)
    storage.write_metrics([{"training_iteration": 3, **step_fields([0.1, 0.1], [0, 1])}])
    steady._poll_metrics()
    assert steady.slow_here is None  # no longer slow: not asked to leave


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_progress_bar_shows_live_with_its_prefix_off_a_terminal(tmp_path):
    """tqdm redraws its line with \\r: the console prints its latest state at once, then
    at most every progress_every_s, and the finished line when the newline comes."""
    clock, out = _Clock(), io.StringIO()
    tail = LogTail(str(tmp_path), Console(out, progress_every_s=10, clock=clock),
                   lambda r: f"[rank{r}]: ")
    path = _log(tmp_path, "s", 0, 0, "stderr", "\rtrain:  10%|#   | 1/10")
    tail.poll()
    assert out.getvalue() == "[rank0]: train:  10%|#   | 1/10\n"
    with open(path, "a") as f:
        f.write("\rtrain:  20%|##  | 2/10")
    clock.now = 5
    tail.poll()  # too soon for another line
    assert out.getvalue().count("\n") == 1
    with open(path, "a") as f:
        f.write("\rtrain:  30%|### | 3/10")
    clock.now = 11
    tail.poll()
    assert out.getvalue().endswith("[rank0]: train:  30%|### | 3/10\n")
    with open(path, "a") as f:
        f.write("\rtrain: 100%|####| 10/10\nnext line\n")
    tail.poll()
    assert out.getvalue().endswith("[rank0]: train: 100%|####| 10/10\n[rank0]: next line\n")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_progress_bars_stay_above_the_status_line(tmp_path):
    out = _Terminal()
    console = Console(out)
    tail = LogTail(str(tmp_path), console, lambda r: f"[rank{r}]: ")
    console.status("[elastic-train] run | 3s")
    _log(tmp_path, "s", 0, 0, "stderr", "\rbar 1/2")
    _log(tmp_path, "s", 0, 1, "stderr", "\rbar 1/2")
    tail.poll()
    assert out.getvalue().endswith(
        "[rank0]: bar 1/2\n[rank1]: bar 1/2\n[elastic-train] run | 3s")
    out.truncate(0)
    out.seek(0)
    console.lines(["[rank0]: hello"])
    # the three live rows are cleared (cursor up twice), the line printed, the rows redrawn
    assert out.getvalue() == ("\r\033[K" + "\033[A\033[K" * 2 + "[rank0]: hello\n"
                              "[rank0]: bar 1/2\n[rank1]: bar 1/2\n[elastic-train] run | 3s")


def test_per_rank_streams_and_the_prefix_template(tmp_path):
    view = ConsoleView(streams_by_rank={0: frozenset({"stdout"}), 1: frozenset()},
                       prefix_template="${role_name}/${rank}: ", role="trainer")
    tail, out = _tail(tmp_path, view=view)
    tail.prefix = lambda r: view.prefix(r + 4, r)
    _log(tmp_path, "s", 0, 0, "stdout", "zero out\n")
    _log(tmp_path, "s", 0, 0, "stderr", "zero err\n")
    _log(tmp_path, "s", 0, 1, "stdout", "one out\n")
    _log(tmp_path, "s", 0, 2, "stderr", "two err\n")
    tail.poll(final=True)
    assert out.getvalue() == "trainer/4: zero out\ntrainer/6: two err\n"
