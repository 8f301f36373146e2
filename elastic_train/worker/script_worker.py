"""A worker of ``elastic-train launch``: runs the user's script as ``__main__``.

``python -m elastic_train.worker.script_worker [-m] TARGET [ARGS...]``. The script
gets exactly torchrun's environment; if it calls ``elastic_train.report``,
``get_checkpoint`` or ``get_context``, the session is built on that first call
from the node's worker plan (:mod:`.worker_plan`); the ranks agree
on the checkpoint to resume from at the first ``report``/``get_checkpoint``
(collective, after the script has initialised its process group; ``get_context``
alone is not), and pending checkpoint uploads are waited for when the script ends.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
from typing import Any

import torch
import torch.distributed as dist

from elastic_train.config import RunConfig, ScalingConfig
from elastic_train.context import WorkerEnv
from elastic_train.torch.config import TorchConfig
from elastic_train.worker.backend import WorkerResources
from elastic_train.worker.lifecycle import run_worker
from elastic_train.worker.run_spec import RunSpec
from elastic_train.worker.session import TrainSession, current_session, set_session_factory
from elastic_train.worker.storage_access import open_run_storage
from elastic_train.worker.worker_plan import GivenStorage, WorkerPlan


class _ScriptSession(TrainSession):
    """A launched script's session: built by the first session call of any one rank,
    it joins the others (through the script's process group, or a gloo group beside
    it) at the first call that needs their agreement (see :meth:`TrainSession.join`)."""

    def _control_group(self) -> Any:
        if self.env.world_size > 1 and not dist.is_initialized():
            raise RuntimeError(
                "Call torch.distributed.init_process_group() before the first "
                "elastic_train.report()/get_checkpoint()/get_preemption_info() in a launched "
                "script: the ranks agree on the checkpoint to resume from through the "
                "process group.")
        if not dist.is_initialized():
            return None
        return dist.group.WORLD if dist.get_backend() == "gloo" \
            else dist.new_group(backend="gloo")


def _script_session(plan: WorkerPlan, given: GivenStorage) -> TrainSession:
    env = WorkerEnv.from_environ()
    # is_initialized() only: is_available() would poison the script's own forks
    # (DataLoader workers) when it has not touched CUDA.
    device = torch.device("cuda", torch.cuda.current_device()) \
        if torch.cuda.is_initialized() else torch.device("cpu")
    run_config = RunConfig(storage_path=given.path, name=plan.run_name,
                           storage_options=given.options,
                           checkpoint_config=plan.checkpoint_config)
    spec = RunSpec(train_loop_per_worker=None, train_loop_config=None, backend=TorchConfig(),
                   scaling_config=ScalingConfig(num_workers=env.local_world_size),
                   run_config=run_config, experiment_name=plan.run_name)
    session = _ScriptSession(spec, env, WorkerResources([device], None),
                             open_run_storage(run_config, plan.run_name),
                             plan.staging_dir, join=False)
    atexit.register(session.finish)  # also when the script calls sys.exit()
    return session


def run_script(argv: list[str]) -> None:
    plan, given = WorkerPlan.load(), GivenStorage.load()
    if plan is not None and given is not None:  # started by `elastic-train launch`
        set_session_factory(lambda: _script_session(plan, given))
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    session = current_session()
    if session is not None:
        session.finish()  # an upload error fails this worker


def main(argv: list[str]) -> None:
    run_worker(lambda: run_script(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
