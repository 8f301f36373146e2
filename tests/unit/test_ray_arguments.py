"""Ray arguments and functions a ported script may still use: each ends in an error
that names it and says what to do, never a bare TypeError or AttributeError."""

from __future__ import annotations

import dataclasses

import pytest

import elastic_train as et
import elastic_train.torch
from elastic_train.context import StorageInfo, TrainContext, WorkerEnv
from elastic_train.errors import ConfigError
from elastic_train.torch import TorchTrainer


@pytest.mark.parametrize(("make", "name"), [
    (lambda: et.ScalingConfig(num_workers=2, placement_strategy="SPREAD"), "placement_strategy"),
    (lambda: et.ScalingConfig(trainer_resources={"CPU": 4}), "trainer_resources"),
    (lambda: et.ScalingConfig(use_gpu=True, accelerator_type="A100"), "accelerator_type"),
    (lambda: et.ScalingConfig(use_tpu=True), "use_tpu"),
    (lambda: et.RunConfig(worker_runtime_env={"pip": ["x"]}), "worker_runtime_env"),
    (lambda: et.RunConfig(runtime_env={"env_vars": {"A": "1"}}), "runtime_env"),
    (lambda: et.RunConfig(stop={"loss": 0.1}), "stop"),
    (lambda: et.FailureConfig(fail_fast=True), "fail_fast"),
    (lambda: et.CheckpointConfig(checkpoint_frequency=2), "checkpoint_frequency"),
    (lambda: TorchTrainer(lambda: None, dataset_config={"train": 1}), "dataset_config"),
])
def test_unsupported_ray_argument_is_a_config_error_with_the_way_out(make, name):
    with pytest.raises(ConfigError, match=rf"\({name}=.*no counterpart here: \w+"):
        make()


def test_ray_defaults_of_unsupported_arguments_are_accepted():
    scaling = et.ScalingConfig(num_workers=2, placement_strategy="PACK", trainer_resources=None,
                               use_tpu=False)
    assert scaling.num_workers == 2
    run = dataclasses.replace(et.RunConfig(name="a", log_to_file=False), name="b")
    assert run.name == "b"
    with pytest.raises(TypeError):  # a name Ray does not have either stays Python's error
        et.RunConfig(no_such_setting=1)


@pytest.mark.parametrize("name", ["accelerate", "prepare_optimizer", "backward"])
def test_removed_v1_torch_helpers_raise_the_migration_message(name):
    with pytest.raises(DeprecationWarning, match=rf"{name}\(\) was removed in Ray Train v2.*"
                                                 "torch.autocast"):
        getattr(elastic_train.torch, name)(None)


@pytest.mark.parametrize("name", ["get_trial_name", "get_trial_id", "get_trial_dir",
                                  "get_trial_resources"])
def test_tune_only_context_methods_raise_what_to_use(name):
    env = WorkerEnv(0, 0, 1, 1, 0, "127.0.0.1", 1, 0, False, "0")
    context = TrainContext(env, "run", StorageInfo("/tmp", "run", "/tmp/run", None), {})
    with pytest.raises(DeprecationWarning, match=rf"{name}\(\) belongs to Ray Tune.*use "):
        getattr(context, name)()
