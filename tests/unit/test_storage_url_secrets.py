"""A password in the storage URL (``https://user:pw@host/...``, sftp, ftp, smb) is kept out
of everything fit() writes -- run.json, trainable.pkl and the scratch ``spec.pkl`` -- and
still reaches the workers (#24, item 4). The node run is replaced by a stand-in that keeps
what fit() hands it: no processes, no server."""

from __future__ import annotations

import json
import os
import types

import pytest

import elastic_train as et
from elastic_train.driver import trainer as trainer_module
from elastic_train.torch import TorchTrainer
from elastic_train.worker import fit_worker
from tests.support.jobs import make_dataset

SECRET = "hunter2-in-the-url"


def train(config):
    pass


class StandInNode:
    """What fit() gives its node run: the plan, and the worker command's environment."""

    seen: list[StandInNode] = []

    def __init__(self, plan):
        self.plan, self.env = plan, None
        StandInNode.seen.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, executable, args, env):
        self.spec_path, self.env = args[2], env  # -m MODULE SPEC SCRATCH


@pytest.mark.parametrize("url", [f"https://user:{SECRET}@storage.invalid/runs",
                                 f"sftp://user:{SECRET}@storage.invalid/runs"])
def test_a_password_in_the_storage_url_is_in_no_file_and_reaches_the_workers(
        url, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "NodeRun", StandInNode)
    monkeypatch.setattr(trainer_module.RunStorage, "for_run", lambda *a: None)
    reported = types.SimpleNamespace(metrics={"loss": 0.0}, checkpoint=None, path="run")
    monkeypatch.setattr(trainer_module.Result, "from_storage", lambda *a, **k: reported)
    StandInNode.seen.clear()
    StandInNode.scratch = str(tmp_path)
    TorchTrainer(train, scaling_config=et.ScalingConfig(num_workers=1),
                 run_config=et.RunConfig(name="run", storage_path=url),
                 datasets={"train": make_dataset(4)}).fit()
    node, = StandInNode.seen

    assert SECRET not in json.dumps(node.plan.spec)  # run.json
    assert SECRET.encode() not in node.plan.trainable  # trainable.pkl
    assert "user:***@storage.invalid" in json.dumps(node.plan.spec)
    with open(node.spec_path, "rb") as f:
        assert SECRET.encode() not in f.read()  # the scratch spec.pkl
    assert SECRET in url and node.plan.run_config.storage_path == url  # the driver's own

    opened = []

    def open_storage(run_config, name):
        opened.append(run_config.storage_path)
        raise KeyboardInterrupt  # stop the worker here

    monkeypatch.setattr(fit_worker, "open_run_storage", open_storage)
    for name, value in (node.env or {}).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(KeyboardInterrupt):
        fit_worker.run(node.spec_path, str(tmp_path))
    assert opened == [url]  # the worker reaches the store with its credentials
    assert os.path.basename(node.spec_path) == "spec.pkl"
