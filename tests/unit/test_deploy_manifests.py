"""The shipped deployment files (docs/deploy/): they parse, and the command and environment
each gives a pod (or a Slurm node) make ``elastic-train launch`` derive the intended
settings, checked with ``--dry-run`` -- the path a real launch takes."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from elastic_train.cli.launch_command import main_launch
from tests.support import kube
from tests.support.paths import REPO

KUBE = os.path.join(REPO, "docs", "deploy", "kubernetes")
SBATCH = os.path.join(REPO, "docs", "deploy", "slurm", "train.sbatch")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """The image's working directory, with its train.py."""
    (tmp_path / "train.py").write_text("print('training')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def dry_run(capsys, argv, env):
    code = main_launch(["--dry-run", *argv], env)
    out, err = capsys.readouterr()
    assert code == 0, err
    return {key: value["value"] for key, value in json.loads(out).items() if key != "notes"}


def pod(docs, kind):
    return next(d for d in docs if d["kind"] == kind)


def test_every_manifest_parses_and_names_its_objects():
    files = sorted(f for f in os.listdir(KUBE) if f.endswith(".yaml"))
    assert files == ["etcd.yaml", "job-indexed.yaml", "jobset.yaml", "pytorchjob-elastic.yaml",
                     "pytorchjob-static.yaml"]
    for name in files:
        for doc in kube.documents(os.path.join(KUBE, name)):
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], name


def test_etcd_statefulset_has_three_members_that_know_each_other():
    docs = kube.documents(os.path.join(KUBE, "etcd.yaml"))
    etcd = pod(docs, "StatefulSet")
    assert etcd["spec"]["replicas"] == 3
    args = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    cluster = next(a for a in args if a.startswith("--initial-cluster="))
    service = etcd["spec"]["serviceName"]
    assert cluster.split("=", 1)[1] == ",".join(
        f"etcd-{i}=http://etcd-{i}.{service}:2380" for i in range(3))
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "Service"} == {service,
                                                                               "etcd-client"}


def test_elastic_pytorchjob(capsys, workdir):
    job = pod(kube.documents(os.path.join(KUBE, "pytorchjob-elastic.yaml")), "PyTorchJob")
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"][0]
    env = {**kube.pytorchjob_env(job, "Worker", 1), **kube.container_env(container, {})}
    got = dry_run(capsys, kube.launch_argv(container), env)
    assert got["rdzv_backend"] == "etcd" and got["rdzv_endpoint"] == "etcd-client:2379"
    assert got["nnodes"] == "2:4" and got["nproc_per_node"] == 2
    assert got["rdzv_id"] == got["name"] == "resnet-elastic"
    assert got["max_restarts"] == 3 and got["storage_path"] == "s3://ml-runs/elastic-train"
    assert got["program"] == ["train.py", "--epochs", "90"]


@pytest.mark.parametrize("replica, rank", [("Master", 0), ("Worker", 1)])
def test_static_pytorchjob(capsys, workdir, replica, rank):
    job = pod(kube.documents(os.path.join(KUBE, "pytorchjob-static.yaml")), "PyTorchJob")
    container = job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"][
        "containers"][0]
    env = {**kube.pytorchjob_env(job, replica, 0), **kube.container_env(container, {})}
    got = dry_run(capsys, kube.launch_argv(container), env)
    assert got["rdzv_backend"] == "static" and got["node_rank"] == rank
    assert got["rdzv_endpoint"] == "resnet-static-master-0:23456" and got["nnodes"] == 2
    assert got["nproc_per_node"] == len(os.sched_getaffinity(0))  # auto, no GPU here
    assert got["name"] == "resnet-static" and got["storage_path"] == "/runs"


def _indexed_pod_fields(index, jobset=None):
    fields = {"metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index)}
    if jobset:
        fields["metadata.labels['jobset.sigs.k8s.io/jobset-name']"] = jobset
    return fields


@pytest.mark.parametrize("index", [0, 1])
def test_indexed_job(capsys, workdir, index):
    job = pod(kube.documents(os.path.join(KUBE, "job-indexed.yaml")), "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = kube.container_env(container, _indexed_pod_fields(index))
    got = dry_run(capsys, kube.launch_argv(container), env)
    assert got["rdzv_backend"] == "static" and got["node_rank"] == index
    assert got["rdzv_endpoint"] == "train-0.train:29500" and got["name"] == "train"
    subdomain = job["spec"]["template"]["spec"]["subdomain"]
    assert got["rdzv_endpoint"].split(":")[0] == f"{job['metadata']['name']}-0.{subdomain}"


@pytest.mark.parametrize("index", [0, 1])
def test_jobset(capsys, workdir, index):
    jobset = pod(kube.documents(os.path.join(KUBE, "jobset.yaml")), "JobSet")
    (replicated,) = jobset["spec"]["replicatedJobs"]
    container = replicated["template"]["spec"]["template"]["spec"]["containers"][0]
    env = kube.container_env(container, _indexed_pod_fields(index, jobset["metadata"]["name"]))
    got = dry_run(capsys, kube.launch_argv(container), env)
    first_pod = f"bert-{replicated['name']}-0-0.bert"  # JobSet's pod names and subdomain
    assert got["rdzv_endpoint"] == f"{first_pod}:29500" and got["node_rank"] == index
    assert got["nnodes"] == replicated["template"]["spec"]["parallelism"] == 2
    assert got["nproc_per_node"] == 8 and got["name"] == "bert"


def _sbatch() -> tuple[dict[str, str], list[str], dict[str, str]]:
    """The script's #SBATCH options, its srun's launch arguments, and its exports."""
    text = open(SBATCH).read()
    options = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    exports = dict(re.findall(r"^export (\w+)=(\S+)", text, re.M))
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    words = srun.split()
    return options, words[words.index("launch") + 1:], exports


def test_sbatch_script_is_valid_bash():
    subprocess.run(["bash", "-n", SBATCH], check=True, timeout=30)


@pytest.mark.parametrize("node", [0, 1])
def test_sbatch_gives_each_node_the_allocation(capsys, workdir, node):
    """What Slurm sets on each node of the script's allocation, and the script's srun line."""
    options, argv, exports = _sbatch()
    nodes = int(options["nodes"])
    env = {"SLURM_JOB_ID": "918273", "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NODEID": str(node),
           "SLURM_JOB_NODELIST": f"gpu[01-{nodes:02d}]",
           "SLURM_NTASKS_PER_NODE": options["ntasks-per-node"],
           "SLURM_GPUS_ON_NODE": options["gpus-per-node"], **exports}
    got = dry_run(capsys, argv, env)
    assert got["nnodes"] == nodes == 2 and got["nproc_per_node"] == 8
    assert got["rdzv_backend"] == "c10d" and got["rdzv_endpoint"] == "gpu01:28273"
    assert got["rdzv_id"] == got["name"] == "918273"  # a requeue keeps it: the run continues
    assert got["max_restarts"] == 3 and got["storage_path"] == exports["PET_STORAGE_PATH"]
    assert "#SBATCH --requeue" in open(SBATCH).read()
