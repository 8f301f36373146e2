"""The rendezvous backends we offer, in one table: names, aliases, defaults, factories.

Both front-ends (``ScalingConfig(rendezvous=RendezvousConfig(...))`` and
``elastic-train launch --rdzv-backend``) look a backend up here, and the agent
registers our own handlers into torch's registry from it
(:mod:`elastic_train.agent.rendezvous.registry`), so nothing else
branches on a backend's name: code that needs to know how a backend behaves
reads its traits (where its state lives, whether its endpoint is a node's
store, ...). Adding a backend is a module with a ``create_handler(params)``
and one :class:`Backend` line below.

Example::

    backend = lookup("etcd", "--rdzv-backend")   # Backend(name="etcd-v3", ...)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from elastic_train.errors import ConfigError

# Recovery-oriented defaults for torch's dynamic rendezvous (torch's: 5 s keep-alive x 3
# and a 30 s last call, so survivors wait ~45 s for a dead node). ``conf`` overrides them.
FAST_DEFAULTS: dict[str, object] = {"keep_alive_interval": 1, "keep_alive_max_attempt": 3,
                                    "last_call_timeout": 2, "join_timeout": 600}
# Our etcd handler never waits for a lost node's heartbeats to expire before the
# survivors form the next round, so it keeps torch's heartbeat (5 s x 3): a node is
# dropped after 15 s without a refresh, not after 3 s of a starved CPU.
NATIVE_DEFAULTS: dict[str, object] = {"last_call_timeout": 2, "join_timeout": 600}


class StateHome(str, enum.Enum):
    """Where a backend keeps the job's rendezvous state (and so, how a corrupt state is
    cleared: a node store starts anew with the nodes, etcd keeps the run's keys)."""

    NODE_STORE = "a TCP store on one of the job's nodes"
    ETCD = "etcd"


@dataclass(frozen=True)
class Backend:
    """One rendezvous backend.

    Attributes:
        name: Its name in torch's handler registry (what the agent asks for).
        aliases: Other names users may give for it.
        factory: ``"module:function"`` creating its ``RendezvousHandler`` from
            torch's ``RendezvousParameters``, registered by :func:`register`;
            ``None`` for torch's own backends. ``c10d`` is torch's handler and
            store, with its state checked before torch unpickles it
            (:mod:`.torch_state`).
        elastic: Whether nodes may come and go; ``static`` is a fixed set of
            nodes ranked by the user.
        defaults: Settings filled in where ``conf`` gives none.
        reuses_store: Whether torch's agent hands the workers one store for every
            round (torch's dynamic rendezvous): a restarted gloo group of a
            launched script, joining through ``env://``, could then read the dead
            group's addresses, so ``launch`` asks torch for a fresh one.
        state: Where the rendezvous state lives (:class:`StateHome`).
        endpoint_is_node_store: Whether the endpoint is a TCP store that the first
            node to bind it hosts (c10d): a platform's first host (Slurm's) can serve
            as the endpoint, and that node's loss is the rendezvous's loss.
        store_per_round: Whether the store the handler gives the agents is prefixed by
            the round (dynamic rendezvous); the static one is shared by every round.
        extra: The pip extra it needs, named in errors.
        summary: How it is described in errors and help texts.
    """

    name: str
    aliases: tuple[str, ...] = ()
    factory: str | None = None
    elastic: bool = True
    defaults: dict[str, object] = field(default_factory=dict)
    reuses_store: bool = False
    state: StateHome = StateHome.NODE_STORE
    endpoint_is_node_store: bool = False
    store_per_round: bool = True
    extra: str | None = None
    summary: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


BACKENDS: tuple[Backend, ...] = (
    Backend("c10d", defaults=FAST_DEFAULTS, reuses_store=True, endpoint_is_node_store=True,
            factory="elastic_train.agent.rendezvous.torch_state:create_c10d_handler",
            summary="c10d (default; torch's TCP store on the first node)"),
    Backend("etcd", extra="etcd", defaults=NATIVE_DEFAULTS, state=StateHome.ETCD,
            factory="elastic_train.agent.rendezvous.etcd_native:create_handler",
            summary="etcd (our handler on etcd's v3 API: survives the loss of any node, "
                    "forms hundreds of nodes in seconds)"),
    Backend("etcd-v3", extra="etcd", defaults=FAST_DEFAULTS, reuses_store=True,
            state=StateHome.ETCD,
            factory="elastic_train.agent.rendezvous.etcd_handler:create_etcd_v3_handler",
            summary="etcd-v3 (torch's dynamic rendezvous over etcd's v3 API, for jobs "
                    "started with it, and plain torchrun's name for us)"),
    Backend("static", elastic=False, store_per_round=False,
            summary="static (a fixed set of nodes; --node-rank, --master-addr/--master-port)"),
)
DEFAULT = "c10d"  # ScalingConfig's and a platform's (Slurm, Kubeflow) backend
TORCHRUN_DEFAULT = "static"  # torchrun's --rdzv-backend, which launch keeps


def lookup(name: str, source: str) -> Backend:
    """The backend called ``name`` (or an alias of it); a ConfigError naming ``source``
    (the flag, field or variable it came from) and the choices otherwise."""
    for backend in BACKENDS:
        if name in backend.names:
            return backend
    choices = "; ".join(b.summary for b in BACKENDS)
    raise ConfigError(f"{source}={name!r} is not supported: use {choices}.", field=source)
