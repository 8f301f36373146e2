"""Config dataclasses: every validation raises ConfigError naming the field and value."""

import pytest

from elastic_train import (
    CheckpointConfig,
    ConfigError,
    FailureConfig,
    RendezvousConfig,
    RunConfig,
    ScalingConfig,
)

BAD = [
    pytest.param(lambda: ScalingConfig(num_workers=0), ["num_workers", "0"], id="workers-0"),
    pytest.param(lambda: ScalingConfig(num_workers=-1), ["num_workers", "-1"], id="workers-neg"),
    pytest.param(lambda: ScalingConfig(num_workers=True), ["num_workers", "True"],
                 id="workers-bool"),
    pytest.param(lambda: ScalingConfig(num_workers="2"), ["num_workers", "'2'"], id="workers-str"),
    pytest.param(lambda: ScalingConfig(resources_per_worker={"TPU": 1}),
                 ["resources_per_worker", "'TPU'"], id="resource-unknown"),
    pytest.param(lambda: ScalingConfig(resources_per_worker={"CPU": -2}),
                 ["resources_per_worker['CPU']", "-2"], id="resource-negative"),
    pytest.param(lambda: ScalingConfig(resources_per_worker={"GPU": 1}),
                 ["resources_per_worker['GPU']", "1", "use_gpu"], id="gpu-without-use-gpu"),
    pytest.param(lambda: ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 0.3}),
                 ["resources_per_worker['GPU']", "0.3"], id="gpu-not-packable"),
    pytest.param(lambda: ScalingConfig(resources_per_worker={"CPU": 1.5}),
                 ["resources_per_worker['CPU']", "1.5"], id="cpu-fractional"),
    pytest.param(lambda: ScalingConfig(num_workers=(3, 2), num_workers_per_node=1),
                 ["num_workers", "(3, 2)", "min <= max"], id="workers-range-reversed"),
    pytest.param(lambda: ScalingConfig(num_workers=(2, 4)),
                 ["num_workers=(2, 4)", "num_workers_per_node"], id="range-needs-per-node"),
    pytest.param(lambda: ScalingConfig(num_workers=6, num_workers_per_node=4),
                 ["num_workers=6", "num_workers_per_node=4", "multiple"], id="not-whole-nodes"),
    pytest.param(lambda: ScalingConfig(num_workers=4, num_workers_per_node=0),
                 ["num_workers_per_node=0", "--nproc-per-node"], id="per-node-0"),
    pytest.param(lambda: ScalingConfig(num_workers=4, num_workers_per_node=2),
                 ["RendezvousConfig(endpoint=", "--rdzv-endpoint", "PET_RDZV_ENDPOINT"],
                 id="nodes-need-endpoint"),
    pytest.param(lambda: ScalingConfig(num_workers=4, num_workers_per_node=2,
                                       rendezvous=RendezvousConfig(endpoint="h:1")),
                 ["RendezvousConfig(run_id=", "--rdzv-id"], id="nodes-need-run-id"),
    pytest.param(lambda: ScalingConfig(spare_nodes=-1), ["spare_nodes=-1", ">= 0"],
                 id="spares-negative"),
    pytest.param(lambda: ScalingConfig(spare_nodes=True), ["spare_nodes=True"],
                 id="spares-bool"),
    pytest.param(lambda: ScalingConfig(spare_nodes=1), ["spare_nodes=1", "every node joins",
                                                        "--rdzv-backend etcd"],
                 id="spares-need-a-rendezvous"),
    pytest.param(lambda: ScalingConfig(spare_nodes=1,
                                       rendezvous=RendezvousConfig.single_node("fit")),
                 ["spare_nodes=1", "endpoint and a run id"], id="spares-not-on-a-local-store"),
    pytest.param(lambda: ScalingConfig(spare_nodes=1, rendezvous=RendezvousConfig(
        backend="etcd", endpoint="h:2379")), ["spare_nodes=1", "run id"],
                 id="spares-need-a-run-id"),
    pytest.param(lambda: ScalingConfig(rendezvous="etcd:2379"),
                 ["rendezvous='etcd:2379'", "RendezvousConfig"], id="rendezvous-type"),
    pytest.param(lambda: RendezvousConfig(backend="static"),
                 ["backend='static'", "'etcd'", "launch"], id="rendezvous-static"),
    pytest.param(lambda: RendezvousConfig(conf="a=1"), ["conf='a=1'", "dict"],
                 id="rendezvous-conf-type"),
    pytest.param(lambda: FailureConfig(max_failures=-2), ["max_failures", "-2"],
                 id="failures-neg"),
    pytest.param(lambda: FailureConfig(max_failures=1.5), ["max_failures", "1.5"],
                 id="failures-float"),
    pytest.param(lambda: FailureConfig(restart_in_process="yes"),
                 ["restart_in_process", "'yes'"], id="in-process-type"),
    pytest.param(lambda: FailureConfig(unwind_timeout_s=0), ["unwind_timeout_s", "0"],
                 id="unwind-0"),
    pytest.param(lambda: FailureConfig(max_restarts_without_progress=0),
                 ["max_restarts_without_progress", "0", "-1"], id="no-progress-0"),
    pytest.param(lambda: CheckpointConfig(num_to_keep=0), ["num_to_keep", "0"], id="keep-0"),
    pytest.param(lambda: CheckpointConfig(peer_replicas=-1), ["peer_replicas", "-1", ">= 0"],
                 id="peer-replicas-negative"),
    pytest.param(lambda: CheckpointConfig(peer_replicas=True), ["peer_replicas", "True"],
                 id="peer-replicas-bool"),
    pytest.param(lambda: CheckpointConfig(checkpoint_score_order="best"),
                 ["checkpoint_score_order", "'best'"], id="order-best"),
    pytest.param(lambda: CheckpointConfig(checkpoint_score_attribute=""),
                 ["checkpoint_score_attribute", "''"], id="attribute-empty"),
    pytest.param(lambda: RunConfig(name="a/b"), ["RunConfig.name", "'a/b'"], id="name-slash"),
    pytest.param(lambda: RunConfig(start_over="yes"), ["RunConfig.start_over", "'yes'"],
                 id="start-over"),
    pytest.param(lambda: RunConfig(failure_config=3), ["failure_config", "3"],
                 id="failure-config-type"),
]


@pytest.mark.parametrize("make, words", BAD)
def test_invalid_values_raise_config_error_naming_field_and_value(make, words):
    with pytest.raises(ConfigError) as info:
        make()
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("make, words", BAD)
def test_the_error_carries_the_field_its_message_names(make, words):
    """Front-ends name a field their own way (launch: the flag) from ``field``, never by
    reading the message."""
    with pytest.raises(ConfigError) as info:
        make()
    field = info.value.field
    assert field is not None and field.split(".")[-1] in str(info.value)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_defaults_match_ray_train():
    assert ScalingConfig().num_workers == 1
    assert ScalingConfig(num_workers=None).num_workers == 1
    assert ScalingConfig().use_gpu is False
    assert FailureConfig().max_failures == 0
    assert CheckpointConfig().checkpoint_score_order == "max"
    assert CheckpointConfig().num_to_keep is None
    assert CheckpointConfig().checkpoint_score_attribute is None
    run = RunConfig()
    assert run.failure_config == FailureConfig()
    assert run.checkpoint_config == CheckpointConfig()
    assert run.storage_path


def test_max_restarts():
    assert FailureConfig(-1).max_restarts >= 2**31 - 1
    assert FailureConfig(0).max_restarts == 0
    assert FailureConfig(3).max_restarts == 3


def test_threads_per_worker_splits_cores():
    scaling = ScalingConfig(num_workers=2)
    assert scaling.threads_per_worker(2, cores=8) == 4
    assert scaling.threads_per_worker(3, cores=8) == 2
    assert scaling.threads_per_worker(16, cores=8) == 1
    assert scaling.threads_per_worker(2) >= 1


def test_threads_per_worker_cpu_resource_wins():
    scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 3})
    assert scaling.threads_per_worker(2, cores=64) == 3


@pytest.mark.parametrize("workers, gpu, needed", [
    (1, None, 1),
    (2, None, 2),
    (2, 0.5, 1),
    (3, 0.5, 2),
    (4, 0.25, 1),
    (5, 0.25, 2),
    (2, 2, 4),
])
def test_gpus_needed(workers, gpu, needed):
    resources = None if gpu is None else {"GPU": gpu}
    scaling = ScalingConfig(num_workers=workers, use_gpu=True, resources_per_worker=resources)
    assert scaling.gpus_needed() == needed


def test_no_gpus_without_use_gpu():
    scaling = ScalingConfig(num_workers=4)
    assert scaling.gpus_per_worker == 0
    assert scaling.gpus_needed() == 0


def test_nodes_map_to_torchruns_flags(monkeypatch):
    for name in ("PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF"):
        monkeypatch.delenv(name, raising=False)
    single = ScalingConfig(num_workers=3)
    assert (single.workers_per_node, single.nodes, single.rendezvous) == (3, (1, 1), None)
    elastic = ScalingConfig(num_workers=[4, 8], num_workers_per_node=2,
                            rendezvous=RendezvousConfig(backend="etcd", endpoint="e:2379",
                                                        run_id="job", conf={"password": "pw"}))
    assert elastic.num_workers == (4, 8) and elastic.nodes == (2, 4)  # --nnodes 2:4
    assert elastic.rendezvous.backend == "etcd"
    assert elastic.rendezvous.conf["last_call_timeout"] == 2  # fast-recovery defaults
    assert "password" not in elastic.without_secrets().rendezvous.conf
    assert elastic.rendezvous.conf["password"] == "pw"


def test_fit_inside_slurm_meets_on_the_allocations_first_host(monkeypatch):
    """The Python API reads the platform as launch does (elastic_train._internal.platforms)."""
    for name in ("PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"SLURM_JOB_ID": "99", "SLURM_JOB_NUM_NODES": "2",
                        "SLURM_JOB_NODELIST": "gpu[3-4]", "MASTER_PORT": "29555"}.items():
        monkeypatch.setenv(name, value)
    scaling = ScalingConfig(num_workers=16, num_workers_per_node=8)
    assert (scaling.rendezvous.backend, scaling.rendezvous.endpoint,
            scaling.rendezvous.run_id) == ("c10d", "gpu3:29555", "99")
    explicit = RendezvousConfig(backend="etcd", endpoint="etcd:2379", run_id="mine")
    assert (explicit.endpoint, explicit.run_id) == ("etcd:2379", "mine")
    etcd = RendezvousConfig(backend="etcd")  # Slurm's endpoint is a c10d store, not etcd
    assert etcd.endpoint is None and etcd.run_id == "99"


def test_rendezvous_settings_come_from_torchruns_environment(monkeypatch):
    monkeypatch.setenv("PET_RDZV_BACKEND", "etcd")
    monkeypatch.setenv("PET_RDZV_ENDPOINT", "etcd-host:2379")
    monkeypatch.setenv("PET_RDZV_ID", "job7")
    monkeypatch.setenv("PET_RDZV_CONF", "last_call_timeout=5,protocol=https")
    scaling = ScalingConfig(num_workers=4, num_workers_per_node=2)
    assert (scaling.rendezvous.backend, scaling.rendezvous.endpoint,
            scaling.rendezvous.run_id) == ("etcd", "etcd-host:2379", "job7")
    assert scaling.rendezvous.conf["last_call_timeout"] == 5
    assert scaling.rendezvous.conf["protocol"] == "https"
    monkeypatch.setenv("PET_RDZV_CONF", "novalue")
    with pytest.raises(ConfigError, match="PET_RDZV_CONF item 'novalue'"):
        RendezvousConfig()


def test_spare_nodes_on_an_elastic_rendezvous():
    """Spares (our addition) wait in a rendezvous every node joins; they are not workers."""
    rendezvous = RendezvousConfig(backend="etcd", endpoint="h:2379", run_id="job42")
    scaling = ScalingConfig(num_workers=4, num_workers_per_node=2, rendezvous=rendezvous,
                            spare_nodes=1)
    assert scaling.spare_nodes == 1 and scaling.nodes == (2, 2) and scaling.spans_nodes
    one = ScalingConfig(num_workers=2, num_workers_per_node=2, rendezvous=rendezvous,
                        spare_nodes=1)
    assert one.nodes == (1, 1) and one.spans_nodes  # the spare meets it: a shared name
    assert ScalingConfig().spare_nodes == 0 and not ScalingConfig().spans_nodes


def test_replacing_stragglers_needs_spares_checked_on_the_node_run_path(tmp_path, monkeypatch):
    """``StragglerConfig(replace=True)`` without ``spare_nodes``: refused by fit() before
    anything starts (the rule between the configs, once: ``check_together``)."""
    from elastic_train import StragglerConfig
    from elastic_train.config import check_together
    from elastic_train.torch import TorchTrainer

    replacing = RunConfig(straggler_config=StragglerConfig(replace=True))
    rendezvous = RendezvousConfig(backend="etcd", endpoint="h:2379", run_id="job42")
    check_together(replacing, ScalingConfig(num_workers=2, num_workers_per_node=1,
                                            rendezvous=rendezvous, spare_nodes=1))
    check_together(RunConfig(), ScalingConfig())  # naming only: no spares needed
    started = []
    monkeypatch.setattr("elastic_train.driver.node_run.NodeRun.__enter__",
                        lambda self: started.append(self))
    trainer = TorchTrainer(lambda: None, run_config=RunConfig(
        name="r", storage_path=str(tmp_path), straggler_config=StragglerConfig(replace=True)))
    with pytest.raises(ConfigError) as caught:
        trainer.fit()
    assert caught.value.field == "StragglerConfig.replace"
    assert "ScalingConfig.spare_nodes=0" in str(caught.value)
    assert "ScalingConfig(spare_nodes=1)" in str(caught.value)
    assert started == [] and list(tmp_path.iterdir()) == []
