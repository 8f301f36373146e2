"""Which scratch directories a starting driver removes: this user's, by our prefixes,
whose recorded owner has ended -- judged by pid and start time, so a reused pid does
not keep a dead owner's directory, and an owner in another pid namespace is kept."""

from __future__ import annotations

import json
import os
import tempfile

from elastic_train._internal import process_identity, scratch


def test_only_directories_of_ended_owners_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = scratch.make(scratch.NODE_PREFIX)
    me = json.loads(open(os.path.join(mine, scratch.OWNER_FILE)).read())

    def made(name: str, **owner) -> str:
        path = tmp_path / name
        path.mkdir()
        (path / scratch.OWNER_FILE).write_text(json.dumps({**me, **owner}))
        return str(path)

    reused = made("et-zygote-reused", start_ticks="1")  # our pid, another process's start
    dead = made("elastic_train_dead", pid=2 ** 22 - 1)
    rebooted = made("elastic_train_rebooted", boot_id="another-boot")
    elsewhere = made("elastic_train_elsewhere", pid=2 ** 22 - 1, pid_namespace="pid:[1]")
    (tmp_path / "elastic_train_artifact_x").mkdir()  # no record: not a scratch of ours
    (tmp_path / "elastic_train_corrupt").mkdir()
    (tmp_path / "elastic_train_corrupt" / scratch.OWNER_FILE).write_text("{")
    other_prefix = made("checkpoint_dead", pid=2 ** 22 - 1)
    assert process_identity.is_running(os.getpid(), me["start_ticks"])
    assert sorted(scratch.sweep()) == sorted([reused, dead, rebooted])
    assert sorted(os.listdir(tmp_path)) == sorted(
        os.path.basename(p) for p in (mine, elsewhere, other_prefix, "elastic_train_artifact_x",
                                      "elastic_train_corrupt"))
