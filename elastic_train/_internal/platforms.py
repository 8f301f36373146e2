"""What a launch learns from the platform it runs on: Slurm's allocation, Kubeflow's job name.

One small function per platform reads its environment and returns the
settings it implies, each with the variable it came from. Both front-ends use
them, after the user's own settings: ``elastic-train launch`` (an explicit
flag, then torchrun's ``PET_*`` variable, then the platform, then torchrun's
default; ``--dry-run`` shows which) and :class:`~elastic_train.RendezvousConfig`
(a field left ``None``: ``PET_RDZV_*``, then the platform). Standard library
only, so the configs load without torch.

- **Slurm** (``SLURM_JOB_ID`` set): the allocation's nodes, this node's
  index, workers per node from its GPUs (else the tasks per node), the job
  id as the run id (a requeued job keeps its id, so it continues the same
  run), and with several nodes a rendezvous of its own: c10d on the first
  host of the node list, on ``MASTER_PORT`` or a port derived from the job id.
- **Kubeflow PyTorchJob**: torchrun's ``PET_*`` variables carry everything
  but a job id when the job sets no ``rdzvId``; the operator names the
  master ``<job>-master-0`` and the elastic rendezvous host
  ``<job>-worker-0``, so the job's name is read from there.

Example::

    derived_settings({"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2",
                      "SLURM_JOB_NODELIST": "gpu[07-08]"})["rdzv_endpoint"]
    # Derived(value='gpu07:20042', source='SLURM_JOB_NODELIST, SLURM_JOB_ID')
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from elastic_train.errors import ConfigError

# Without MASTER_PORT, a Slurm job's rendezvous port is SLURM_PORT_BASE + job id modulo
# SLURM_PORT_SPAN: below Linux's ephemeral range, and two jobs whose first node is the
# same collide only when their ids are SLURM_PORT_SPAN apart.
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 10000

_KUBEFLOW_HOST = re.compile(r"^(?P<job>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?P<role>master|worker)-0$")


@dataclass(frozen=True)
class Derived:
    """A setting and where it came from (a flag, a variable, or ``"default"``)."""

    value: str
    source: str


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed node list, expanded as ``scontrol show hostnames`` would.

    ``"gpu-a[01-03,07],gpu-b12"`` -> ``gpu-a01 gpu-a02 gpu-a03 gpu-a07 gpu-b12``;
    ranges keep their zero padding, and several bracket groups in one name
    multiply (``"r[1-2]n[1-2]"`` -> ``r1n1 r1n2 r2n1 r2n2``).
    """
    hosts: list[str] = []
    for item in _split_top_level(text):
        hosts += _expand_item(item, text)
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Splits at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_item(item: str, whole: str) -> list[str]:
    opened = item.find("[")
    if opened < 0:
        return [item]
    closed = item.find("]", opened)
    if closed < 0:
        raise ConfigError(f"SLURM_JOB_NODELIST={whole!r} has an unclosed '[': expected a "
                          "Slurm node list such as gpu[01-04],cpu7.")
    heads = [item[:opened] + part for part in _expand_ranges(item[opened + 1:closed], whole)]
    return [head + tail for head in heads for tail in _expand_item(item[closed + 1:], whole)]


def _expand_ranges(spec: str, whole: str) -> list[str]:
    out = []
    for part in spec.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ConfigError(f"SLURM_JOB_NODELIST={whole!r}: {part!r} is not a number or "
                              "a range such as 01-04.")
        width = len(low)
        out += [str(n).zfill(width) for n in range(int(low), int(high or low) + 1)]
    return out


def _count(env: Mapping[str, str], name: str) -> int | None:
    """``env[name]`` as a count >= 0 (None when unset); a ConfigError naming it otherwise."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit():
        raise ConfigError(f"{name}={raw!r} is invalid: Slurm sets a whole number here; unset "
                          f"it or pass the setting as a flag instead.")
    return int(raw)


def slurm_port(env: Mapping[str, str]) -> Derived:
    """The job's rendezvous port: ``MASTER_PORT``, else one derived from the job id."""
    if env.get("MASTER_PORT"):
        return Derived(env["MASTER_PORT"], "MASTER_PORT")
    job = env["SLURM_JOB_ID"]
    number = int(job) if job.isdigit() else zlib.crc32(job.encode())
    return Derived(str(SLURM_PORT_BASE + number % SLURM_PORT_SPAN), "SLURM_JOB_ID")


def slurm(env: Mapping[str, str]) -> dict[str, Derived]:
    """Inside a Slurm allocation: the job's nodes, this node, its workers, its rendezvous."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return {}
    out = {"rdzv_id": Derived(job, "SLURM_JOB_ID")}
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if (nodes := _count(env, name)) is not None:
            out["nnodes"] = Derived(str(nodes), name)
            break
    if (node := _count(env, "SLURM_NODEID")) is not None:
        out["node_rank"] = Derived(str(node), "SLURM_NODEID")
    gpus, tasks = _count(env, "SLURM_GPUS_ON_NODE"), _count(env, "SLURM_NTASKS_PER_NODE")
    if gpus:
        out["nproc_per_node"] = Derived(str(gpus), "SLURM_GPUS_ON_NODE")
    elif tasks:
        out["nproc_per_node"] = Derived(str(tasks), "SLURM_NTASKS_PER_NODE")
    nodelist = next((n for n in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(n)), None)
    if nodelist is not None and int(out.get("nnodes", Derived("1", "")).value) > 1:
        first, port = expand_hostlist(env[nodelist])[0], slurm_port(env)
        out["master_addr"] = Derived(first, nodelist)
        out["master_port"] = port
        out["rdzv_endpoint"] = Derived(f"{first}:{port.value}", f"{nodelist}, {port.source}")
        out["rdzv_backend"] = Derived("c10d", out["nnodes"].source)
    return out


def kubeflow(env: Mapping[str, str]) -> dict[str, Derived]:
    """In a Kubeflow PyTorchJob's pod: the job's name, as the run id, when it set none."""
    hosts = {"PET_RDZV_ENDPOINT": env.get("PET_RDZV_ENDPOINT", "").rsplit(":", 1)[0],
             "PET_MASTER_ADDR": env.get("PET_MASTER_ADDR", "")}
    for name, host in hosts.items():
        if match := _KUBEFLOW_HOST.match(host):
            source = f"{name} (Kubeflow's {match['job']}-{match['role']}-0)"
            return {"rdzv_id": Derived(match["job"], source)}
    return {}


def derived_settings(env: Mapping[str, str]) -> dict[str, Derived]:
    """What the platform this process runs on implies (Slurm first, then Kubeflow)."""
    return {**kubeflow(env), **slurm(env)}
