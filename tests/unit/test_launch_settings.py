"""``elastic-train launch``'s settings from flags, PET_* variables, Slurm and Kubeflow, as
``--dry-run`` reports them (the same path a real launch takes), and its one-line errors
that name where a bad value came from."""

from __future__ import annotations

import json
import os

import pytest

import elastic_train as et
from elastic_train._internal.platforms import SLURM_PORT_BASE
from elastic_train.cli.launch_command import main_launch
from tests.support.paths import REPO

SCRIPT = "tests/e2e/scripts/plain_torchrun_script.py"


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def dry_run(capsys, argv, env=None):
    code = main_launch(["--dry-run", *argv], env or {})
    out, err = capsys.readouterr()
    assert code == 0, err
    return {key: entry if key == "notes" else (entry["value"], entry["source"])
            for key, entry in json.loads(out).items()}


def failure(capsys, argv, env=None):
    code = main_launch(argv, env or {})
    out, err = capsys.readouterr()
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("elastic-train: "), err
    assert "Traceback" not in err
    return err


@pytest.mark.compat  # torch before 2.12 defaults --master-port to 29500
def test_nothing_given_is_torchruns_single_node_static_job(capsys):
    got = dry_run(capsys, [SCRIPT])
    assert got["nnodes"] == (1, "default") and got["nproc_per_node"] == (1, "default")
    assert got["rdzv_backend"][0] == "c10d" and "local c10d store" in got["rdzv_backend"][1]
    assert got["rdzv_endpoint"][0] == "127.0.0.1:0"
    assert got["name"][0].startswith("launch_") and got["program"] == ([SCRIPT], "script")


def test_slurm_allocation_alone_on_a_compressed_node_list(capsys):
    env = {"SLURM_JOB_ID": "31337", "SLURM_JOB_NUM_NODES": "5", "SLURM_NODEID": "3",
           "SLURM_JOB_NODELIST": "gpu-a[01-03,07],gpu-b12", "SLURM_GPUS_ON_NODE": "4"}
    got = dry_run(capsys, [SCRIPT], env)
    port = SLURM_PORT_BASE + 31337 % 10000
    assert got["nnodes"] == (5, "SLURM_JOB_NUM_NODES")
    assert got["nproc_per_node"] == (4, "SLURM_GPUS_ON_NODE")
    assert got["rdzv_backend"] == ("c10d", "SLURM_JOB_NUM_NODES")
    assert got["rdzv_endpoint"] == (f"gpu-a01:{port}", "SLURM_JOB_NODELIST, SLURM_JOB_ID")
    assert got["rdzv_id"] == ("31337", "SLURM_JOB_ID")
    assert got["name"] == ("31337", "rdzv_id (SLURM_JOB_ID)")
    assert got["rdzv_conf"][0]["keep_alive_interval"] == 1  # our fast-recovery defaults


def test_one_slurm_node_is_a_local_job_named_after_the_job(capsys):
    """A requeued single-node job continues its run: its name is the job id."""
    env = {"SLURM_JOB_ID": "808", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "cpu7"}
    got = dry_run(capsys, [SCRIPT], env)
    assert got["rdzv_endpoint"][0] == "127.0.0.1:0" and got["nnodes"] == (1, "SLURM_JOB_NUM_NODES")
    assert got["name"] == ("808", "rdzv_id (SLURM_JOB_ID)")


def test_flags_and_pet_variables_win_over_slurm(capsys):
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "n[1-2]", "MASTER_PORT": "29999",
           "PET_NPROC_PER_NODE": "3", "PET_RDZV_ID": "mine"}
    got = dry_run(capsys, ["--rdzv-backend", "static", "--name", "exp", SCRIPT], env)
    assert got["rdzv_backend"] == ("static", "--rdzv-backend")
    assert got["rdzv_endpoint"] == ("n1:29999", "SLURM_JOB_NODELIST, MASTER_PORT")
    assert got["node_rank"] == (1, "SLURM_NODEID")
    assert got["nproc_per_node"] == (3, "PET_NPROC_PER_NODE")
    assert got["rdzv_id"] == ("mine", "PET_RDZV_ID") and got["name"] == ("exp", "--name")


def test_kubeflow_static_pytorchjob(capsys):
    """What the operator sets in a worker pod of a PyTorchJob without an elastic policy."""
    env = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "auto",
           "PET_MASTER_ADDR": "resnet-master-0", "PET_MASTER_PORT": "23456",
           "MASTER_ADDR": "resnet-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2",
           "RANK": "1", "PYTHONUNBUFFERED": "1"}
    got = dry_run(capsys, [SCRIPT], env)
    assert got["rdzv_backend"] == ("static", "default")
    assert got["rdzv_endpoint"] == ("resnet-master-0:23456", "PET_MASTER_ADDR, PET_MASTER_PORT")
    assert got["node_rank"] == (1, "PET_NODE_RANK")
    assert got["nproc_per_node"] == (len(os.sched_getaffinity(0)), "PET_NPROC_PER_NODE")
    assert got["name"][0] == "resnet" and "Kubeflow" in got["name"][1]


def test_kubeflow_elastic_pytorchjob_without_an_rdzv_id(capsys):
    env = {"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "bert-worker-0:29400",
           "PET_NNODES": "2:4", "PET_MAX_RESTARTS": "3", "PET_NPROC_PER_NODE": "2"}
    got = dry_run(capsys, [SCRIPT], env)
    assert got["nnodes"] == ("2:4", "PET_NNODES") and got["max_restarts"] == (3, "PET_MAX_RESTARTS")
    assert got["rdzv_id"][0] == "bert" and got["name"][0] == "bert"
    assert got["node_rank"][0] is None


def test_a_static_job_without_an_id_is_named_after_its_master(capsys):
    got = dry_run(capsys, ["--nnodes", "2", "--node-rank", "1", "--master-addr", "node0",
                           "--master-port", "29500", SCRIPT])
    assert got["name"][0] == "static-node0-29500"
    assert any("named static-node0-29500" in note for note in got["notes"])


def test_flags_we_do_not_honour_get_a_note(capsys):
    got = dry_run(capsys, ["--logs-specs", "custom", SCRIPT])
    assert got["notes"] == ["--logs-specs custom is not supported (the console and run logs "
                            "need torch's default log layout); ignored."]


@pytest.mark.parametrize("argv, env, words", [
    ([SCRIPT], {"PET_NPROC_PER_NODE": "many"}, ["PET_NPROC_PER_NODE='many'", "auto"]),
    ([SCRIPT], {"PET_NPROC_PER_NODE": "0"}, ["PET_NPROC_PER_NODE=0", ">= 1"]),
    ([SCRIPT], {"PET_MAX_RESTARTS": "abc"}, ["PET_MAX_RESTARTS='abc'", "whole number"]),
    ([SCRIPT], {"PET_MAX_RESTARTS": "-2"}, ["PET_MAX_RESTARTS=-2"]),
    ([SCRIPT], {"PET_STANDALONE": "yes"}, ["PET_STANDALONE='yes'", "1 (on) or 0"]),
    ([SCRIPT], {"PET_NNODES": "0"}, ["PET_NNODES='0'", "MIN:MAX"]),
    ([SCRIPT], {"PET_START_METHOD": "thread"}, ["PET_START_METHOD='thread'", "spawn"]),
    ([SCRIPT], {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "two"},
     ["SLURM_JOB_NUM_NODES='two'"]),
    ([SCRIPT], {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2",
                "SLURM_JOB_NODELIST": "gpu[1-"}, ["SLURM_JOB_NODELIST='gpu[1-'"]),
    (["--local-ranks-filter", "a,b", SCRIPT], {}, ["--local-ranks-filter='a,b'", "0,1"]),
    (["-r", "0:7", SCRIPT], {}, ["--redirects='0:7'", "0:1,1:2"]),
    (["--signals-to-handle", "SIGNOPE", SCRIPT], {}, ["'SIGNOPE'", "SIGUSR1"]),
    (["--no-python", "no-such-program-xyz"], {}, ["'no-such-program-xyz'", "PATH"]),
    (["-m", "--no-python", "python3"], {}, ["cannot be used together"]),
    (["--nnodes", "1:2", SCRIPT], {}, ["--nnodes='1:2'", "--rdzv-backend c10d"]),
    (["--nnodes", "2", "--node-rank", "2", SCRIPT], {}, ["--node-rank=2", "0 to 1"]),
    (["--max-restarts", "x", SCRIPT], {}, ["--max-restarts", "'x'"]),
    (["--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "h:2379", SCRIPT], {},
     ["--rdzv-id is required"]),
    (["--print-completion", "bash", SCRIPT], {}, ["torchrun --print-completion"]),
    ([SCRIPT], {"PET_UNWIND_TIMEOUT": "0"}, ["PET_UNWIND_TIMEOUT=0"]),
    (["--max-restarts-without-progress", "0", SCRIPT], {},
     ["--max-restarts-without-progress=0", "-1"]),
    (["--spares", "1", SCRIPT], {}, ["--spares=1 needs a "
                                     "rendezvous that every node joins"]),
    (["--spares", "1", "--rdzv-backend", "etcd", SCRIPT], {},
     ["--rdzv-endpoint is required", "--spares=1"]),
    (["--spares", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", SCRIPT], {},
     ["--rdzv-id is required"]),
    (["--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "h:1", "--rdzv-id", "j",
      SCRIPT], {"PET_SPARES": "-1"}, ["PET_SPARES=-1"]),
    (["--straggler-window", "0", SCRIPT], {},
     ["--straggler-window=0 is invalid", ">= 1"]),
    ([SCRIPT], {"PET_STRAGGLER_THRESHOLD": "0.9"},
     ["PET_STRAGGLER_THRESHOLD=0.9 is invalid", "> 1"]),
    (["--straggler-min-excess", "-1", SCRIPT], {},
     ["--straggler-min-excess=-1.0 is invalid"]),
    (["--replace-stragglers", "--straggler-cool-off", "-5", SCRIPT], {},
     ["--straggler-cool-off=-5.0 is invalid"]),
    (["--rdzv-backend", "etcd", SCRIPT], {"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "2",
                                          "SLURM_JOB_NODELIST": "n[1-2]"},
     ["--rdzv-endpoint is required for --rdzv-backend etcd"]),  # Slurm's is a c10d store
])
def test_bad_values_end_in_one_line_naming_their_source(capsys, argv, env, words):
    err = failure(capsys, argv, env)
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("argv, env, expected", [
    ([SCRIPT], {}, (True, 10.0, 3)),
    (["--no-restart-in-process", "--unwind-timeout", "2.5", "--max-restarts-without-progress",
      "-1", SCRIPT], {}, (False, 2.5, -1)),
    ([SCRIPT], {"PET_UNWIND_TIMEOUT": "4", "PET_MAX_RESTARTS_WITHOUT_PROGRESS": "5"},
     (True, 4.0, 5)),
])
def test_in_process_and_no_progress_flags_set_the_failure_config(monkeypatch, argv, env,
                                                                   expected):
    launched = []
    monkeypatch.setattr("elastic_train.driver.launch_run.launch",
                        lambda settings, argv: launched.append(settings) or 0)
    assert main_launch(argv, env) == 0
    failure = launched[0].run_config.failure_config
    assert (failure.restart_in_process, failure.unwind_timeout_s,
            failure.max_restarts_without_progress) == expected


@pytest.mark.parametrize("argv, env, expected", [
    ([SCRIPT], {}, et.StragglerConfig()),
    (["--straggler-threshold", "2", "--straggler-window", "3", "--straggler-min-excess", "0",
      SCRIPT], {}, et.StragglerConfig(score_threshold=2.0, window=3, min_excess_s=0.0)),
    ([SCRIPT], {"PET_STRAGGLER_WINDOW": "7"}, et.StragglerConfig(window=7)),
    (["--replace-stragglers", "--straggler-cool-off", "60", "--spares", "1",
      "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-id", "j",
      SCRIPT], {},
     et.StragglerConfig(replace=True, cool_off_s=60.0)),
    ([SCRIPT], {"PET_STRAGGLER_COOL_OFF": "5"}, et.StragglerConfig(cool_off_s=5.0)),
])
def test_straggler_flags_set_the_straggler_config(monkeypatch, argv, env, expected):
    launched = []
    monkeypatch.setattr("elastic_train.driver.launch_run.launch",
                        lambda settings, argv: launched.append(settings) or 0)
    assert main_launch(argv, env) == 0
    assert launched[0].run_config.straggler_config == expected


def test_spares_join_the_jobs_rendezvous_and_are_not_counted_as_nodes(capsys):
    """``--spares 1`` with one node on etcd: the spare makes it a job of several nodes (its
    id names the run on every node); the job's size stays --nnodes."""
    report = dry_run(capsys, ["--spares", "1", "--rdzv-backend", "etcd", "--rdzv-endpoint",
                              "h:2379", "--rdzv-id", "job42", SCRIPT])
    assert report["spares"] == (1, "--spares")
    assert report["nnodes"][0] == 1 and report["rdzv_endpoint"][0] == "h:2379"
    assert report["name"][0] == "job42"


def test_debug_shows_the_traceback(capsys):
    main_launch(["--debug", "--nnodes", "0", SCRIPT], {})
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("flags, zygote", [
    ({}, True),
    ({"numa_binding": "node"}, False),  # numactl wraps the worker's own command
    ({"run_path": True}, False),        # torchrun's --run-path with its default spawn
    ({"run_path": True, "start_method": "fork"}, True),
])
def test_which_workers_fork_from_the_zygote(flags, zygote):
    from elastic_train.driver.launch_settings import LaunchSettings

    assert LaunchSettings(target=SCRIPT, **flags).process.zygote is zygote


def test_python_exec_picks_the_workers_interpreter(monkeypatch):
    from elastic_train.driver.launch_settings import LaunchSettings

    monkeypatch.setenv("PYTHON_EXEC", "/opt/python3.12/bin/python")
    program, args = LaunchSettings(target=SCRIPT, target_args=["--lr", "1"]).worker_command()
    assert program == "/opt/python3.12/bin/python"
    assert args == ("-m", "elastic_train.worker.script_worker", SCRIPT, "--lr", "1")


def test_replacing_stragglers_without_spares_is_refused_before_anything_starts(
        capsys, tmp_path, monkeypatch):
    """The rule between the configs (``check_together``), on the node-run path: launch's
    one-line error names both settings, and no run directory is made."""
    started = []
    monkeypatch.setattr("elastic_train.driver.node_run.NodeRun.__enter__",
                        lambda self: started.append(self))
    err = failure(capsys, ["--replace-stragglers", "--storage-path", str(tmp_path), SCRIPT])
    assert "--replace-stragglers" in err and "--spares=0" in err and "--spares 1" in err, err
    assert "Config" not in err, err
    assert started == [] and list(tmp_path.iterdir()) == []
