"""Which variants of a parametrized end-to-end test CI leaves to the long profile.

CI's time is bounded (.ci/run under 45 minutes on 2 cores), so where a test runs once
per backend, storage or signal, CI keeps the variant(s) that cover the path and the
others run with ``python -m pytest -m long``. The variants are listed here by node id,
each with what CI still runs in its place, so that the choice is made in one place.

``tests/conftest.py`` marks them ``long`` at collection; a listed id that matches no
test of a collected file is a usage error (a renamed test must not slip back into CI
or out of both profiles unnoticed).
"""

from __future__ import annotations

import os

import pytest

# node id -> what CI runs in its place
LONG_VARIANTS = {
    "tests/e2e/test_node_liveness.py::test_a_lost_node_is_known_gone_at_once_and_charged_to_no_survivor[c10d-new-processes]":
        "[c10d-slow-heartbeats-in-process] (c10d) and [etcd-new-processes]",
    "tests/e2e/test_node_liveness.py::test_a_lost_node_is_known_gone_at_once_and_charged_to_no_survivor[c10d-in-process]":
        "[c10d-slow-heartbeats-in-process]: the same path, with heartbeats that cannot help",
    "tests/e2e/test_node_liveness.py::test_a_lost_node_is_known_gone_at_once_and_charged_to_no_survivor[etcd-in-process]":
        "[etcd-new-processes], and in-process restarts in [c10d-slow-heartbeats-in-process]",
    "tests/e2e/test_node_liveness.py::test_a_lost_node_is_known_gone_at_once_and_charged_to_no_survivor[c10d-slow-heartbeats-new-processes]":
        "[c10d-slow-heartbeats-in-process]",
    "tests/e2e/test_launch.py::test_three_agents_lose_one_and_take_one_back[c10d]":
        "[etcd] (also in the compat runs); c10d's lost node: test_node_loss_in_process.py",
    "tests/e2e/test_launch.py::test_relaunch_after_launcher_sigkill_resumes_bit_identical[restore]":
        "[relaunch]; `elastic-train restore` itself: test_restore.py, test_cli_storage.py",
    "tests/e2e/test_fit.py::test_worker_failure_resumes_bit_identical[s3-raise-SYNC]":
        "[local-raise-SYNC], and S3 in [s3-sigkill-ASYNC]",
    "tests/e2e/test_fit.py::test_worker_failure_resumes_bit_identical[s3-exit-SYNC]":
        "[local-exit-SYNC], and S3 in [s3-sigkill-ASYNC]",
    "tests/e2e/test_fit.py::test_worker_failure_resumes_bit_identical[s3-sigkill-SYNC]":
        "[local-sigkill-SYNC], and S3 in [s3-sigkill-ASYNC]",
    "tests/e2e/test_fsdp.py::test_async_save_commits_and_resumes[s3]":
        "[local]; FSDP shards on S3: test_sigkill_resumes_bit_identically_from_the_shards[s3]",
    "tests/e2e/test_fsdp.py::test_two_workers_checkpoint_continues_with_one[s3]":
        "[local]; FSDP shards on S3: test_sigkill_resumes_bit_identically_from_the_shards[s3]",
    "tests/e2e/test_failure_attribution.py::test_a_node_failing_the_same_way_every_attempt_ends_the_job[same-clock]":
        "[node0-clock-ahead]: the same verdict, with the clocks apart",
    "tests/e2e/test_node_sigterm.py::test_sigterm_to_every_process_gives_a_committed_jit_checkpoint[no-zygote]":
        "[zygote], the default (workers forked from the zygote)",
    "tests/e2e/test_validation.py::test_validation_metrics_land_in_the_row_and_drive_retention[s3]":
        "[local]; validations on S3: test_ray_guide_ports.py's async validation guide",
    "tests/e2e/test_node_loss_in_process.py::test_a_joining_node_leaves_the_running_workers_in_their_processes[etcd]":
        "[c10d]; etcd's joins in process: test_etcd_native_agents.py, test_elastic_data.py",
    "tests/e2e/test_node_loss_in_process.py::test_lost_node_survivors_keep_their_processes[etcd]":
        "[c10d]; etcd's lost node: test_node_liveness.py[etcd-new-processes], "
        "test_launch.py's three agents [etcd]",
    "tests/e2e/test_observe.py::test_ls_and_show_on_finished_failed_and_interrupted_runs[s3]":
        "[local]; ls and show on S3: test_cli_storage.py",
    "tests/e2e/test_restore.py::test_restore_after_driver_sigkill_is_bit_identical[api]":
        "[cli]; TorchTrainer.restore: test_restore_old_run.py and the chaos kind "
        "driver_sigkill_restore",
    "tests/e2e/test_fit.py::test_driver_stopped_leaves_no_orphans_and_resumes[9]":
        "[2] (Ctrl-C); a SIGKILLed driver: test_restore.py[cli]",
    "tests/e2e/test_inprocess.py::test_launch_wrapper_restarts_in_process[exit-3]":
        "[raise-2] (also in the compat runs)",
}


def mark_long_variants(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the listed variants ``long``; refuses an id that no test of its file has when
    the whole file was collected (it was renamed or removed)."""
    collected = {item.nodeid for item in items}
    whole = [os.path.relpath(os.path.abspath(arg), config.rootpath)
             for arg in config.args if "::" not in arg]
    stale = [nodeid for nodeid in LONG_VARIANTS if nodeid not in collected and any(
        top == "." or nodeid.startswith(top.rstrip(os.sep) + "/") or
        nodeid.split("::")[0] == top for top in whole)]
    if stale:
        raise pytest.UsageError(f"tests/support/ci_profile.py names tests that do not exist "
                                f"(renamed or removed? fix LONG_VARIANTS): {stale}")
    for item in items:
        if item.nodeid in LONG_VARIANTS:
            item.add_marker(pytest.mark.long)
