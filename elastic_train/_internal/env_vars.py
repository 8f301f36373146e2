"""Every ``ELASTIC_TRAIN_*`` environment variable, named, documented and read once.

A setting reaches a worker one way. What the driver knows of the run and the node
(storage, name, checkpoint settings, retry budget, staging and cache directories,
lease token, user roots) is the worker plan, one JSON file the node run writes
(:mod:`elastic_train.worker.worker_plan`), whose path is the one variable ``PLAN``.
The environment keeps only what must never be written to a file (``STORAGE``), what
the agent sets per worker and attempt, and a user's switches. This module names
them and reads the last two kinds (:class:`AgentFacts`, :class:`Switches`); the plan's
loader reads ``PLAN`` and ``STORAGE``. No other module reads an ``ELASTIC_TRAIN_*``
variable (a unit test checks), with one exception: the zygote's stand-in
(:mod:`elastic_train.agent.zygote.client`), which imports only the standard library,
spells out ``WORKER_PIDS_DIR``. torch.distributed.elastic's own variables (``RANK``,
``WORLD_SIZE``, ``TORCHELASTIC_*``) and torchrun's ``PET_*`` flags are torch's, not
listed here.

User switches (:class:`Switches`, read where they act; each variable is parsed by its
rule in :data:`RULES`: a switch takes ``0/1/false/true/no/yes/off/on`` in any case, a
duration a number of seconds, and anything else is a ConfigError naming the variable):

- ``ZYGOTE`` (``ELASTIC_TRAIN_ZYGOTE=0``): start every worker as a fresh
  interpreter instead of forking it from the agent's zygote
  (:mod:`elastic_train.agent.zygote.server`).
- ``STANDBY`` (``ELASTIC_TRAIN_STANDBY=0``): the zygote keeps no worker forked
  ahead of need, warmed for the next slot (:mod:`elastic_train.agent.zygote.standby`).
- ``FAIL_AT_REPORT``: ``elastic-train verify-resume``'s injected crash, the
  last rank exits after this ``report()`` of the first attempt
  (:mod:`elastic_train.worker.fault_injection`).
- ``LOCAL_TIER`` (``ELASTIC_TRAIN_LOCAL_TIER=0``, in the environment of ``fit()``
  or ``elastic-train launch``): a node does not keep the checkpoint files its
  ranks uploaded to a remote store (for nodes short of disk), so every restart
  downloads what it reads (:mod:`elastic_train.storage.local_tier`). The node run
  reads it into the worker plan.
- ``USER_CODE``: directories (separated by ``:``) whose modules are the user's own
  code, beside the working directory, the driver's script's directory and the
  train function's package: a zygote forked from the driver drops the driver's
  imports of them and never preloads them, so each worker imports them itself, in
  its own environment (:mod:`elastic_train.worker.user_code`).
- ``RAY_STRICT`` (``ELASTIC_TRAIN_RAY_STRICT=1``, in the environment of the driver
  script): a strict port, every Ray argument that is accepted and ignored with a warning
  (``ScalingConfig(placement_strategy=...)``...) raises ``ConfigError`` instead, where
  the object is built (:mod:`elastic_train._internal.ray_arguments`).
- ``LEASE_TTL_S``: seconds after its last heartbeat (every quarter of it) a
  driver's lease on its run goes stale and another job may take the run over
  (default 20; :mod:`elastic_train.driver.run_lease`).

From the node run to its workers:

- ``PLAN``: the path of the node's worker plan (:mod:`elastic_train.worker.worker_plan`).
- ``STORAGE``: the run's storage URL as given (it may hold a password) and, under
  ``elastic-train launch``, its storage options, as JSON: kept out of every file,
  the plan included.

Set by the agent for each worker (read through :class:`AgentFacts`, but for
``WORKER_PIDS_DIR``, which only the zygote's stand-in reads):

- ``GENERATION``: the worker group's incarnation id, agreed by the agents;
  workers namespace their process-group keys with it.
- ``AGENT_PID``: the agent's pid, so a worker can tell it outlived its agent.
- ``PROGRESS_DIR``: where the worker's heartbeat and stack-dump files go
  (hang detection).
- ``PREEMPTION_DIR`` / ``PREEMPTION_GRACE_S``: where a worker marks that the
  group knew of a preemption notice, and the grace it has after one.
- ``WORKER_PIDS_DIR``: where a zygote's stand-in notes the pid of the worker
  it stands in for, so the agent can stop and wait for that worker itself
  (:mod:`elastic_train.agent.forked_workers`; the stand-in spells the name out).
- ``INPROCESS_DIR``: with in-process restarts on, the directory through which
  the worker and its agent agree on attempts (:mod:`elastic_train.worker.inprocess.channel`).
- ``ATTEMPT``: the attempt a worker starts in (0, or the attempt a replacement
  worker joins); in-process restarts count it up inside the process.
- ``MODULES_DIR``: where a worker lists the modules it imported, which the
  agent's zygote then preloads for later workers (:mod:`elastic_train.agent.zygote.preload`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from elastic_train._internal.setting_values import count, seconds, switch

PREFIX = "ELASTIC_TRAIN_"  # of every variable here
ZYGOTE = "ELASTIC_TRAIN_ZYGOTE"
STANDBY = "ELASTIC_TRAIN_STANDBY"
FAIL_AT_REPORT = "ELASTIC_TRAIN_FAIL_AT_REPORT"
LOCAL_TIER = "ELASTIC_TRAIN_LOCAL_TIER"
GENERATION = "ELASTIC_TRAIN_GENERATION"
AGENT_PID = "ELASTIC_TRAIN_AGENT_PID"
PROGRESS_DIR = "ELASTIC_TRAIN_PROGRESS_DIR"
PREEMPTION_DIR = "ELASTIC_TRAIN_PREEMPTION_DIR"
PREEMPTION_GRACE_S = "ELASTIC_TRAIN_PREEMPTION_GRACE_S"
WORKER_PIDS_DIR = "ELASTIC_TRAIN_WORKER_PIDS_DIR"
LEASE_TTL_S = "ELASTIC_TRAIN_LEASE_TTL_S"
INPROCESS_DIR = "ELASTIC_TRAIN_INPROCESS_DIR"
ATTEMPT = "ELASTIC_TRAIN_ATTEMPT"
MODULES_DIR = "ELASTIC_TRAIN_MODULES_DIR"
USER_CODE = "ELASTIC_TRAIN_USER_CODE"
RAY_STRICT = "ELASTIC_TRAIN_RAY_STRICT"
PLAN = "ELASTIC_TRAIN_PLAN"
STORAGE = "ELASTIC_TRAIN_STORAGE"


def is_ours(name: str) -> bool:
    """Whether ``name`` is one of this module's variables (or would be)."""
    return name.startswith(PREFIX)


def _text(raw: str, variable: str) -> str:
    return raw


def _paths(raw: str, variable: str) -> tuple[str, ...]:
    return tuple(p for p in raw.split(os.pathsep) if p)


def _attempt(raw: str, variable: str) -> int:
    return count(raw, variable, minimum=0)


def _grace(raw: str, variable: str) -> float:
    return seconds(raw, variable, zero=True)


def _ttl(raw: str, variable: str) -> float:
    return seconds(raw, variable, example="20")


# Every variable read here: how its text becomes its value (a ConfigError naming the
# variable, its value and the fix otherwise; see :mod:`.setting_values`), and its value
# when it is unset or empty. Switches take 0/1/false/true/no/yes/off/on in any case.
RULES: dict[str, tuple[Callable[[str, str], Any], Any]] = {
    ZYGOTE: (switch, True), STANDBY: (switch, True), LOCAL_TIER: (switch, True),
    RAY_STRICT: (switch, False), FAIL_AT_REPORT: (count, None), LEASE_TTL_S: (_ttl, None),
    USER_CODE: (_paths, ()),
    GENERATION: (_text, None), AGENT_PID: (count, None), ATTEMPT: (_attempt, 0),
    PROGRESS_DIR: (_text, None), PREEMPTION_DIR: (_text, None),
    PREEMPTION_GRACE_S: (_grace, 0.0), INPROCESS_DIR: (_text, None),
    MODULES_DIR: (_text, None),
}


def read(variable: str, env: Mapping[str, str] = os.environ) -> Any:
    """``variable``'s value in ``env`` by its rule in :data:`RULES`."""
    parse, default = RULES[variable]
    raw = env.get(variable)
    return default if not raw else parse(raw, variable)


@dataclass(frozen=True)
class Switches:
    """The user's switches, as this process's environment sets them (read at each call:
    they are cheap, and a test or a driver may change them between runs). A bad value
    is a ConfigError naming its variable (the driver reads them all before it starts
    anything)."""

    zygote: bool
    standby: bool
    fail_at_report: int | None
    local_tier: bool
    user_code: tuple[str, ...]
    lease_ttl_s: float | None
    ray_strict: bool

    @classmethod
    def from_environ(cls, env: Mapping[str, str] = os.environ) -> Switches:
        return cls(zygote=read(ZYGOTE, env), standby=read(STANDBY, env),
                   fail_at_report=read(FAIL_AT_REPORT, env), local_tier=read(LOCAL_TIER, env),
                   user_code=read(USER_CODE, env), lease_ttl_s=read(LEASE_TTL_S, env),
                   ray_strict=read(RAY_STRICT, env))


@dataclass(frozen=True)
class AgentFacts:
    """What the agent tells one worker as it starts it (None, or empty: not told, e.g.
    outside an agent's workers). Read at each call: in-process restarts change
    ``attempt`` inside the process."""

    generation: str | None
    agent_pid: int | None
    attempt: int
    progress_dir: str | None
    preemption_dir: str | None
    preemption_grace_s: float
    inprocess_dir: str | None
    modules_dir: str | None

    @classmethod
    def from_environ(cls, env: Mapping[str, str] = os.environ) -> AgentFacts:
        return cls(generation=read(GENERATION, env), agent_pid=read(AGENT_PID, env),
                   attempt=read(ATTEMPT, env), progress_dir=read(PROGRESS_DIR, env),
                   preemption_dir=read(PREEMPTION_DIR, env),
                   preemption_grace_s=read(PREEMPTION_GRACE_S, env),
                   inprocess_dir=read(INPROCESS_DIR, env), modules_dir=read(MODULES_DIR, env))
