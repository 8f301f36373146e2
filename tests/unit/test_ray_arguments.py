"""Ray arguments and functions a ported script may still use: every argument of
:mod:`elastic_train._internal.ray_arguments`' tables does what its kind says (honoured, ignored
with one warning -- an error under ELASTIC_TRAIN_RAY_STRICT=1 --, refused with the way
out), and removed functions end in an error that says what to do, never a bare
TypeError or AttributeError."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import re

import pytest

import elastic_train as et
import elastic_train.torch
from elastic_train._internal import ray_arguments as ra
from elastic_train.context import StorageInfo, TrainContext, WorkerEnv
from elastic_train.errors import ConfigError
from elastic_train.torch import TorchTrainer

# A value other than Ray's default for every argument of every table (a new entry without
# one fails test_every_argument_of_the_tables_is_tested).
SAMPLES = {
    "ScalingConfig": {"trainer_resources": {"CPU": 0}, "placement_strategy": "SPREAD",
                      "label_selector": {"zone": "a"}, "accelerator_type": "A100",
                      "elastic_resize_monitor_interval_s": 5.0, "use_tpu": True,
                      "topology": "4x4"},
    "ScalingConfig(resources_per_worker": {"memory": 2e9, "TPU": 4, "custom_thing": 1},
    "RunConfig": {"runtime_env": {"env_vars": {"A": "1"}}, "local_dir": "/tmp/ray_results",
                  "sync_config": object(), "progress_reporter": object(),
                  "log_to_file": True, "stop": {"loss": 0.1}},
    "RunConfig(worker_runtime_env": {"env_vars": {"A": "1"}, "config": {"eager_install": 1},
                                     "excludes": ["*.pt"], "pip": ["torch"],
                                     "working_dir": ".", "conda": "env"},
    "FailureConfig": {"fail_fast": True, "controller_failure_limit": 2},
    "CheckpointConfig": {"checkpoint_frequency": 2, "checkpoint_at_end": True},
    "TorchTrainer": {"dataset_config": object()},
    "ValidationConfig(ray_remote_kwargs": {
        "num_gpus": 1, "runtime_env": {"env_vars": {"B": "2"}}, "num_cpus": 0, "memory": 1e9,
        "resources": {"x": 1}, "accelerator_type": "A100", "label_selector": {"a": "b"},
        "scheduling_strategy": "SPREAD", "placement_group": object(),
        "placement_group_bundle_index": 1, "placement_group_capture_child_tasks": True,
        "object_store_memory": 1, "name": "validate", "enable_task_events": False,
        "_metadata": {}, "max_retries": 3, "retry_exceptions": True, "unknown_option": 1},
}
TABLES = {"ScalingConfig": ra.SCALING_CONFIG,
          "ScalingConfig(resources_per_worker": ra.RESOURCES_PER_WORKER,
          "RunConfig": ra.RUN_CONFIG, "RunConfig(worker_runtime_env": ra.RUNTIME_ENV,
          "FailureConfig": ra.FAILURE_CONFIG, "CheckpointConfig": ra.CHECKPOINT_CONFIG,
          "TorchTrainer": ra.TORCH_TRAINER,
          "ValidationConfig(ray_remote_kwargs": ra.RAY_REMOTE_KWARGS}


def _validate(checkpoint):
    return {}


def _build(owner: str, name: str, value):
    """The object a Ray script would build with ``name=value`` (a key of a dict argument
    for the owners with a parenthesis)."""
    if owner == "ScalingConfig(resources_per_worker":
        return et.ScalingConfig(resources_per_worker={"CPU": 1, name: value})
    if owner == "RunConfig(worker_runtime_env":
        return et.RunConfig(worker_runtime_env={name: value})
    if owner == "ValidationConfig(ray_remote_kwargs":
        return et.ValidationConfig(_validate, ray_remote_kwargs={name: value})
    if owner == "TorchTrainer":
        return TorchTrainer(lambda: None, **{name: value})
    return getattr(et, owner)(**{name: value})


def _entries(kind):
    return [pytest.param(owner, name, id=f"{owner}-{name}")
            for owner, table in TABLES.items() for name, argument in table.items()
            if argument.kind is kind and name != ra.OTHER]


def test_every_argument_of_the_tables_is_tested():
    assert {o: set(t) - {ra.OTHER} for o, t in TABLES.items()} == {
        o: set(s) - {"custom_thing", "pip", "working_dir", "conda", "unknown_option"}
        for o, s in SAMPLES.items()}


@pytest.mark.parametrize(("owner", "name"), _entries(ra.Kind.REFUSED) + [
    pytest.param("RunConfig(worker_runtime_env", key, id=f"runtime_env-{key}")
    for key in ("pip", "working_dir", "conda")] + [
    pytest.param("ValidationConfig(ray_remote_kwargs", "unknown_option", id="remote-other")])
def test_a_refused_argument_is_a_config_error_with_the_way_out(owner, name):
    with pytest.raises(ConfigError, match=rf"{re.escape(name)}\W*=.*no counterpart here: \w+"):
        _build(owner, name, SAMPLES[owner][name])


@pytest.mark.parametrize(("owner", "name"), _entries(ra.Kind.IGNORED) + [
    pytest.param("ScalingConfig(resources_per_worker", "custom_thing", id="custom-resource")])
def test_an_ignored_argument_warns_once_at_fit_or_is_an_error_when_strict(owner, name, caplog,
                                                                         monkeypatch):
    value = SAMPLES[owner][name]
    built = _build(owner, name, value)
    caplog.set_level(logging.WARNING, logger=ra.__name__)
    ra.warn_ignored(built, built)  # the same object twice: still one warning
    label = f"{name}={value!r})" if "(" not in owner else f"[{name!r}]={value!r})"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and label in warned[0] and " is ignored: " in warned[0], warned
    assert "ELASTIC_TRAIN_RAY_STRICT=1 makes this an error" in warned[0]
    monkeypatch.setenv("ELASTIC_TRAIN_RAY_STRICT", "1")
    with pytest.raises(ConfigError, match=rf"{re.escape(label)} is a Ray setting.*"
                                          "ELASTIC_TRAIN_RAY_STRICT=1 is set"):
        _build(owner, name, value)


def test_ray_defaults_are_accepted_silently_and_a_name_ray_lacks_stays_a_type_error():
    scaling = et.ScalingConfig(num_workers=2, placement_strategy="PACK", trainer_resources=None,
                               use_tpu=False, elastic_resize_monitor_interval_s=60.0)
    run = et.RunConfig(name="a", log_to_file=False, runtime_env=None, local_dir=None)
    failure = et.FailureConfig(fail_fast=False, controller_failure_limit=-1)
    validation = et.ValidationConfig(_validate, ray_remote_kwargs={"num_gpus": 0,
                                                                   "max_retries": 0})
    assert scaling.num_workers == 2 and failure.max_failures == 0 and validation.num_gpus == 0
    assert dataclasses.replace(run, name="b").name == "b"
    for built in (scaling, run, failure, validation):
        assert ra.notes_of(built) == {}
    with pytest.raises(TypeError):
        et.RunConfig(no_such_setting=1)


# honoured
def test_fail_fast_is_max_failures_zero_and_refuses_a_budget_beside_it():
    assert et.FailureConfig(fail_fast=True).max_failures == 0
    assert et.FailureConfig(fail_fast="raise", max_failures=0).max_failures == 0
    with pytest.raises(ConfigError, match=r"fail_fast=True, max_failures=2\).*must be 0"):
        et.FailureConfig(fail_fast=True, max_failures=2)
    with pytest.raises(ConfigError, match=r"fail_fast='yes'\) is invalid"):
        et.FailureConfig(fail_fast="yes")


def test_local_dir_is_the_storage_path_unless_one_is_given(monkeypatch):
    assert et.RunConfig(local_dir="/tmp/ray_results").storage_path == "/tmp/ray_results"
    both = et.RunConfig(storage_path="/mnt/shared", local_dir="/tmp/cache")
    assert both.storage_path == "/mnt/shared"
    assert list(ra.notes_of(both)) == ["RunConfig(local_dir='/tmp/cache')"]
    monkeypatch.setenv("ELASTIC_TRAIN_RAY_STRICT", "1")
    assert et.RunConfig(local_dir="/tmp/r").storage_path == "/tmp/r"  # honoured, strict or not
    with pytest.raises(ConfigError, match=r"local_dir='/tmp/cache'\).*STRICT=1 is set"):
        et.RunConfig(storage_path="/mnt/shared", local_dir="/tmp/cache")


def test_runtime_env_is_worker_runtime_env_and_keeps_only_env_vars():
    run = et.RunConfig(runtime_env={"env_vars": {"NCCL_SOCKET_IFNAME": "lo"}})
    assert run.worker_env_vars == {"NCCL_SOCKET_IFNAME": "lo"}
    assert "NCCL_SOCKET_IFNAME" not in repr(run)  # may hold secrets, as storage_options
    assert dataclasses.replace(run, name="x").worker_env_vars == {"NCCL_SOCKET_IFNAME": "lo"}
    assert et.RunConfig(worker_runtime_env={"env_vars": {}}).worker_runtime_env is None


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"runtime_env": {"env_vars": {"A": "1"}}, "worker_runtime_env": {"env_vars": {}}},
     r"runtime_env=\.\.\., worker_runtime_env=\.\.\.\): pass one"),
    ({"worker_runtime_env": {"env_vars": {"A": 1}}}, r"\['env_vars'\]=\{'A': 1\}\) must map "
                                                     "names to strings"),
    ({"worker_runtime_env": ["A=1"]}, r"worker_runtime_env=\['A=1'\]\) must be a dict"),
    ({"worker_runtime_env": {"env_vars": {"ELASTIC_TRAIN_ZYGOTE": "0"}}},
     r"sets \['ELASTIC_TRAIN_ZYGOTE'\].*driver's environment"),
])
def test_runtime_env_that_cannot_be_honoured_says_why(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        et.RunConfig(**kwargs)


def test_ray_remote_kwargs_num_gpus_must_fit_in_rank_0s_devices():
    one = et.ValidationConfig(_validate, ray_remote_kwargs={"num_gpus": 1, "num_cpus": 0})
    assert one.num_gpus == 1
    with pytest.raises(ConfigError, match=r"num_gpus': 1\}\) cannot be given.*rank 0 has 0 "
                                          r"\(ScalingConfig\(use_gpu=False"):
        TorchTrainer(lambda: None, validation_config=one)
    two = et.ValidationConfig(_validate, ray_remote_kwargs={"num_gpus": 2})
    gpu = et.ScalingConfig(use_gpu=True)
    with pytest.raises(ConfigError, match=r"rank 0 has 1 .*resources_per_worker=\{'GPU': 2\}"):
        two.check_devices(gpu)
    two.check_devices(et.ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 2}))
    et.ValidationConfig(_validate, ray_remote_kwargs={"num_gpus": 0.5}).check_devices(
        et.ScalingConfig(use_gpu=True, num_workers=2, resources_per_worker={"GPU": 0.5}))
    with pytest.raises(ConfigError, match=r"num_gpus': -1\}\) must be a number of GPUs"):
        et.ValidationConfig(_validate, ray_remote_kwargs={"num_gpus": -1})
    env = et.ValidationConfig(_validate, ray_remote_kwargs={
        "runtime_env": {"env_vars": {"HF_HOME": "/data"}}})
    assert env.env_vars == {"HF_HOME": "/data"}
    with pytest.raises(ConfigError, match=r"ray_remote_kwargs\['runtime_env'\]\['pip'\]"):
        et.ValidationConfig(_validate, ray_remote_kwargs={"runtime_env": {"pip": ["x"]}})


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


GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "porting-from-ray.md"
_SPAN = re.compile(r"`([^`]+)`")
_ARGUMENT = re.compile(r"(\w+)\((\w+)(?:\[(?:'(\w+)'|(any other key)|(\.\.\.))\])?\)")


def _arguments_section() -> str:
    """The guide's "The arguments" section (its other tables map Ray's modules)."""
    return GUIDE.read_text().split("\n## The arguments\n", 1)[1].split("\n## ", 1)[0]


def _guide_rows() -> set[tuple[str, str, str]]:
    """(owner as TABLES names it, argument or key, kind) of each row of the guide's table."""
    rows = set()
    for line in _arguments_section().splitlines():
        if not line.startswith("| `"):
            continue
        first, kind = (cell.strip() for cell in line.split(" | ")[:2])
        owner = None
        for span in _SPAN.findall(first.lstrip("| ")):
            if match := _ARGUMENT.fullmatch(span):
                cls, name, key, other, group = match.groups()
                if not (key or other or group):
                    rows.add((cls, name, kind.lower()))
                    continue
                owner = f"{cls}({name}"
                if not group:
                    rows.add((owner, key or ra.OTHER, kind.lower()))
            else:  # a key of the group opened before it
                rows.add((owner, span, kind.lower()))
    return rows


def test_the_porting_guide_lists_every_argument_with_its_kind():
    expected = {(owner, name, argument.kind.value) for owner, table in TABLES.items()
                for name, argument in table.items()}
    assert _guide_rows() == expected


def test_the_porting_guides_code_runs(capsys):
    for block in re.findall(r"```python\n(.*?)```", _arguments_section(), re.S):
        exec(compile(block, str(GUIDE), "exec"), {})
    assert "worker_runtime_env['pip']=['torch']) is a Ray setting" in capsys.readouterr().out
