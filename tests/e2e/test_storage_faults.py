"""Storage faults injected for real: an S3 endpoint cut mid-run, a permanent outage,
a corrupted checkpoint, a worker killed while its upload is in flight; and credentials
that must stay out of the run directory."""

from __future__ import annotations

import os
import tempfile
import threading
import uuid

import fsspec
import pytest
import torch

import elastic_train as et
from elastic_train import collective
from elastic_train.storage import RunStorage
from elastic_train.storage.checkpoint_store import MARKER
from elastic_train.storage.upload_progress import UPLOADS_DIR
from elastic_train.torch import TorchTrainer
from tests.conftest import EPOCHS, StorageUnderTest, fit, make_storage, wait_until
from tests.support.servers import TcpProxy, s3_options

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]


@pytest.fixture
def proxied_s3(s3_endpoint, tmp_path):
    """An S3 storage reached through a proxy the test can cut."""
    direct = make_storage("s3", tmp_path, s3_endpoint)
    proxy = TcpProxy(int(s3_endpoint.rsplit(":", 1)[1]))
    through = StorageUnderTest(direct.url, s3_options(f"http://127.0.0.1:{proxy.port}"),
                               direct.fs)
    yield direct, through, proxy
    proxy.cut()


def _committed(storage: StorageUnderTest, name: str, index: int) -> bool:
    storage.fs.invalidate_cache()
    return storage.fs.exists(f"{storage.url}/{name}/checkpoint_{index:06d}/{MARKER}")


def test_s3_outage_of_seconds_is_survived(proxied_s3, baseline):
    direct, through, proxy = proxied_s3

    def outage():
        if wait_until(lambda: _committed(direct, "outage", 1), 120):
            proxy.cut()
            threading.Event().wait(4)
            proxy.restore()

    thread = threading.Thread(target=outage, daemon=True)
    thread.start()
    result = fit(through, "outage", config={"step_sleep": 0.1})
    thread.join(10)
    assert result.return_value["digest"] == baseline.return_value["digest"]
    state = direct.run("outage").read_run_state().to_json()
    assert state["status"] == "finished" and state["failures"] == []
    assert [c.path.rsplit("_", 1)[1] for c, _ in result.best_checkpoints] == \
        [f"{i:06d}" for i in range(EPOCHS)]


def test_permanent_s3_outage_fails_with_the_cause(proxied_s3):
    direct, through, proxy = proxied_s3
    through.options = {**through.options}
    thread = threading.Thread(
        target=lambda: wait_until(lambda: _committed(direct, "down", 0), 120) and proxy.cut(),
        daemon=True)
    thread.start()
    with pytest.raises(et.TrainingFailedError) as info:
        fit(StorageUnderTest(through.url, through.options, through.fs), "down",
            config={"step_sleep": 0.1}, storage_retry_timeout_s=3)
    message = str(info.value)
    assert direct.url.split("/")[2] in message  # the bucket, i.e. the storage URL
    assert "last error" in message


def test_corrupted_checkpoint_falls_back_to_previous(storage, tmp_path, baseline):
    fault = {"rank": 0, "epoch": 3, "how": "raise", "marker": str(tmp_path / "m")}
    with pytest.raises(et.TrainingFailedError):
        fit(storage, "corrupt", config={"fault": fault, "upload_mode": "SYNC"})
    latest = f"{storage.url}/corrupt/checkpoint_000002/state.pt"
    size = storage.fs.size(latest)
    storage.fs.pipe_file(latest, b"\0" * size)  # same size, other bytes
    starts = tmp_path / "starts"
    result = fit(storage, "corrupt", config={"starts_file": str(starts)})
    assert starts.read_text().split() == ["2"]  # checkpoint 2 rejected, resumed after 1
    assert result.return_value["digest"] == baseline.return_value["digest"]


def _named_epochs(config: dict) -> None:
    """Reports ``epoch_0``..``epoch_2`` by name (SYNC). The first attempt damages its
    committed ``epoch_1`` (rank 0 replaces its file) and fails on every rank; the next
    resumes from ``epoch_0`` and reports ``epoch_1`` again."""
    rank = et.get_context().get_world_rank()
    start = 0
    if (ckpt := et.get_checkpoint()) is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "epoch.txt")) as f:
            start = int(f.read()) + 1
    if rank == 0:
        with open(config["starts"], "a") as f:
            f.write(f"{start}\n")
    for epoch in range(start, 3):
        local = tempfile.mkdtemp()
        with open(os.path.join(local, "epoch.txt"), "w") as f:
            f.write(str(epoch))
        et.report({"epoch": epoch}, checkpoint=et.Checkpoint.from_directory(local) if rank == 0
                  else None, checkpoint_dir_name=f"epoch_{epoch}",
                  checkpoint_upload_mode=et.CheckpointUploadMode.SYNC)
        if epoch == 1 and start == 0:
            if rank == 0:
                damaged = os.path.join(config["run_path"], "epoch_1", "epoch.txt")
                with open(damaged + ".new", "w") as f:
                    f.write("9")  # same size, other bytes
                os.replace(damaged + ".new", damaged)
            collective.barrier()
            raise RuntimeError("the first attempt fails once epoch_1 is damaged")


@pytest.mark.timeout(120)
def test_a_damaged_checkpoints_name_is_free_for_the_attempt_that_reports_it_again(tmp_path):
    starts, run_path = tmp_path / "starts", tmp_path / "results" / "named"
    result = TorchTrainer(
        _named_epochs, train_loop_config={"starts": str(starts), "run_path": str(run_path)},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(name="named", storage_path=str(tmp_path / "results"),
                                failure_config=et.FailureConfig(max_failures=1))).fit()
    assert starts.read_text().split() == ["0", "1"]  # epoch_1 rejected, resumed after 0
    committed = RunStorage.open(str(tmp_path / "results"), "named").checkpoints.committed()
    assert [(m.name, (run_path / m.name / "epoch.txt").read_text()) for m in committed] == [
        ("epoch_0", "0"), ("epoch_1", "1"), ("epoch_2", "2")]
    # the damaged one is kept aside for a person to look at, under its number
    aside = run_path / ".damaged" / "000001.epoch_1"
    assert (aside / "epoch.txt").read_text() == "9" and (aside / MARKER).exists()
    assert [m.index for m in committed] == [0, 2, 3]  # its number is not reused
    assert result.checkpoint.path.endswith("/epoch_2")


def test_worker_killed_during_upload_leaves_no_partial_checkpoint(storage, tmp_path,
                                                                   baseline):
    """Rank 1 writes a large extra file into each checkpoint and dies right after
    reporting epoch 2, while that upload is in flight (ASYNC)."""
    fault = {"rank": 1, "epoch": 3, "batch": 0, "how": "sigkill", "marker": str(tmp_path / "m")}
    starts = tmp_path / "starts"
    result = fit(storage, "kill-upload", max_failures=1,
                 config={"fault": fault, "starts_file": str(starts),
                         "ballast_mb": 24, "upload_mode": "ASYNC"})
    assert result.return_value["digest"] == baseline.return_value["digest"]
    # Up to two checkpoints can be in flight (one uploading, one queued), and on a loaded
    # machine slow uploads may have committed none yet: the restart resumes after the
    # latest committed one, whichever that was, and ends bit-identical all the same.
    restarted_at = int(starts.read_text().split()[1])
    assert 0 <= restarted_at <= 3
    storage.fs.invalidate_cache()
    for path in storage.fs.ls(f"{storage.url}/kill-upload", detail=False):
        if path.rsplit("/", 1)[1].startswith("checkpoint_"):
            assert storage.fs.exists(f"{path}/{MARKER}"), f"partial checkpoint left: {path}"
            files = storage.fs.find(path)
            assert any(f.endswith("ballast.bin") for f in files)
    assert not storage.fs.exists(f"{storage.url}/kill-upload/{UPLOADS_DIR}") or \
        storage.fs.ls(f"{storage.url}/kill-upload/{UPLOADS_DIR}") == []
    if storage.url.startswith("s3://"):
        assert _open_multipart_keys(storage) == set()


def _open_multipart_keys(storage: StorageUnderTest) -> set[str]:
    bucket = storage.url.split("/")[2]
    listing = storage.fs.call_s3("list_multipart_uploads", Bucket=bucket)
    return {u["Key"] for u in listing.get("Uploads", [])}


def test_unfinished_multipart_uploads_are_aborted_at_cleanup(s3_endpoint, tmp_path):
    """What a writer killed mid-way through a large file leaves on S3: an open multipart
    upload with parts, invisible to listings. The next start aborts the run's own."""
    storage = make_storage("s3", tmp_path, s3_endpoint)
    run, other = storage.run("mpu"), storage.run("other-run")
    keys = []
    for path in (run.checkpoints.path(3) + "/big.bin", other.checkpoints.path(0) + "/x.bin"):
        bucket, key, _ = storage.fs.split_path(path)
        upload = storage.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
        storage.fs.call_s3("upload_part", Bucket=bucket, Key=key, PartNumber=1,
                           UploadId=upload["UploadId"], Body=b"x" * (5 << 20))
        keys.append(key)
    assert _open_multipart_keys(storage) == set(keys)
    run.checkpoints.remove_uncommitted()
    assert _open_multipart_keys(storage) == {keys[1]}  # another run's upload is not ours


def test_credentials_never_reach_the_run_directory(s3_endpoint, tmp_path):
    """A run on S3 that starts from an S3 checkpoint holds credentials twice (its
    storage_options, the checkpoint's filesystem); no file it writes holds them, and
    restore() hands the stored checkpoint the credentials restore() is given."""
    key, secret = f"id-{uuid.uuid4().hex}", f"secret-{uuid.uuid4().hex}"
    options = {**s3_options(s3_endpoint), "key": key, "secret": secret}
    storage = make_storage("s3", tmp_path, s3_endpoint)
    storage = StorageUnderTest(storage.url, options, fsspec.filesystem("s3", **options))
    seed = tmp_path / "seed"
    seed.mkdir()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.save({"model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "epoch": EPOCHS - 2},
               seed / "state.pt")
    storage.fs.put(str(seed / "state.pt"), f"{storage.url}/seed/state.pt")
    start = et.Checkpoint(f"{storage.url}/seed", storage.fs)
    starts = tmp_path / "starts"
    result = fit(storage, "creds", config={"starts_file": str(starts)},
                 resume_from_checkpoint=start)
    assert starts.read_text().split() == [str(EPOCHS - 1)]
    assert result.checkpoint is not None
    run_files = storage.fs.find(f"{storage.url}/creds")
    assert any(f.endswith("trainable.pkl") for f in run_files)
    assert any("/logs/" in f for f in run_files)
    for path in run_files:
        data = storage.fs.cat_file(path)
        assert secret.encode() not in data and key.encode() not in data, path
    restored = TorchTrainer.restore(f"{storage.url}/creds", storage_options=options)
    assert restored.resume_from_checkpoint.path == start.path
    assert restored.resume_from_checkpoint.filesystem.exists(f"{start.path}/state.pt")
