"""How the nodes of one job find each other: torchrun's ``--rdzv-*`` settings as a dataclass.

Used by ``ScalingConfig(rendezvous=...)`` (the Python API) and by
``elastic-train launch`` alike, so both get the same backends, aliases and
recovery-oriented defaults.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from elastic_train.errors import ConfigError

# Recovery-oriented defaults (torch's: 5 s keep-alive x 3 and a 30 s last call, so
# survivors wait ~45 s for a dead node). Any of them can be overridden in ``conf``.
FAST_RDZV_DEFAULTS: dict[str, object] = {"keep_alive_interval": 1, "keep_alive_max_attempt": 3,
                                         "last_call_timeout": 2, "join_timeout": 600}
# Our etcd handler does not wait for a lost node's heartbeats to expire before the
# survivors form the next round, so it keeps torch's heartbeat (5 s x 3): a node is
# dropped only after 15 s without a refresh, not 3 s of a starved CPU.
NATIVE_RDZV_DEFAULTS: dict[str, object] = {"last_call_timeout": 2, "join_timeout": 600}


def fast_defaults(backend: str) -> dict[str, object]:
    """The recovery-oriented defaults for ``backend`` (a canonical name)."""
    return NATIVE_RDZV_DEFAULTS if backend == "etcd" else FAST_RDZV_DEFAULTS
BACKEND_ALIASES = {"etcd-v3": "etcd-v3", "etcd": "etcd"}
ETCD_BACKENDS = ("etcd", "etcd-v3")


def parse_rdzv_conf(value: str, source: str = "--rdzv-conf") -> dict[str, object]:
    """``"k1=v1,k2=v2"`` -> dict, numbers converted; ``source`` names the flag or variable."""
    conf: dict[str, object] = {}
    for item in filter(None, value.split(",")):
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{source} item {item!r} is invalid: use key=value pairs "
                              "separated by commas, e.g. join_timeout=60,timeout=30.")
        try:
            conf[key] = int(raw)
        except ValueError:
            try:
                conf[key] = float(raw)
            except ValueError:
                conf[key] = raw
    return conf


@dataclass
class RendezvousConfig:
    """Where the nodes of a multi-node job meet (torchrun's ``--rdzv-*`` flags).

    Every node runs the same driver script; each one's ``fit()`` runs an agent
    that joins this rendezvous, and together they form one job. Ray Train has
    no equivalent (its cluster is found through ``ray.init``).

    Args:
        backend: ``"c10d"`` (default, nothing to install; the first node to
            bind ``endpoint`` hosts the store and must outlive the job) or
            ``"etcd"`` (our handler on etcd's v3 API: survives the loss of any
            node, forms hundreds of nodes in seconds; ``pip install
            elastic-train[etcd]``) or ``"etcd-v3"`` (torch's dynamic rendezvous
            over etcd's v3 API, for jobs started with it).
            torchrun: ``--rdzv-backend``; env ``PET_RDZV_BACKEND``.
        endpoint: ``host:port`` of the c10d store or of etcd.
            torchrun: ``--rdzv-endpoint``; env ``PET_RDZV_ENDPOINT``.
        run_id: The job's id, the same on every node and unique per job.
            torchrun: ``--rdzv-id``; env ``PET_RDZV_ID``.
        conf: Backend settings, e.g. ``{"last_call_timeout": 5}`` or etcd's
            ``protocol``/``ca_cert``/``username``/``password``; our
            fast-recovery defaults (a 2 s last call; for c10d and etcd-v3 also
            1 s heartbeats, a node lost after 3 missed ones) fill in what is
            not given.
            torchrun: ``--rdzv-conf k=v,...``; env ``PET_RDZV_CONF``.

    A field left ``None`` is read from its ``PET_*`` environment variable (what
    torchrun and e.g. Kubeflow's PyTorchJob set), else gets its default.

    Example::

        RendezvousConfig(backend="etcd", endpoint="etcd-host:2379", run_id="job42")
    """

    backend: str | None = None
    endpoint: str | None = None
    run_id: str | None = None
    conf: dict[str, object] | None = None

    def __post_init__(self) -> None:
        env = os.environ
        backend = self.backend or env.get("PET_RDZV_BACKEND") or "c10d"
        self.backend = BACKEND_ALIASES.get(backend, backend)
        if self.backend not in ("c10d", *ETCD_BACKENDS):
            raise ConfigError(
                f"RendezvousConfig.backend={backend!r} is not supported: use 'c10d' (default), "
                "'etcd' or 'etcd-v3'; the static backend is elastic-train launch's "
                "(--rdzv-backend static).")
        self.endpoint = self.endpoint or env.get("PET_RDZV_ENDPOINT") or None
        self.run_id = self.run_id or env.get("PET_RDZV_ID") or None
        if self.conf is None:
            self.conf = parse_rdzv_conf(env.get("PET_RDZV_CONF", ""), "PET_RDZV_CONF")
        if not isinstance(self.conf, dict):
            raise ConfigError(f"RendezvousConfig.conf={self.conf!r} must be a dict such as "
                              "{'last_call_timeout': 5}.")
        self.conf = {**fast_defaults(self.backend), **self.conf}

    def without_secrets(self) -> RendezvousConfig:
        """A copy without ``conf["password"]`` (never stored)."""
        conf = {k: v for k, v in (self.conf or {}).items() if k != "password"}
        return dataclasses.replace(self, conf=conf)

    def check_multi_node(self, nodes: str) -> None:
        """A job of ``nodes`` (a description) needs an endpoint and a run id; else a ConfigError."""
        for name, flag, example in (("endpoint", "--rdzv-endpoint", "'host0:29400'"),
                                    ("run_id", "--rdzv-id", "'job42'")):
            if not getattr(self, name):
                raise ConfigError(
                    f"{nodes} spans more than one node, so every node's driver must join one "
                    f"rendezvous: set RendezvousConfig({name}={example}) (torchrun's {flag}, "
                    f"env PET_{flag[2:].replace('-', '_').upper()}), the same on every node.")
