"""The rendezvous backends we offer, in one table: names, aliases, defaults, factories.

Both front-ends (``ScalingConfig(rendezvous=RendezvousConfig(...))`` and
``elastic-train launch --rdzv-backend``) look a backend up here, check its ``conf``
(``--rdzv-conf``) against the keys it takes (:meth:`Backend.check_conf`: an unknown key
is refused with the closest known one, each value parsed by its key's rule), and the agent
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

import difflib
import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_train._internal.setting_values import count, seconds, switch, whole_seconds
from elastic_train.errors import ConfigError

# Recovery-oriented defaults for torch's dynamic rendezvous (torch's: 5 s keep-alive x 3
# and a 30 s last call, so survivors wait ~45 s for a dead node). ``conf`` overrides them.
FAST_DEFAULTS: dict[str, object] = {"keep_alive_interval": 1, "keep_alive_max_attempt": 3,
                                    "last_call_timeout": 2, "join_timeout": 600}
# Our etcd handler never waits for a lost node's heartbeats to expire before the
# survivors form the next round, so it keeps torch's heartbeat (5 s x 3): a node is
# dropped after 15 s without a refresh, not after 3 s of a starved CPU.
NATIVE_DEFAULTS: dict[str, object] = {"last_call_timeout": 2, "join_timeout": 600}


Parse = Callable[[Any, str], Any]  # (value, "--rdzv-conf KEY") -> the value, or ConfigError


def _text(value: Any, setting: str) -> Any:
    return value


def _file(value: Any, setting: str) -> str:
    """A file this node has (a TLS certificate or key)."""
    if not os.path.isfile(str(value)):
        raise ConfigError(f"{setting}={value!r} is invalid: no such file on this node; give "
                          "the path of a PEM file.", field=setting)
    return str(value)


def _choice(*words: str) -> Parse:
    def parse(value: Any, setting: str) -> str:
        word = str(value).strip().lower()
        if word not in words:
            raise ConfigError(f"{setting}={value!r} is invalid: use {' or '.join(words)}.",
                              field=setting)
        return word
    return parse


def _policy(value: Any, setting: str) -> Any:
    """``module:Class``, or a policy object as it is (the API may pass one)."""
    if not isinstance(value, str):
        return value
    module, _, name = value.partition(":")
    if not (module and name):
        raise ConfigError(f"{setting}={value!r} is invalid: name the policy as module:Class, "
                          "e.g. node_policy=my_pkg.policies:TwoStrikes.", field=setting)
    return value


def _rank(value: Any, setting: str) -> int:
    return count(value, setting, minimum=0)


def _outage(value: Any, setting: str) -> float:
    return seconds(value, setting, zero=True)


# The --rdzv-conf keys, by who reads them. Every backend: the agent's node policy, the
# node run's replica TLS files, torch's launcher's ``timeout``.
EVERY_BACKEND: dict[str, Parse] = {
    "node_policy": _policy, "replica_cert": _file, "replica_key": _file,
    "replica_ca_cert": _file, "timeout": whole_seconds}
# torch's dynamic rendezvous (c10d, etcd-v3): it reads them with int().
TORCH_DYNAMIC: dict[str, Parse] = {
    **{f"{name}_timeout": whole_seconds for name in ("join", "last_call", "close", "heartbeat")},
    "keep_alive_interval": whole_seconds, "keep_alive_max_attempt": count}
# torch's c10d store.
C10D_STORE: dict[str, Parse] = {"read_timeout": whole_seconds, "is_host": switch,
                                "store_type": _choice("tcp", "file"), "use_agent_store": switch}
# The etcd connection (agent/rendezvous/etcd_v3.py, etcd_outage.py).
ETCD_CLIENT: dict[str, Parse] = {
    "protocol": _choice("http", "https"), "ca_cert": _file, "cert": _file, "key": _file,
    "username": _text, "password": _text, "timeout": seconds, "outage_timeout": _outage,
    "lease_ttl": whole_seconds}
# Our etcd handler (agent/rendezvous/etcd_rounds.py): fractions of seconds are fine.
ETCD_NATIVE: dict[str, Parse] = {
    **{f"{name}_timeout": seconds for name in ("join", "last_call", "close", "read")},
    "keep_alive_interval": seconds, "keep_alive_max_attempt": count,
    "liveness_ttl": seconds, "watch_check_interval": seconds}
STATIC: dict[str, Parse] = {"rank": _rank}


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
        keys: The ``conf`` keys it takes, each with the rule that parses its value.
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
    keys: Mapping[str, Parse] = field(default_factory=dict)
    extra: str | None = None
    summary: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def check_conf(self, conf: Mapping[str, Any], source: str) -> dict[str, Any]:
        """``conf`` with each value parsed by its key's rule; ``source`` names where it came
        from (``--rdzv-conf``). A ConfigError names an unknown key, with the closest one
        this backend takes, or a bad value with its fix."""
        keys = {**EVERY_BACKEND, **self.keys}
        for key in conf:
            if key not in keys:
                raise self._unknown(key, keys, source)
        return {key: keys[key](value, f"{source} {key}") for key, value in conf.items()}

    def _unknown(self, key: str, keys: Mapping[str, Parse], source: str) -> ConfigError:
        """The error for a key this backend does not take: the closest one it takes, or
        the backends that take it. Its value is not shown: a misspelt password's key is
        no longer recognised as a secret."""
        close = difflib.get_close_matches(key, keys, n=1)
        owners = [b.name for b in BACKENDS if key in b.keys]
        hint = f"it is a key of --rdzv-backend {' or '.join(owners)}." if owners else \
            f"did you mean {close[0]}?" if close else f"it takes {', '.join(sorted(keys))}."
        return ConfigError(f"{source} {key}=...: the {self.name} rendezvous has no key "
                           f"{key!r}; {hint}", field=source)


BACKENDS: tuple[Backend, ...] = (
    Backend("c10d", defaults=FAST_DEFAULTS, keys={**TORCH_DYNAMIC, **C10D_STORE},
            reuses_store=True, endpoint_is_node_store=True,
            factory="elastic_train.agent.rendezvous.torch_state:create_c10d_handler",
            summary="c10d (default; torch's TCP store on the first node)"),
    Backend("etcd", extra="etcd", defaults=NATIVE_DEFAULTS, state=StateHome.ETCD,
            keys={**ETCD_CLIENT, **ETCD_NATIVE},
            factory="elastic_train.agent.rendezvous.etcd_native:create_handler",
            summary="etcd (our handler on etcd's v3 API: survives the loss of any node, "
                    "forms hundreds of nodes in seconds)"),
    Backend("etcd-v3", extra="etcd", defaults=FAST_DEFAULTS, reuses_store=True,
            keys={**TORCH_DYNAMIC, **ETCD_CLIENT},
            state=StateHome.ETCD,
            factory="elastic_train.agent.rendezvous.etcd_handler:create_etcd_v3_handler",
            summary="etcd-v3 (torch's dynamic rendezvous over etcd's v3 API, for jobs "
                    "started with it, and plain torchrun's name for us)"),
    Backend("static", elastic=False, store_per_round=False, keys=STATIC,
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
