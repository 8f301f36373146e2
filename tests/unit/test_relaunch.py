"""What restore makes of a launch run's stored command: the checks and the rewrite."""

from __future__ import annotations

import os

import pytest

from elastic_train.cli.relaunch import RunAt, plan_relaunch
from elastic_train.errors import ConfigError

SCRIPT = os.path.abspath(__file__)
AT = RunAt("/new/results", "job.failed-20260101T000000Z", None)


def plan(command, at=AT, trust=False, start_over=False):
    return plan_relaunch(["elastic-train", "launch", *command], at, "/stored/cwd", trust=trust,
                         start_over=start_over)


def test_the_path_given_replaces_the_stored_name_and_storage():
    argv = plan(["--name", "job", "--storage-path", "~/results", "--nproc-per-node", "2",
                 "--storage-option", "endpoint_url=old", SCRIPT, "--lr", "0.1"],
                at=RunAt("/new/results", "job.x", {"endpoint_url": "new"}), start_over=True)
    assert argv == ["--nproc-per-node", "2", "--name", "job.x", "--storage-path",
                    "/new/results", "--storage-option=endpoint_url=new", "--start-over",
                    SCRIPT, "--lr", "0.1"]


@pytest.mark.parametrize("command, message", [
    (["--no-python", "/bin/sh", "-c", "id"], "a --no-python program"),
    (["-m", "some.module"], "a -m module"),
])
def test_programs_and_modules_need_trust(command, message):
    with pytest.raises(ConfigError, match=message) as refused:
        plan(command)
    assert "--trust-command" in str(refused.value) and command[-1] in str(refused.value)
    assert plan(command, trust=True)[-len(command) + 1:] == command[1:]


def test_only_a_launch_is_ever_run_and_a_missing_script_names_where_it_was():
    with pytest.raises(ConfigError, match="not an `elastic-train launch`"):
        plan_relaunch(["sh", "-c", "id"], AT, "/c", trust=True, start_over=False)
    with pytest.raises(ConfigError, match="train.py does not exist .* launched from /stored"):
        plan(["train.py"])


def test_redacted_secrets_must_be_given_again(monkeypatch):
    monkeypatch.delenv("PET_RDZV_CONF", raising=False)
    with pytest.raises(ConfigError, match="PET_RDZV_CONF=password="):
        plan(["--rdzv-conf", "timeout=9,password=***", SCRIPT])
    monkeypatch.setenv("PET_RDZV_CONF", "password=hunter2")
    assert plan(["--rdzv-conf", "timeout=9,password=***", SCRIPT])[:2] \
        == ["--rdzv-conf", "timeout=9,password=hunter2"]
    with pytest.raises(ConfigError, match="storage options key were secrets"):
        plan(["--storage-option", "key=***", SCRIPT])
    assert "--storage-option=key=AK" in plan(["--storage-option", "key=***", SCRIPT],
                                             at=RunAt("/r", "n", {"key": "AK"}))
