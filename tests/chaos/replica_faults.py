"""The chaos suite's faults on peer replicas: ``replica_lost`` and ``hostile_peer``.

A two-node job (two ``fit()`` drivers of one worker each, c10d, on S3, every node
keeping a copy of the other's checkpoint files: ``CheckpointConfig(peer_replicas=1)``)
in which, at the trial's time, the trial's rank wipes its node's local tier, then
raises (see :func:`tests.support.peer_faults.run_two_nodes`):

* ``replica_lost``: the copy its peer held is lost with it. The restart finds neither:
  the node must fall back to the store for its share.
* ``hostile_peer``: the peer's copy is kept, and a process without the job's keys
  (:mod:`tests.support.hostile_peer`) attacks both nodes' replica servers for the
  trial's ``hostile_s`` from just before the wipe, through the restore: forged PUTs of
  the node's files with their size and CRC-32, unsigned GETs, idle-connection floods.
  Every one of its requests must be refused.

Either way the run must end bit-identical, with nothing lost.
"""

from __future__ import annotations

import json

from tests.chaos.faults import EPOCHS, NUM_TO_KEEP, Outcome, StorageWatcher, Trial, _outcome
from tests.conftest import StorageUnderTest, pid_alive, wait_until
from tests.support.peer_faults import run_two_nodes
from tests.support.servers import free_port


def run_replica_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str
                      ) -> Outcome:
    run_storage = storage.run(name)
    hostile_s = trial.detail("hostile_s") or 0.0
    with StorageWatcher(run_storage) as watcher:
        ran = run_two_nodes(
            storage, tmp_path, {"backend": "c10d", "endpoint": f"127.0.0.1:{free_port()}"},
            {"how": "wipe_tier", "peer": "keep" if hostile_s else "lose", "rank": trial.rank,
             "epoch": trial.epoch, "batch": trial.batch, "marker": str(tmp_path / "fault"),
             "hostile_s": hostile_s},
            name=name, epochs=EPOCHS,
            checkpoint={"num_to_keep": NUM_TO_KEEP, "peer_replicas": 1},
            train={"ballast_mb": 1, "upload_mode": "SYNC",
                   "events_file": str(tmp_path / "events")})
    outcome = _outcome(ran.digest, run_storage, watcher, tmp_path)
    if ran.codes != [0, 0]:
        outcome.kind_failures.append(f"exit codes {ran.codes}: {ran.logs[0][-1500:]}")
    elif hostile_s:
        _check_attack(tmp_path / "out" / "hostile.json", hostile_s, outcome, ran.store_reads)
    elif not ran.store_reads:
        outcome.kind_failures.append(
            f"the wiped node read no checkpoint file from the store, though its tier and "
            f"its peer's copy were gone (held: {ran.held})")
    return outcome


def _check_attack(report_file, hostile_s: float, outcome: Outcome,
                  store_reads: list[str] | None) -> None:
    """The hostile process's report: it attacked, and nothing it sent was taken."""
    if not wait_until(report_file.exists, hostile_s + 30):
        outcome.kind_failures.append("the hostile peer wrote no report")
        return
    report = json.loads(report_file.read_text())
    wait_until(lambda: not pid_alive(report["pid"]), 10)  # it wrote the report as it ended
    outcome.orphans.append(report["pid"])
    requests = sum(report["statuses"].values())
    if report["accepted"]:
        outcome.kind_failures.append(f"requests without the job's key were served or "
                                     f"taken: {report['accepted'][:5]}")
    if requests == 0 or report["flood_opened"] == 0:
        outcome.kind_failures.append(f"the hostile peer did not attack: {report}")
    outcome.note = (f"hostile peer: {requests} requests, all refused "
                    f"({report['statuses']}); {report['flood_opened']} idle connections "
                    f"opened, {report['flood_cut']} closed or refused by the servers; the wiped "
                    f"node read {len(store_reads or [])} checkpoint files from the store "
                    f"{sorted(store_reads or [])}")
