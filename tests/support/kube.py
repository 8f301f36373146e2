"""What Kubernetes and Kubeflow's operator give a pod, computed from a manifest (no cluster).

- :func:`pytorchjob_env`: the variables Kubeflow's training operator (v1) adds to a
  PyTorchJob's pod (its ``envvar.go``, ``master.go`` and ``elastic.go``): ``PET_NNODES``,
  ``PET_NPROC_PER_NODE`` (default ``auto``), the master's ``PET_MASTER_ADDR/PORT``
  (``<job>-master-0``, the ``pytorchjob-port``, default 23456), ``PET_NODE_RANK``, and for
  an elastic policy ``PET_RDZV_BACKEND/ENDPOINT/ID``, ``PET_NNODES=MIN:MAX``,
  ``PET_MAX_RESTARTS``.
- :func:`container_env`: a container's own ``env`` as the kubelet resolves it: values,
  ``fieldRef`` (from the pod's metadata), secrets (a placeholder) and ``$(VAR)`` references
  to earlier variables.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

DEFAULT_PORT = 23456
_REFERENCE = re.compile(r"\$\((\w+)\)")


def documents(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def launch_argv(container: dict[str, Any]) -> list[str]:
    """The arguments after ``elastic-train launch`` in the container's command."""
    command = [*container.get("command", []), *container.get("args", [])]
    assert command[:2] == ["elastic-train", "launch"], command
    return command[2:]


def container_env(container: dict[str, Any], fields: dict[str, str]) -> dict[str, str]:
    """``fields``: the pod's ``fieldPath`` values (``metadata.name``, annotations, labels)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        source = item.get("valueFrom")
        if source is None:
            value = _REFERENCE.sub(lambda m: env.get(m[1], m[0]), str(item["value"]))
        elif "fieldRef" in source:
            value = fields[source["fieldRef"]["fieldPath"]]
        else:
            value = "from-a-secret"
        env[item["name"]] = value
    return env


def _port(job: dict[str, Any], replica_type: str) -> int:
    container = job["spec"]["pytorchReplicaSpecs"][replica_type]["template"]["spec"][
        "containers"][0]
    ports = [p["containerPort"] for p in container.get("ports", [])
             if p.get("name") == "pytorchjob-port"]
    return ports[0] if ports else DEFAULT_PORT


def pytorchjob_env(job: dict[str, Any], replica_type: str, index: int) -> dict[str, str]:
    """The operator's variables for pod ``index`` of ``replica_type`` (Master or Worker)."""
    name, spec = job["metadata"]["name"], job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(r.get("replicas", 1) for r in replicas.values())
    env = {"PYTHONUNBUFFERED": "1"}
    if "Master" in replicas:
        rank = index + (1 if replica_type == "Worker" else 0)
        master, port = f"{name}-master-0", str(_port(job, "Master"))
        env.update(MASTER_ADDR=master, PET_MASTER_ADDR=master, MASTER_PORT=port,
                   PET_MASTER_PORT=port, RANK=str(rank), PET_NODE_RANK=str(rank))
    elastic = spec.get("elasticPolicy")
    if elastic is None or "nProcPerNode" not in elastic:
        env["PET_NPROC_PER_NODE"] = str(spec.get("nprocPerNode", "auto"))
    if elastic is None:
        env["PET_NNODES"] = str(total)
        return env
    host = elastic.get("rdzvHost", f"{name}-worker-0")
    port = elastic.get("rdzvPort", _port(job, "Worker"))
    env.update(PET_RDZV_ENDPOINT=f"{host}:{port}",
               PET_RDZV_BACKEND=elastic.get("rdzvBackend", "c10d"))
    bounds = (elastic.get("minReplicas"), elastic.get("maxReplicas"))
    env["PET_NNODES"] = f"{bounds[0]}:{bounds[1]}" if None not in bounds \
        else str(replicas["Worker"]["replicas"])
    for key, variable in (("maxRestarts", "PET_MAX_RESTARTS"), ("rdzvId", "PET_RDZV_ID"),
                          ("nProcPerNode", "PET_NPROC_PER_NODE")):
        if key in elastic:
            env[variable] = str(elastic[key])
    return env
