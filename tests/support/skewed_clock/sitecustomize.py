"""A node whose clock disagrees with the others' (the chaos kind ``clock_skew``).

On ``PYTHONPATH``, Python imports this module at the start of every interpreter:
with ``ET_TEST_NODE_CLOCK_SKEW_S`` set, ``time.time()`` and ``time.time_ns()`` of
that process -- and of every process it forks (the agent's zygote, the workers
forked from it) -- run so many seconds ahead (behind, if negative) of the real
clock. With ``ET_TEST_NODE_CLOCK_DIR`` set, each such process (and each fork)
writes ``<dir>/<pid>`` holding its skewed ``time.time()``: the file's
modification time, set by the kernel, is the real clock, so the test can tell
which processes ran skewed and by how much.

What it cannot show (we cannot move the real clock without root): the monotonic
clocks (``time.monotonic``, ``perf_counter``), timestamps the kernel sets (file
modification times, socket timeouts), C and C++ code that reads the clock itself
(torch's stores and gloo, ``datetime.now()``, ``time.strftime()`` without a time),
and other programs (etcd's lease TTLs) all keep the real time. The product reads
wall time through ``time.time()`` (``time.strftime()`` only for default run names,
``datetime`` only to print times).

Standard library only, and quick: it runs in every process of the node, the
zygote's few-millisecond clients included.
"""

import os
import time

_SKEW_S = float(os.environ.get("ET_TEST_NODE_CLOCK_SKEW_S", "0") or 0)


def _record() -> None:
    directory = os.environ.get("ET_TEST_NODE_CLOCK_DIR")
    if not directory:
        return
    try:
        with open(os.path.join(directory, str(os.getpid())), "w") as f:
            f.write(repr(time.time()))
    except OSError:  # the trial's directory is gone: nothing to tell
        pass


if _SKEW_S:
    _real_time, _real_time_ns = time.time, time.time_ns
    _skew_ns = int(_SKEW_S * 1e9)
    time.time = lambda: _real_time() + _SKEW_S
    time.time_ns = lambda: _real_time_ns() + _skew_ns
    _record()
    os.register_at_fork(after_in_child=_record)
