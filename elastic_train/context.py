"""What a worker knows about itself: ``get_context()`` returns a :class:`TrainContext`.

The values come from the environment torch.distributed.elastic gives every
worker (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK``, ...), the
same variables torchrun sets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastic_train._internal import env_vars


@dataclass(frozen=True)
class WorkerEnv:
    """The worker's place in the job, read from the elastic agent's environment."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    restart_count: int
    use_agent_store: bool
    generation: str

    @classmethod
    def from_environ(cls, env: Mapping[str, str] = os.environ) -> WorkerEnv:
        return cls(
            rank=int(env["RANK"]),
            local_rank=int(env["LOCAL_RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_world_size=int(env["LOCAL_WORLD_SIZE"]),
            node_rank=int(env.get("GROUP_RANK", 0)),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
            use_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            generation=_generation(env),
        )


def _generation(env: Mapping[str, str]) -> str:
    """The incarnation of the process group this worker joins: the agents' generation id,
    and the in-process attempt after a restart inside the same processes."""
    facts = env_vars.AgentFacts.from_environ(env)
    base = facts.generation
    if base is None:
        base = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return base if facts.attempt == 0 else f"{base}.{facts.attempt}"


@dataclass(frozen=True)
class StorageInfo:
    """Where the run is stored (the fields of Ray's ``StorageContext`` that users read)."""

    storage_path: str
    experiment_dir_name: str
    experiment_fs_path: str
    storage_filesystem: Any

    def build_checkpoint_path_from_name(self, checkpoint_name: str) -> str:
        """``<experiment_fs_path>/<checkpoint_name>``: where a checkpoint of that name lives
        in the run (Ray's ``StorageContext`` method; e.g. for ``NO_UPLOAD`` checkpoints
        written into the run directory)."""
        return f"{self.experiment_fs_path.rstrip('/')}/{checkpoint_name}"


@dataclass(frozen=True)
class TrainContext:
    """Mirrors ``ray.train.get_context()``'s ``TrainContext``.

    Example::

        ctx = elastic_train.get_context()
        if ctx.get_world_rank() == 0:
            print("training on", ctx.get_world_size(), "workers")
    """

    env: WorkerEnv
    experiment_name: str
    storage: StorageInfo
    metadata: Mapping[str, Any]

    def get_world_rank(self) -> int:
        return self.env.rank

    def get_local_rank(self) -> int:
        return self.env.local_rank

    def get_world_size(self) -> int:
        return self.env.world_size

    def get_local_world_size(self) -> int:
        return self.env.local_world_size

    def get_node_rank(self) -> int:
        return self.env.node_rank

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_storage(self) -> StorageInfo:
        return self.storage

    def get_metadata(self) -> dict[str, Any]:
        """The ``metadata`` passed to the trainer."""
        return dict(self.metadata)

    # Ray Tune's, removed from Train's context in Ray Train v2: they raise, as there.
    def get_trial_name(self) -> str:
        raise _tune_only("get_trial_name", "get_experiment_name() (the run's name)")

    def get_trial_id(self) -> str:
        raise _tune_only("get_trial_id", "get_experiment_name() (the run's name)")

    def get_trial_dir(self) -> str:
        raise _tune_only("get_trial_dir", "get_storage().experiment_fs_path (the run's "
                                          "directory)")

    def get_trial_resources(self) -> Any:
        raise _tune_only("get_trial_resources", "elastic_train.torch.get_devices() (this "
                                                "worker's devices)")


def _tune_only(name: str, instead: str) -> DeprecationWarning:
    return DeprecationWarning(f"TrainContext.{name}() belongs to Ray Tune and was removed "
                              f"from Ray Train v2's context; use {instead}.")
