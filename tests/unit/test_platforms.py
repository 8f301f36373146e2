"""What a launch reads from Slurm and Kubeflow: node lists, ports, ids, and their sources."""

from __future__ import annotations

import pytest

from elastic_train._internal.platforms import (
    SLURM_PORT_BASE,
    SLURM_PORT_SPAN,
    derived_settings,
    expand_hostlist,
    kubeflow,
    slurm,
)
from elastic_train.errors import ConfigError


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node1,node2", ["node1", "node2"]),
    ("gpu-a[01-03,07],gpu-b12", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a07", "gpu-b12"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a[1,3]-ib,b", ["a1-ib", "a3-ib", "b"]),
    ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
])
def test_compressed_node_lists_expand_like_scontrol(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[01-03", "gpu[a-b]", "gpu[1-]x"])
def test_a_bad_node_list_names_the_variable(text):
    with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST"):
        expand_hostlist(text)


SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "3", "SLURM_NODEID": "2",
         "SLURM_JOB_NODELIST": "gpu-a[07-08],gpu-b1", "SLURM_NTASKS_PER_NODE": "1"}


def values(derived):
    return {key: (d.value, d.source) for key, d in derived.items()}


def test_slurm_allocation_gives_nodes_rank_and_a_rendezvous_on_the_first_host():
    port = str(SLURM_PORT_BASE + 4242 % SLURM_PORT_SPAN)
    assert values(slurm(SLURM)) == {
        "rdzv_id": ("4242", "SLURM_JOB_ID"),
        "nnodes": ("3", "SLURM_JOB_NUM_NODES"),
        "node_rank": ("2", "SLURM_NODEID"),
        "nproc_per_node": ("1", "SLURM_NTASKS_PER_NODE"),
        "master_addr": ("gpu-a07", "SLURM_JOB_NODELIST"),
        "master_port": (port, "SLURM_JOB_ID"),
        "rdzv_endpoint": (f"gpu-a07:{port}", "SLURM_JOB_NODELIST, SLURM_JOB_ID"),
        "rdzv_backend": ("c10d", "SLURM_JOB_NUM_NODES"),
    }


def test_slurm_gpus_and_master_port_win_over_tasks_and_the_derived_port():
    derived = slurm({**SLURM, "SLURM_GPUS_ON_NODE": "8", "MASTER_PORT": "29511",
                     "SLURM_JOB_NUM_NODES": "", "SLURM_NNODES": "2"})
    assert derived["nproc_per_node"].value == "8"
    assert derived["nnodes"].source == "SLURM_NNODES"
    assert derived["rdzv_endpoint"].value == "gpu-a07:29511"


def test_one_slurm_node_needs_no_rendezvous_but_keeps_the_job_id():
    derived = slurm({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1",
                     "SLURM_JOB_NODELIST": "cpu3"})
    assert set(derived) == {"rdzv_id", "nnodes"}


def test_outside_slurm_nothing_is_derived():
    assert slurm({"SLURM_NNODES": "2"}) == {}  # no job id: not inside an allocation


def test_a_bad_slurm_variable_is_named():
    with pytest.raises(ConfigError, match="SLURM_NODEID='x'"):
        slurm({**SLURM, "SLURM_NODEID": "x"})


@pytest.mark.parametrize("env, job", [
    ({"PET_MASTER_ADDR": "resnet-master-0", "PET_MASTER_PORT": "23456"}, "resnet"),
    ({"PET_RDZV_ENDPOINT": "my-job-worker-0:29400"}, "my-job"),
    ({"PET_MASTER_ADDR": "10.0.0.3"}, None),
    ({"PET_RDZV_ENDPOINT": "etcd-client:2379"}, None),
])
def test_kubeflow_job_name_from_its_pod_names(env, job):
    derived = kubeflow(env)
    assert (derived["rdzv_id"].value if derived else None) == job


def test_slurm_wins_over_kubeflow():
    env = {**SLURM, "PET_MASTER_ADDR": "resnet-master-0"}
    assert derived_settings(env)["rdzv_id"].value == "4242"
