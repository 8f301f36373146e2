"""Bad trainer inputs raise ConfigError in the driver, before any process starts."""

import json
import os
import threading

import fsspec
import pytest

import elastic_train as et
from elastic_train import ConfigError
from elastic_train._internal import devices
from elastic_train.storage import RunStorage
from elastic_train.storage.run_state import RunState, RunStatus
from elastic_train.torch import TorchConfig, TorchTrainer
from tests.conftest import child_pids
from tests.support.file_tree import snapshot
from tests.support.jobs import make_dataset
from tests.support.servers import s3_options


def train(config):
    pass


def two_args(config, extra):
    pass


def make_trainer(storage_path, scaling=None, run=None, **overrides):
    kwargs = {
        "train_loop_per_worker": train,
        "scaling_config": et.ScalingConfig(**{"num_workers": 2, **(scaling or {})}),
        "run_config": et.RunConfig(**{"name": "run", "storage_path": storage_path,
                                      **(run or {})}),
        "datasets": {"train": make_dataset(8)},
    }
    kwargs.update(overrides)
    return TorchTrainer(**kwargs)


def file_as_storage(storage_path):
    with open(storage_path, "w") as f:
        f.write("a regular file")


def file_as_run_dir(storage_path):
    os.makedirs(storage_path)
    with open(os.path.join(storage_path, "run"), "w") as f:
        f.write("a regular file")


no_gpu = pytest.mark.skipif(devices.count("cuda"), reason="a GPU is visible")


def case(id, overrides, words, setup=None, marks=()):
    """``overrides()``: trainer arguments (built lazily: a bad config raises when built);
    ``setup(storage_path)``: prepares the storage before the snapshot."""
    return pytest.param(setup, overrides, words, id=id, marks=marks)


CASES = [
    case("num_workers-0", lambda: {"scaling": {"num_workers": 0}}, ["num_workers=0"]),
    case("max_failures-neg",
         lambda: {"run": {"failure_config": et.FailureConfig(max_failures=-2)}},
         ["max_failures=-2"]),
    case("score-order",
         lambda: {"run": {"checkpoint_config": et.CheckpointConfig(
             checkpoint_score_order="best")}},
         ["checkpoint_score_order='best'"]),
    case("use_gpu-without-gpu", lambda: {"scaling": {"use_gpu": True}},
         ["use_gpu=True", "0 are visible"], marks=no_gpu),
    case("two-params", lambda: {"train_loop_per_worker": two_args},
         ["'two_args'", "2 required arguments", "config, extra"]),
    case("not-callable", lambda: {"train_loop_per_worker": 42}, ["train_loop_per_worker=42"]),
    case("storage-is-file", dict, ["Cannot write", "results"], setup=file_as_storage),
    case("run-dir-is-file", dict, ["existing file", os.path.join("results", "run")],
         setup=file_as_run_dir),
    case("dataset-not-dataset", lambda: {"datasets": {"train": 5}}, ["datasets['train']=5"]),
    case("dataset-too-small", lambda: {"datasets": {"train": make_dataset(1)}},
         ["datasets['train']", "1 rows", "num_workers=2"]),
    case("datasets-not-dict", lambda: {"datasets": [make_dataset(8)]}, ["datasets=["]),
    case("metadata-not-json", lambda: {"metadata": {"when": object()}}, ["metadata", "object"]),
    case("config-not-dict", lambda: {"train_loop_config": [1]}, ["train_loop_config=[1]"]),
    case("mpi", lambda: {"torch_config": TorchConfig(backend="mpi")}, ["backend='mpi'"]),
    case("nccl-without-gpu", lambda: {"torch_config": TorchConfig(backend="nccl")},
         ["backend='nccl'", "use_gpu"]),
    case("init-method", lambda: {"torch_config": TorchConfig(init_method="file")},
         ["init_method='file'"]),
    case("timeout", lambda: {"torch_config": TorchConfig(timeout_s=0)}, ["timeout_s=0"]),
    case("torch_config-type", lambda: {"torch_config": "gloo"}, ["torch_config='gloo'"]),
    case("storage-protocol", lambda: {"run": {"storage_path": "nosuchproto://b/x"}},
         ["'nosuchproto://b/x'", "Protocol not known"]),
    case("resume-from-missing-dir",
         lambda: {"resume_from_checkpoint": et.Checkpoint("/no/such/checkpoint")},
         ["/no/such/checkpoint", "does not exist"]),
]


@pytest.mark.parametrize("setup, overrides, words", CASES)
def test_bad_input_raises_before_any_process(setup, overrides, words, tmp_path):
    storage_path = str(tmp_path / "results")
    if setup:
        setup(storage_path)
    before_files = snapshot(tmp_path)
    before_pids = set(child_pids(os.getpid()))
    with pytest.raises(ConfigError) as info:
        make_trainer(storage_path, **overrides()).fit()
    for word in words:
        assert word in str(info.value)
    assert set(child_pids(os.getpid())) <= before_pids
    assert snapshot(tmp_path) == before_files


def unpicklable_train():
    lock = threading.Lock()

    def train_with_lock(config):
        with lock:
            pass

    return train_with_lock


def test_unpicklable_closure_raises_before_any_process(tmp_path):
    storage_path = str(tmp_path / "results")
    before_pids = set(child_pids(os.getpid()))
    trainer = make_trainer(storage_path, train_loop_per_worker=unpicklable_train())
    with pytest.raises(ConfigError, match="pickled") as info:
        trainer.fit()
    assert "lock" in str(info.value)
    assert set(child_pids(os.getpid())) <= before_pids


def test_unpicklable_closure_leaves_no_running_record(tmp_path):
    storage_path = str(tmp_path / "results")
    trainer = make_trainer(storage_path, train_loop_per_worker=unpicklable_train())
    with pytest.raises(ConfigError, match="pickled"):
        trainer.fit()
    state = RunStorage.open(storage_path, "run").read_run_state()
    assert state is None or state.status is not RunStatus.RUNNING


def test_fit_on_finished_run_raises(tmp_path):
    storage_path = str(tmp_path / "results")
    storage = RunStorage.open(storage_path, "run")
    storage.ensure_writable()
    storage.write_run_state(RunState(status=RunStatus.FINISHED))
    before_files = snapshot(tmp_path)
    before_pids = set(child_pids(os.getpid()))
    with pytest.raises(ConfigError, match="already finished") as info:
        make_trainer(storage_path).fit()
    assert str(tmp_path / "results" / "run") in str(info.value)
    assert set(child_pids(os.getpid())) <= before_pids
    assert snapshot(tmp_path) == before_files
    with open(tmp_path / "results" / "run" / "run.json") as f:
        assert json.load(f)["status"] == "finished"


def test_restore_of_a_launch_run_points_to_the_cli(tmp_path):
    storage = RunStorage.open(str(tmp_path), "launched")
    storage.ensure_writable()
    storage.write_run_state(RunState(status=RunStatus.INTERRUPTED,
                                     spec={"command": ["elastic-train"]}))
    with pytest.raises(ConfigError, match="run of `elastic-train launch`.*elastic-train restore"):
        TorchTrainer.restore(tmp_path / "launched")


def test_required_keyword_only_parameter_is_rejected(tmp_path):
    def train_kw(config, *, lr):
        pass

    with pytest.raises(ConfigError, match="lr"):
        make_trainer(str(tmp_path / "results"), train_loop_per_worker=train_kw)


def test_fit_does_not_name_the_callers_run_config(tmp_path):
    run_config = et.RunConfig(storage_path=str(tmp_path / "results"))
    trainer = TorchTrainer(unpicklable_train(), run_config=run_config)
    with pytest.raises(ConfigError, match="pickled"):
        trainer.fit()
    assert run_config.name is None


def test_a_one_node_job_with_a_spare_is_named_by_its_rendezvous_id(tmp_path):
    """Every node of it (the spare too) must pick the same run name, as across nodes."""
    rendezvous = et.RendezvousConfig(backend="etcd", endpoint="h:2379", run_id="job42")
    trainer = TorchTrainer(lambda: None, run_config=et.RunConfig(
        storage_path=str(tmp_path)), scaling_config=et.ScalingConfig(
        num_workers=2, num_workers_per_node=2, rendezvous=rendezvous, spare_nodes=1))
    assert trainer._experiment_name() == "job42"


def test_mistyped_bucket_is_rejected_not_created(s3_endpoint):
    """s3fs's makedirs would create the bucket of a typo; the driver names it instead.
    A missing prefix inside an existing bucket is created by the first write."""
    options = s3_options(s3_endpoint)
    fs = fsspec.filesystem("s3", **options)
    bucket = f"typo-{os.getpid()}"
    with pytest.raises(ConfigError, match=f"bucket s3://{bucket} .*does not exist"):
        make_trainer(f"s3://{bucket}/results", run={"storage_options": options}).fit()
    assert not fs.exists(bucket)
    fs.mkdir(f"real-{os.getpid()}")
    RunStorage.open(f"s3://real-{os.getpid()}/new/prefix", "run", options=options) \
        .ensure_writable()


def test_fit_inside_a_launched_worker_is_refused(tmp_path, monkeypatch):
    """Under `elastic-train launch` or torchrun each worker would start a job of its own."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job42")
    storage_path = str(tmp_path / "results")
    with pytest.raises(ConfigError, match="inside a worker.*job42.*on each node"):
        make_trainer(storage_path).fit()
    assert not os.path.exists(storage_path)
