"""Worker failures: descriptions, the user-facing error, and root-cause ranking."""

from types import SimpleNamespace

import pytest

from elastic_train import TrainingFailedError, WorkerFailure
from elastic_train.agent.failures import Cause, failures_of, observe
from elastic_train.worker.lifecycle import EXCEPTION_TYPES, FAILED_AT, FAILED_SEQ

TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 3\nValueError: boom\n'


def worker(rank=1, exitcode=1, traceback=TRACEBACK, message="ValueError: boom", **kwargs):
    return WorkerFailure(rank=rank, local_rank=rank, pid=4242, exitcode=exitcode,
                         message=message, traceback=traceback, **kwargs)


def test_describe_exit_code():
    failure = worker(exitcode=3)
    assert failure.signal_name is None
    assert failure.describe() == "rank 1 (local rank 1, pid 4242) exited with code 3"


def test_describe_sigkill_and_host():
    failure = worker(exitcode=-9, hostname="node7")
    assert failure.signal_name == "SIGKILL"
    assert failure.describe() == "rank 1 (local rank 1, pid 4242 on node7) was killed by SIGKILL"
    assert failure.to_json()["signal"] == "SIGKILL"


def test_a_hung_worker_is_said_to_have_hung_with_the_watchs_verdict():
    verdict = "HangError: rank 1 made no progress for 6s; stuck at train.py:24 train"
    failure = worker(exitcode=-9, hung=True, message=verdict)
    assert failure.describe() == ("rank 1 (local rank 1, pid 4242) hung and was stopped by "
                                  "the hang watch")
    assert WorkerFailure.from_json(failure.to_json()) == failure
    lines = str(TrainingFailedError.from_failures([failure], "/r", 0)).splitlines()
    assert lines[2] == verdict and lines[4] == "Traceback of rank 1:", lines


def test_unknown_signal_number():
    assert worker(exitcode=-200).signal_name == "signal 200"


@pytest.mark.parametrize("max_failures, hint", [
    (0, "FailureConfig(max_failures=N)"),
    (3, "max_failures=3) is spent"),
])
def test_training_failed_message(max_failures, hint):
    failures = [worker(rank=1), worker(rank=0, exitcode=-15, traceback=None)]
    error = TrainingFailedError.from_failures(failures, "/results/run", max_failures)
    text = str(error)
    assert "rank 1" in text and "exited with code 1" in text
    assert "Traceback of rank 1:" in text and "ValueError: boom" in text
    assert "Also failed: rank 0" in text and "SIGTERM" in text
    assert "Run directory: /results/run" in text
    assert "fit() again" in text
    assert hint in text
    assert error.failures == failures and error.run_path == "/results/run"


def test_training_failed_message_without_traceback_shows_message():
    error = TrainingFailedError.from_failures(
        [worker(traceback=None, message="Signal 9 received")], "/r", 0)
    assert "Signal 9 received" in str(error)
    assert "Traceback of" not in str(error)


def process_failure(local_rank, exitcode=1, message="", timestamp=0, traceback=None,
                    error_message=None, failed_at=None, types=None, seq=None):
    """torch's ProcessFailure as the agent reads it; ``failed_at``/``types``/``seq`` as our
    workers record them (elastic_train.worker.lifecycle)."""
    data = {}
    if traceback is not None or error_message is not None:
        extra = {"timestamp": "1"}
        if traceback is not None:
            extra["py_callstack"] = traceback
        if failed_at is not None:
            extra[FAILED_AT] = failed_at
            extra[EXCEPTION_TYPES] = types or ["builtins.RuntimeError", "builtins.Exception"]
        if seq is not None:
            extra[FAILED_SEQ] = seq
        data = {"message": {"message": error_message or "", "extraInfo": extra}}
    return SimpleNamespace(local_rank=local_rank, pid=1000 + local_rank, exitcode=exitcode,
                           message=message, timestamp=timestamp, error_file_data=data)


def ranks(failures):
    return [f.rank for f in failures_of(SimpleNamespace(failures=dict(enumerate(failures))))]


BROKEN = ["torch.distributed.DistBackendError", "torch.distributed.DistError",
          "builtins.RuntimeError"]


def test_broken_collective_ranks_after_root_cause():
    peer = process_failure(0, traceback=TRACEBACK, error_message="DistBackendError: x",
                           failed_at=1.0, types=BROKEN)
    root = process_failure(1, traceback=TRACEBACK, error_message="ValueError: boom",
                           failed_at=2.0)
    assert ranks([peer, root]) == [1, 0]


@pytest.mark.parametrize("words", ["Connection refused", "Connection closed by peer",
                                   "Broken pipe"])
def test_words_of_a_message_do_not_make_a_failure_secondary(words):
    """The first to raise is the root cause, whatever its message says."""
    first = process_failure(0, traceback=TRACEBACK, error_message=f"RuntimeError: {words}",
                            failed_at=1.0, seq=1)
    later = process_failure(1, traceback=TRACEBACK, error_message="ValueError: boom",
                            failed_at=1.5, seq=2)
    assert ranks([first, later]) == [0, 1]
    [observed, _] = observe(SimpleNamespace(failures={0: first, 1: later}))
    assert observed.cause is Cause.RAISED and observed.seq == 1.0


def test_a_worker_that_ended_by_itself_ranks_before_one_that_raised():
    raised = process_failure(0, traceback=TRACEBACK, error_message="RuntimeError: x",
                             failed_at=1.0)
    killed = process_failure(1, exitcode=-9, timestamp=5, message="Signal 9 (SIGKILL)")
    assert ranks([raised, killed]) == [1, 0]
    assert [o.cause for o in observe(SimpleNamespace(failures={0: raised, 1: killed}))] == \
        [Cause.OWN, Cause.RAISED]


def test_a_worker_that_raised_a_config_error_is_told_apart_by_its_class_and_said_so():
    """A ConfigError (or a subclass) is read from the classes the worker recorded, not from
    its words; the error says it was not retried."""
    config = process_failure(0, traceback=TRACEBACK, error_message="RunInUseError: x",
                             failed_at=1.0, types=["elastic_train.errors.RunInUseError",
                                                   "elastic_train.errors.ConfigError",
                                                   "builtins.ValueError"])
    worded = process_failure(1, traceback=TRACEBACK, error_message="ConfigError: x",
                             failed_at=2.0)
    failures = failures_of(SimpleNamespace(failures={0: config, 1: worded}))
    assert [f.config_error for f in failures] == [True, False]
    assert WorkerFailure.from_json(failures[0].to_json()) == failures[0]
    said = str(TrainingFailedError.from_failures(failures, "/r", 3))
    assert "it was not retried" in said and "budget (max_failures=3) is spent" not in said


def test_nccl_watchdog_abort_is_a_broken_collective():
    aborted = process_failure(0, exitcode=-6, timestamp=1, message="Signal 6 (SIGABRT)")
    [observed] = observe(SimpleNamespace(failures={0: aborted}))
    assert observed.cause is Cause.BROKEN and observed.seq == float("inf")


def test_traceback_ranks_before_no_traceback():
    bare = process_failure(0, exitcode=-9, timestamp=1, message="Signal 9 (SIGKILL)")
    with_tb = process_failure(1, timestamp=2, traceback=TRACEBACK, error_message="boom")
    assert ranks([bare, with_tb]) == [1, 0]


def test_ties_rank_by_timestamp_then_rank():
    a, b, c = (process_failure(i, timestamp=t, traceback=TRACEBACK) for i, t in
               enumerate([3, 1, 1]))
    assert ranks([a, b, c]) == [1, 2, 0]


def test_failures_of_fields():
    [failure] = failures_of(SimpleNamespace(failures={
        3: process_failure(1, exitcode=1, timestamp=1, traceback=TRACEBACK,
                           error_message="ValueError: boom", message="ignored"),
    }))
    assert (failure.rank, failure.local_rank, failure.pid, failure.exitcode) == (3, 1, 1001, 1)
    assert failure.message == "ValueError: boom"
    assert failure.traceback == TRACEBACK
    [bare] = failures_of(SimpleNamespace(failures={0: process_failure(0, -9, "Signal 9")}))
    assert bare.message == "Signal 9" and bare.traceback is None
    assert bare.signal_name == "SIGKILL"
