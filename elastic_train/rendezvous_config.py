"""How the nodes of one job find each other: torchrun's ``--rdzv-*`` settings as a dataclass.

Used by ``ScalingConfig(rendezvous=...)`` (the Python API) and by
``elastic-train launch`` alike, so both get the same backends, aliases,
recovery-oriented defaults and checks (see :mod:`.rendezvous_backends`).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from dataclasses import dataclass

from elastic_train._internal.platforms import derived_settings
from elastic_train._internal.redaction import public_options
from elastic_train._internal.rendezvous_backends import DEFAULT, lookup
from elastic_train.errors import ConfigError

LOOPBACK = "127.0.0.1"  # where a one-node job's store and workers meet
LOCAL_ENDPOINT = f"{LOOPBACK}:0"  # a store of one node's own, on a free port


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


def check_endpoint(endpoint: str, source: str) -> None:
    """``HOST:PORT`` with a port in 0..65535 (torch would fail later with a traceback).

    An empty endpoint, a bare host and IPv6 forms are left to torch's parser."""
    if endpoint.count(":") != 1:
        return
    host, port = endpoint.split(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{source}={endpoint!r} is invalid: use HOST:PORT with a port from "
                          "0 to 65535, e.g. node0:29400.", field=source)


@dataclass
class RendezvousConfig:
    """Where the nodes of a multi-node job meet (torchrun's ``--rdzv-*`` flags).

    Every node runs the same driver script; each one's ``fit()`` runs an agent
    that joins this rendezvous, and together they form one job. Ray Train has
    no equivalent (its cluster is found through ``ray.init``).

    Args:
        backend: ``"c10d"`` (default, nothing to install; the first node to
            bind ``endpoint`` hosts the store and must outlive the job),
            ``"etcd"`` (our handler on etcd's v3 API: survives the loss of any
            node, forms hundreds of nodes in seconds; ``pip install
            elastic-train[etcd]``), ``"etcd-v3"`` (torch's dynamic rendezvous
            over etcd's v3 API, for jobs started with it) or ``"static"``
            (a fixed set of nodes: ``endpoint`` is the master's ``host:port``
            and ``conf={"rank": N}`` this node's rank).
            torchrun: ``--rdzv-backend``; env ``PET_RDZV_BACKEND``.
        endpoint: ``host:port`` of the c10d store, of etcd, or of the static master.
            torchrun: ``--rdzv-endpoint``; env ``PET_RDZV_ENDPOINT``.
        run_id: The job's id, the same on every node and unique per job.
            torchrun: ``--rdzv-id``; env ``PET_RDZV_ID``.
        conf: Backend settings, e.g. ``{"last_call_timeout": 5}`` or etcd's
            ``protocol``/``ca_cert``/``username``/``password``; our
            fast-recovery defaults (a 2 s last call; for c10d and etcd-v3 also
            1 s heartbeats, a node lost after 3 missed ones) fill in what is
            not given. Each key must be one the backend takes (a ConfigError names
            the closest one otherwise), its value parsed by the key's rule
            (:meth:`~elastic_train._internal.rendezvous_backends.Backend.check_conf`).
            torchrun: ``--rdzv-conf k=v,...``; env ``PET_RDZV_CONF``.

    A field left ``None`` is read from its ``PET_*`` environment variable (what
    torchrun and e.g. Kubeflow's PyTorchJob set), else from the platform (inside a
    Slurm allocation: c10d on the first host of the node list, the job id as the
    run id; see :mod:`elastic_train._internal.platforms`), else gets its default.

    Example::

        RendezvousConfig(backend="etcd", endpoint="etcd-host:2379", run_id="job42")
    """

    backend: str | None = None
    endpoint: str | None = None
    run_id: str | None = None
    conf: dict[str, object] | None = None

    def __post_init__(self) -> None:
        self._from_environment()
        backend = lookup(self.backend, "RendezvousConfig.backend")
        self.backend = backend.name
        if not isinstance(self.conf, dict):
            raise ConfigError(f"RendezvousConfig.conf={self.conf!r} must be a dict such as "
                              "{'last_call_timeout': 5}.", field="RendezvousConfig.conf")
        if self.endpoint:
            check_endpoint(self.endpoint, "RendezvousConfig.endpoint")
        self.conf = {**backend.defaults, **backend.check_conf(self.conf, "RendezvousConfig.conf")}
        if not backend.elastic and "rank" not in self.conf:
            raise ConfigError(
                f"RendezvousConfig(backend={self.backend!r}) needs this node's rank: pass "
                "conf={'rank': N} (elastic-train launch's --node-rank), or use an elastic "
                "backend, 'c10d' or 'etcd', which ranks the nodes itself.",
                field="RendezvousConfig.conf")

    def _from_environment(self) -> None:
        """Fields left None: torchrun's ``PET_RDZV_*``, then what the platform implies
        (inside Slurm: c10d on the allocation's first host, the job id; see
        :mod:`elastic_train._internal.platforms`), as ``elastic-train launch`` reads them."""
        env = os.environ
        platform = derived_settings(env) \
            if None in (self.backend, self.endpoint, self.run_id) else {}

        def read(variable: str, key: str) -> str | None:
            return env.get(variable) or (platform[key].value if key in platform else None)

        self.backend = self.backend or read("PET_RDZV_BACKEND", "rdzv_backend") or DEFAULT
        # The platform's endpoint is a node's store; another backend needs one given.
        backend = lookup(self.backend, "RendezvousConfig.backend")
        platform_store = backend.endpoint_is_node_store
        self.endpoint = self.endpoint or (read("PET_RDZV_ENDPOINT", "rdzv_endpoint")
                                          if platform_store else env.get("PET_RDZV_ENDPOINT"))
        self.run_id = self.run_id or read("PET_RDZV_ID", "rdzv_id")
        if self.conf is None:
            self.conf = backend.check_conf(  # named by its variable
                parse_rdzv_conf(env.get("PET_RDZV_CONF", ""), "PET_RDZV_CONF"), "PET_RDZV_CONF")

    @classmethod
    def single_node(cls, name: str, conf: dict[str, object] | None = None,
                    source: str = "RendezvousConfig.conf") -> RendezvousConfig:
        """A job on this node alone: a c10d store of its own on a free local port, under a
        fresh run id (``PET_RDZV_*`` are not read: they describe a multi-node job), with
        the ``conf`` given (``launch --standalone --rdzv-conf``, as torchrun keeps it),
        checked as c10d's and named by ``source``."""
        return cls(backend=DEFAULT, endpoint=LOCAL_ENDPOINT,
                   run_id=f"{name}-{uuid.uuid4().hex[:8]}",
                   conf=lookup(DEFAULT, source).check_conf(conf or {}, source))

    @property
    def is_local(self) -> bool:
        """Whether this is a store of this node's own on a free local port (as
        :meth:`single_node` makes): no other node can join it."""
        return self.endpoint == LOCAL_ENDPOINT

    @property
    def is_elastic(self) -> bool:
        """Whether nodes may join and leave (every backend but ``static``)."""
        return lookup(self.backend, "RendezvousConfig.backend").elastic

    def without_secrets(self) -> RendezvousConfig:
        """A copy without secret ``conf`` entries such as ``password`` (never stored; the
        rule is :mod:`elastic_train._internal.redaction`'s)."""
        return dataclasses.replace(self, conf=public_options(self.conf or {}))

    def missing_for_multi_node(self) -> list[str]:
        """The fields a job across nodes still needs: an endpoint, and a run id shared by
        every node (a static job's nodes are told their ranks instead)."""
        needed = ["endpoint", "run_id"] if self.is_elastic else ["endpoint"]
        return [name for name in needed if not getattr(self, name)]

    def check_multi_node(self, nodes: str) -> None:
        """A job of ``nodes`` (a description) needs :meth:`missing_for_multi_node`; else a
        ConfigError phrased for the Python API."""
        examples = {"endpoint": ("'host0:29400'", "--rdzv-endpoint"),
                    "run_id": ("'job42'", "--rdzv-id")}
        for name in self.missing_for_multi_node():
            example, flag = examples[name]
            raise ConfigError(
                f"{nodes} spans more than one node, so every node's driver must join one "
                f"rendezvous: set RendezvousConfig({name}={example}) (torchrun's {flag}, "
                f"env PET_{flag[2:].replace('-', '_').upper()}), the same on every node.",
                field=f"RendezvousConfig.{name}")
