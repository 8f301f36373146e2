"""A worker started again in its slot (an in-process restart) is started as torch started
the first: same command, and under ``--numa-binding`` the same NUMA binding."""

from __future__ import annotations

import sys

import pytest
from torch.distributed.elastic.agent.server.api import Worker
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std, start_processes
from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler
from torch.numa.binding import AffinityMode, NumaOptions

from elastic_train.agent.worker_slots import replace_worker

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_leaked_processes")]

_SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def numa_wrapping(monkeypatch):
    """torch's wrapping of a worker's command with ``numactl``, recorded: the binding
    itself needs an accelerator and numactl, which a test machine may lack."""
    calls = []

    def wrap(command_args, *, numa_options=None, **where):
        calls.append((numa_options, where))
        if numa_options is None:
            return command_args
        # numactl stand-in: a command that runs the rest, marked by the binding it got.
        return ("/usr/bin/env", f"FAKE_NUMA_BIND={numa_options.affinity_mode.value}",
                *command_args)

    monkeypatch.setattr(subprocess_handler, "_maybe_wrap_command_args_with_numa_binding", wrap)
    return calls


def test_a_replaced_worker_keeps_the_numa_binding(numa_wrapping, tmp_path):
    options = NumaOptions(affinity_mode=AffinityMode.NODE)
    pcontext = start_processes(
        name="trainer", entrypoint=sys.executable,
        args={0: ("-c", _SLEEP), 1: ("-c", _SLEEP)}, envs={0: {}, 1: {}},
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)), numa_options=options)
    try:
        first = pcontext.subprocess_handlers[1].proc.args
        assert first[:2] == ("/usr/bin/env", "FAKE_NUMA_BIND=node")
        worker = Worker(local_rank=1, global_rank=1, role_rank=1, world_size=2,
                        role_world_size=2)
        replace_worker(pcontext, worker, sys.executable, ("-c", _SLEEP), {})
        again = pcontext.subprocess_handlers[1].proc.args
        assert tuple(again) == tuple(first)
        assert numa_wrapping[-1] == numa_wrapping[1]  # same options, same device
    finally:
        pcontext.close()


def test_a_replaced_worker_appends_to_its_slots_log(tmp_path):
    pcontext = start_processes(
        name="trainer", entrypoint=sys.executable,
        args={0: ("-c", "print('first', flush=True)")}, envs={0: {}},
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path), redirects=Std.ALL))
    try:
        pcontext.subprocess_handlers[0].proc.wait(30)
        worker = Worker(local_rank=0, global_rank=0, role_rank=0, world_size=1,
                        role_world_size=1)
        replace_worker(pcontext, worker, sys.executable, ("-c", "print('second')"), {})
        pcontext.subprocess_handlers[0].proc.wait(30)
        with open(pcontext.stdouts[0]) as f:
            assert f.read().split() == ["first", "second"]
    finally:
        pcontext.close()
