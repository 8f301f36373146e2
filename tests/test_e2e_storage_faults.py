"""Storage faults injected for real: an S3 endpoint cut mid-run, a permanent outage,
a corrupted checkpoint, a worker killed while its upload is in flight."""

from __future__ import annotations

import threading

import pytest

import elastic_train as et
from elastic_train.storage.checkpoint_store import MARKER
from tests.conftest import EPOCHS, StorageUnderTest, fit, make_storage, wait_until
from tests.servers import TcpProxy, s3_options

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
    state = direct.run("outage").read_run_state()
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
    assert not storage.fs.exists(f"{storage.url}/kill-upload/.uploads") or \
        storage.fs.ls(f"{storage.url}/kill-upload/.uploads") == []
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
