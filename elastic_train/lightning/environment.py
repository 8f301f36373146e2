"""``RayLightningEnvironment``: Lightning's view of the job, read from ``get_context()``."""

from __future__ import annotations

import importlib
from types import ModuleType

from elastic_train.lightning.flavour import LightningBound
from elastic_train.worker.session import get_context


class RayLightningEnvironment(LightningBound):
    """Tells Lightning the worker's ranks and the world size (Ray's name).

    Lightning would otherwise compute them from ``devices`` and ``num_nodes``;
    here the agent decides them, and they can change between restarts of an
    elastic job, so they are read from the session every time.
    """

    @staticmethod
    def _lightning_base(pl: ModuleType) -> type:
        return importlib.import_module(f"{pl.__name__}.plugins.environments").LightningEnvironment

    def world_size(self) -> int:
        return get_context().get_world_size()

    def global_rank(self) -> int:
        return get_context().get_world_rank()

    def local_rank(self) -> int:
        return get_context().get_local_rank()

    def node_rank(self) -> int:
        return get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """Ignored: the world size is the session's."""

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the rank is the session's."""

    def teardown(self) -> None:
        """Leaves the environment alone (Lightning's would delete ``WORLD_SIZE``)."""
