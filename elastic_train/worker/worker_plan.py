"""The worker plan: what the node run tells its workers of the run and the node, in one file.

``fit()`` and ``elastic-train launch`` reach their workers the same way: the node run
(:mod:`elastic_train.driver.node_run`) writes one :class:`WorkerPlan` as JSON into
the node's private scratch directory, and passes its path in one variable
(``ELASTIC_TRAIN_PLAN``). A worker reads it with :meth:`WorkerPlan.load` (once per
process) and, as it starts, hands storage its values (:func:`install`). What must
never be written to a file -- the storage URL as given, which may hold a password,
and a launch's storage options -- travels beside it in the worker's environment
(:class:`GivenStorage`, ``ELASTIC_TRAIN_STORAGE``). ``fit()``'s train function and
datasets stay in its pickled ``RunSpec``.

Example (in a worker)::

    plan = WorkerPlan.load()           # None outside a node run's workers
    storage = RunStorage.for_run(run_config, plan.run_name)
    storage.use_fence(plan.lease_token)
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from elastic_train._internal import env_vars
from elastic_train.config import CheckpointConfig
from elastic_train.storage import node_settings
from elastic_train.storage.replica_server import NodeReplica

PLAN_FILE = "worker_plan.json"


@dataclass(frozen=True)
class WorkerPlan:
    """The run's and the node's facts every worker of the node shares.

    Attributes:
        run_name: The run's name (its directory under the storage path).
        checkpoint_config: The run's checkpoint settings.
        staging_dir: Where the workers stage checkpoint files before upload.
        tier_root: The node's local tier (:mod:`elastic_train.storage.local_tier`).
        keep_uploads: Whether uploaded files are kept in the tier
            (``ELASTIC_TRAIN_LOCAL_TIER=0`` in the driver's environment: not).
        storage_retry_s: ``RunConfig.storage_retry_timeout_s``, for what reads
            checkpoints outside the session.
        lease_token: The job's lease token on the run: commits and cleanups are
            refused once a newer job holds it (None: unfenced).
        user_roots: The directories of the user's own code as the driver decided
            them (:mod:`elastic_train.worker.user_code`).
        replica: The node's replica server, its key and certificate
            (:mod:`elastic_train.storage.replica_server`; None: no copies on peers). The
            key is why this file is private (mode 0600).
        world_sizes: Every world size the job may run at (its numbers of nodes, from
            ``--nnodes MIN:MAX`` or ``ScalingConfig(num_workers=(min, max))``, times the
            workers per node), for what must hold at each (a global batch that divides).
    """

    run_name: str
    checkpoint_config: CheckpointConfig
    staging_dir: str
    tier_root: str
    keep_uploads: bool
    storage_retry_s: float
    lease_token: int | None
    user_roots: tuple[str, ...]
    replica: NodeReplica | None = None
    world_sizes: tuple[int, ...] = ()

    def write(self, directory: str) -> dict[str, str]:
        """Writes the plan into ``directory`` (private to the node's driver); returns
        the workers' environment entry that points to it."""
        path = os.path.join(directory, PLAN_FILE)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(asdict(self), f)
        return {env_vars.PLAN: path}

    @classmethod
    def load(cls) -> WorkerPlan | None:
        """This worker's plan, read once per process; None outside a node run's workers."""
        path = os.environ.get(env_vars.PLAN)
        return _read(path) if path else None

    def node_settings(self) -> node_settings.NodeSettings:
        """The values storage takes from the plan (see :mod:`.node_settings`)."""
        return node_settings.NodeSettings(tier_root=self.tier_root,
                                          keep_uploads=self.keep_uploads,
                                          retry_budget_s=self.storage_retry_s,
                                          replica=self.replica)


@functools.cache
def _read(path: str) -> WorkerPlan:
    with open(path) as f:
        fields = json.load(f)
    fields["checkpoint_config"] = CheckpointConfig(**fields["checkpoint_config"])
    fields["user_roots"] = tuple(fields["user_roots"])
    fields["world_sizes"] = tuple(fields.get("world_sizes", ()))
    fields["replica"] = NodeReplica.from_dict(fields["replica"]) if fields.get("replica") \
        else None
    return WorkerPlan(**fields)


def install() -> WorkerPlan | None:
    """At a worker's start: hands storage the plan's values; returns the plan."""
    plan = WorkerPlan.load()
    if plan is not None:
        node_settings.use(plan.node_settings())
    return plan


@dataclass(frozen=True)
class GivenStorage:
    """The run's storage as the user gave it, credentials included: passed in the
    workers' environment, never written (the plan, ``run.json`` and the pickled specs
    hold the URL redacted and no options).

    Attributes:
        path: The storage URL as given (``https://user:pw@host/...`` included).
        options: ``elastic-train launch``'s storage options (``fit()``'s are in its spec).
    """

    path: str
    options: dict[str, Any] | None = None

    def env(self) -> dict[str, str]:
        """The workers' environment entry that carries it."""
        return {env_vars.STORAGE: json.dumps({"path": self.path, "options": self.options})}

    @classmethod
    def load(cls) -> GivenStorage | None:
        """What the node run passed this worker; None when it passed nothing."""
        value = os.environ.get(env_vars.STORAGE)
        return cls(**json.loads(value)) if value else None
