"""FSDP2 + DCP sharded checkpoints end to end, on local disk and on S3 (moto): a SIGKILL
resumes bit-identically from every rank's shards, a 2-worker checkpoint continues
with 1 worker (DCP reshards), dcp.async_save checkpoints commit and resume, and on S3
a node that survived restarts from its local tier without downloading its shards."""

from __future__ import annotations

import json
import os

import cloudpickle
import pytest

import elastic_train as et
from elastic_train._internal import env_vars
from elastic_train.torch import TorchTrainer
from tests.conftest import StorageUnderTest, make_storage, pid_alive
from tests.support import fsdp_jobs
from tests.support.servers import TcpProxy, s3_options

cloudpickle.register_pickle_by_value(fsdp_jobs)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.usefixtures("no_leaked_processes")]

CONFIG = {"epochs": 3, "steps": 2}


def fit(storage, name, config, workers=2, max_failures=0):
    failures = et.FailureConfig(max_failures=max_failures)
    if isinstance(storage, str):
        run_config = et.RunConfig(storage_path=storage, name=name, failure_config=failures)
    else:
        run_config = storage.run_config(name, failure_config=failures)
    return TorchTrainer(fsdp_jobs.train_fsdp, train_loop_config={**CONFIG, **config},
                        scaling_config=et.ScalingConfig(num_workers=workers),
                        run_config=run_config).fit()


def notes_of(directory):
    """What each rank's restore noted (tests.support.fsdp_jobs._note), by rank."""
    notes = {}
    for path in sorted(directory.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            notes.setdefault(int(path.name[4:].split("-")[0]), []).append(json.loads(line))
    return notes


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted 2-worker run: the reference digest."""
    return fit(str(tmp_path_factory.mktemp("fsdp-straight")), "straight", {})


@pytest.mark.parametrize("storage", [pytest.param("local", marks=pytest.mark.compat), "s3"],
                         indirect=True)
def test_sigkill_resumes_bit_identically_from_the_shards(storage, tmp_path, straight):
    fault = {"rank": 1, "epoch": 1, "batch": 1, "how": "sigkill", "marker": str(tmp_path / "m")}
    result = fit(storage, "killed", {"fault": fault, "notes": str(tmp_path),
                                     "upload_mode": "SYNC"}, max_failures=1)
    assert result.return_value["digest"] == straight.return_value["digest"]
    notes = notes_of(tmp_path)
    assert sorted(notes) == [0, 1]
    for rank, [note] in notes.items():
        assert note["restored"].endswith("checkpoint_000000"), (rank, note)
        # the node survived: each rank reads its shards from local disk, nothing downloaded
        assert note["fetched"] == 0 and note["local"] > 0, (rank, note)
    info = result.checkpoint.get_commit_info()
    assert info.ranks == [0, 1] and info.world_size == 2
    assert sorted(info.files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert info.size_bytes == sum(f["size"] for f in info.files.values()) > 0


def test_two_workers_checkpoint_continues_with_one(storage, tmp_path):
    fault = {"rank": 0, "epoch": 2, "how": "raise", "marker": str(tmp_path / "m")}
    with pytest.raises(et.TrainingFailedError):
        fit(storage, "shrink", {"fault": fault, "upload_mode": "SYNC",
                                "digest_every_epoch": True})
    result = fit(storage, "shrink", {"notes": str(tmp_path)}, workers=1)
    [[note]] = notes_of(tmp_path).values()
    assert note["world_size"] == 1 and note["restored"].endswith("checkpoint_000001")
    saved = result.metrics_dataframe.set_index("training_iteration")["digest"]
    assert note["digest"] == saved[2]  # the whole state, as the two workers saved it
    assert result.return_value["world_size"] == 1
    assert result.checkpoint.get_commit_info().ranks == [0]


def test_async_save_commits_and_resumes(storage, tmp_path, straight):
    fault = {"rank": 1, "epoch": 2, "batch": 1, "how": "sigkill", "marker": str(tmp_path / "m")}
    result = fit(storage, "async", {"async_save": True, "fault": fault,
                                    "notes": str(tmp_path)}, max_failures=1)
    assert result.return_value["digest"] == straight.return_value["digest"]
    assert result.checkpoint.get_commit_info().ranks == [0, 1]
    assert result.metrics["training_iteration"] == CONFIG["epochs"]


@pytest.mark.compat
def test_a_worker_killed_during_a_background_write_resumes_from_the_checkpoint_before(
        tmp_path, straight):
    """elastic_train.torch.async_save: DCP's writer process writes the shards. Rank 1 is
    SIGKILLed while its shards of checkpoint 1 are being written: its writer dies with it,
    checkpoint 1 is never committed, and the run resumes from checkpoint 0 (rank 0 in
    process, with a new writer) to the same weights as a run without a fault."""
    marker = str(tmp_path / "m")
    fault = {"rank": 1, "epoch": 2, "batch": "saved", "how": "sigkill", "marker": marker}
    result = fit(str(tmp_path / "results"), "writer-killed",
                 {"process_save": True, "fault": fault, "notes": str(tmp_path),
                  "slow": {"epoch": 2, "rank": 1, "seconds": 120}}, max_failures=1)
    assert result.return_value["digest"] == straight.return_value["digest"]
    notes = notes_of(tmp_path)
    killed = next(n for n in notes[1] if n.get("epoch") == 2 and "in_flight" in n)
    assert killed["in_flight"] and killed["writer"] is not None
    assert killed["writer_policies"] == [os.SCHED_IDLE]  # every thread yields to training
    assert not pid_alive(killed["writer"])
    for rank in (0, 1):
        [restored] = [n["restored"] for n in notes[rank] if "restored" in n]
        assert restored.endswith("checkpoint_000000"), (rank, restored)
    info = result.checkpoint.get_commit_info()
    assert info.ranks == [0, 1] and info.index == 2
    assert sorted(info.files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.parametrize("keep", [True, False], ids=["local-tier", "tier-off"])
def test_a_surviving_node_restarts_without_downloading_its_shards(s3_endpoint, tmp_path,
                                                                  monkeypatch, keep):
    """What the node's driver and workers download from S3 between a worker's SIGKILL and
    the restored state, counted by a proxy: with the local tier, a few small JSON files;
    with ELASTIC_TRAIN_LOCAL_TIER=0, the whole checkpoint (both ranks are on this node)."""
    if not keep:
        monkeypatch.setenv(env_vars.LOCAL_TIER, "0")
    direct = make_storage("s3", tmp_path, s3_endpoint)
    proxy = TcpProxy(int(s3_endpoint.rsplit(":", 1)[1]))
    try:
        storage = StorageUnderTest(direct.url, s3_options(f"http://127.0.0.1:{proxy.port}"),
                                   direct.fs)
        marker = str(tmp_path / "m")
        fault = {"rank": 1, "epoch": 1, "batch": 1, "how": "sigkill", "marker": marker}
        result = fit(storage, "tier", {"fault": fault, "notes": str(tmp_path), "hidden": 256,
                                       "upload_mode": "SYNC"}, max_failures=1)
        restored = max(n["time"] for notes in notes_of(tmp_path).values() for n in notes)
        downloaded = proxy.downloaded_between(os.path.getmtime(marker), restored)
    finally:
        proxy.cut()
    info = result.checkpoint.get_commit_info()
    shard = info.files["__1_0.distcp"]["size"]
    assert shard > 400_000  # hidden 256: model and AdamW state, half of it per rank
    if keep:
        assert downloaded < shard / 4, downloaded
    else:
        assert downloaded >= info.size_bytes, downloaded
