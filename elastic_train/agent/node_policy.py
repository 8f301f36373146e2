"""Which nodes stay in the job: the seam for node health, exclusion and spares.

The restart budget (:mod:`.restart_budget`) decides whether the *group* restarts;
a :class:`NodePolicy` decides whether *this node* stays in it. It is asked at two
points:

- **After a failure charged to this node** (:meth:`NodePolicy.after_failure`,
  from the agent's decision): given the failures charged to the node so far and
  the kind of this one, it says :data:`STAY` or :func:`leave` (a reason and a
  cooling-off period). A node told to leave stops its workers and exits the job
  with :class:`~elastic_train.errors.NodeLeftError` naming the node and the
  reason (recorded in ``run.json``); it does not close the rendezvous, so the
  others go on without it (``--nnodes MIN:MAX``) or wait for a spare.
- **When a round is sealed** (:meth:`NodePolicy.admit`): given a candidate
  member, whether it is admitted. What each backend can enforce:

  - every backend: the agent asks about itself before it joins a round, and a
    node not admitted exits with the same error instead of joining;
  - ``etcd`` (our handler, :mod:`.rendezvous.etcd_native`): the round's sealer
    also asks about every node that joined, and leaves out those not admitted;
    a node left out learns why from the round and exits likewise. This holds
    even where the node's own policy would have admitted it;
  - ``c10d``, ``etcd-v3`` (torch's dynamic rendezvous) and ``static``: torch seals
    the round, so only the node's own check applies.

The default, :class:`NodePolicy` itself, admits every node and never sends one
away: behaviour without a policy is unchanged. A policy is set by its dotted path
in the rendezvous settings, the same on every node, e.g. ``--rdzv-conf
node_policy=my_pkg.policies:TwoStrikes`` or ``RendezvousConfig(conf={"node_policy":
"my_pkg.policies:TwoStrikes"})`` (internal for now: the name and place may change);
:func:`load` builds it, with no arguments. A job that meets on no rendezvous of its
own (``fit()`` on one node, ``launch`` with one node and no ``--rdzv-backend``) has
no such settings, and so no policy.

How the issue on node health, exclusion and spares (#26) plugs in: the health checks
are a policy, :class:`~.health_policy.HealthPolicy`, whose ``admit`` runs the node's
checks (before joining, and in ``after_failure``: leave when one fails), and whose
"K failures in a row" is ``after_failure`` on :attr:`ChargedFailures.in_a_row`.
A node that leaves with a cooling-off period is recorded in the run directory
(:mod:`elastic_train._internal.departures`), and :class:`~.cooling_off.CoolingOff`, which wraps
the job's policy, refuses it at both points above until the period is over (the
candidate's name is the key); spares need no change here: a node that leaves is
replaced by whoever waits (``--spares``). A node can also be asked to leave while
nothing failed -- the straggler, with ``StragglerConfig(replace=True)`` -- and then
leaves with the same verdict (:func:`leave`) once a spare waits
(:mod:`.leave_for_spare`).

Example::

    class TwoStrikes(NodePolicy):
        def after_failure(self, charged: ChargedFailures) -> NodeVerdict:
            if charged.in_a_row >= 2:
                return leave(f"{charged.in_a_row} failures in a row", cool_off_s=600)
            return STAY
"""

from __future__ import annotations

import importlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.errors import ConfigError, NodeLeftError, WorkerFailure

POLICY_SETTING = "node_policy"  # the rendezvous setting (``conf``) that names the policy


@dataclass(frozen=True)
class NodeVerdict:
    """What the policy says of a node: stay, or leave the job (why, and for how long it
    is not admitted again: :mod:`.cooling_off` enforces that, whatever the policy)."""

    leave: bool = False
    reason: str = ""
    cool_off_s: float = 0.0


STAY = NodeVerdict()


def leave(reason: str, cool_off_s: float = 0.0) -> NodeVerdict:
    """The node leaves the job, for ``reason`` (one line, shown to the user)."""
    if not reason:
        raise ValueError("A node that leaves needs a reason to show.")
    return NodeVerdict(True, reason, cool_off_s)


@dataclass(frozen=True)
class ChargedFailures:
    """A failed attempt, as the policy sees it after the restart budget was charged.

    Attributes:
        node: This node's name (:func:`node_name`).
        kind: Which budget the attempt spent (``PEER``: another node is at fault).
        failures: This node's failed workers, root cause first.
        charged: Failures charged to this node so far, this one included.
        in_a_row: Of those, how many came one after the other with no failure of
            another kind (a peer's, a preemption) between them.
    """

    node: str
    kind: FailureKind
    failures: tuple[WorkerFailure, ...]
    charged: int
    in_a_row: int


@dataclass(frozen=True)
class Candidate:
    """A node that asks to be in a round: its name (:func:`node_name`), and whether it is
    the node asking (its agent, before it joins) rather than another one (a round's
    sealer asks about every member): only the node itself can check itself."""

    name: str
    here: bool = False


@dataclass(frozen=True)
class Admission:
    """Whether a candidate is admitted; if not, why (one line, shown to the user), and,
    for a node that refuses itself (a failed health check), how long it then stays out
    (0: it may ask again at once)."""

    admitted: bool = True
    reason: str = ""
    cool_off_s: float = 0.0


ADMITTED = Admission()


def refused(reason: str, cool_off_s: float = 0.0) -> Admission:
    """The candidate is not admitted, for ``reason``; a node refusing itself leaves the
    job for ``cool_off_s``."""
    if not reason:
        raise ValueError("A refusal needs a reason to show.")
    return Admission(False, reason, cool_off_s)


class NodePolicy:
    """The default policy: every node is admitted, and none is ever sent away.

    Subclasses override either method; both must be quick and must not raise (they
    run in the agent's monitoring loop and in the rendezvous's sealing).
    """

    def after_failure(self, charged: ChargedFailures) -> NodeVerdict:
        """Whether this node stays after a failed attempt."""
        return STAY

    def admit(self, candidate: Candidate) -> Admission:
        """Whether ``candidate`` may be a member of the round being sealed."""
        return ADMITTED


def node_name(local_addr: str | None) -> str:
    """A node's name for the policy: the address it gives the rendezvous
    (``--local-addr``), else its fully qualified host name, as the rendezvous names it."""
    return local_addr or socket.getfqdn()


def named_in(conf: Mapping[str, Any] | None) -> NodePolicy | str | None:
    """The policy the rendezvous settings name (None: the job has none)."""
    return (conf or {}).get(POLICY_SETTING) or None


def load(path: NodePolicy | str | None) -> NodePolicy:
    """The policy at ``path`` (``"module:Class"``), built with no arguments; the default
    for None, and a policy as it is (the agent hands its own to the rendezvous). A
    ConfigError names the setting when it cannot be loaded."""
    if isinstance(path, NodePolicy):
        return path
    if not path:
        return NodePolicy()
    module, sep, name = str(path).partition(":")
    try:
        policy = getattr(importlib.import_module(module), name)() if sep else None
    except (ImportError, AttributeError, TypeError) as exc:
        raise ConfigError(f"{POLICY_SETTING}={path!r} could not be loaded ({exc}): name a "
                          "NodePolicy subclass as module:Class, e.g. my_pkg.policies:TwoStrikes.",
                          field=POLICY_SETTING) from exc
    if not isinstance(policy, NodePolicy):
        raise ConfigError(f"{POLICY_SETTING}={path!r} is not a NodePolicy subclass: name one "
                          "as module:Class, e.g. my_pkg.policies:TwoStrikes.",
                          field=POLICY_SETTING)
    return policy


@dataclass
class NodeStanding:
    """One node's record as its policy sees it: the failures charged to it, and what the
    policy said. The agent keeps one and asks it at the two points the module names."""

    policy: NodePolicy
    node: str
    charged: int = 0
    in_a_row: int = 0

    def after_failure(self, kind: FailureKind, failures: list[WorkerFailure]) -> NodeVerdict:
        """Counts a failed attempt of ``kind`` and asks the policy whether the node stays."""
        if kind is FailureKind.FAILURE:
            self.charged, self.in_a_row = self.charged + 1, self.in_a_row + 1
        else:
            self.in_a_row = 0
        return self.policy.after_failure(ChargedFailures(
            self.node, kind, tuple(failures), self.charged, self.in_a_row))

    def check_admitted(self) -> None:
        """Before this node joins a round: NodeLeftError if the policy does not admit it."""
        admission = self.policy.admit(Candidate(self.node, here=True))
        if not admission.admitted:
            raise NodeLeftError(self.node, f"not admitted: {admission.reason}",
                                admission.cool_off_s)
