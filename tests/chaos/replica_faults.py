"""The chaos suite's fault on peer replicas: ``replica_lost``.

A two-node job (two ``fit()`` drivers of one worker each, c10d, on S3, every node
keeping a copy of the other's checkpoint files: ``CheckpointConfig(peer_replicas=1)``)
in which, at the trial's time, the trial's rank wipes its node's local tier and the copy
its peer held is lost with it, then the rank raises. The restart finds neither: the
node must fall back to the store for its share, and the run must end bit-identical,
with nothing lost (see :func:`tests.support.peer_faults.run_two_nodes`).
"""

from __future__ import annotations

from tests.chaos.faults import EPOCHS, NUM_TO_KEEP, Outcome, StorageWatcher, Trial, _outcome
from tests.conftest import StorageUnderTest
from tests.support.peer_faults import run_two_nodes
from tests.support.servers import free_port


def run_replica_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str
                      ) -> Outcome:
    run_storage = storage.run(name)
    with StorageWatcher(run_storage) as watcher:
        ran = run_two_nodes(
            storage, tmp_path, {"backend": "c10d", "endpoint": f"127.0.0.1:{free_port()}"},
            {"how": "wipe_tier", "peer": "lose", "rank": trial.rank, "epoch": trial.epoch,
             "batch": trial.batch, "marker": str(tmp_path / "fault")},
            name=name, epochs=EPOCHS,
            checkpoint={"num_to_keep": NUM_TO_KEEP, "peer_replicas": 1},
            train={"ballast_mb": 1, "upload_mode": "SYNC",
                   "events_file": str(tmp_path / "events")})
    outcome = _outcome(ran.digest, run_storage, watcher, tmp_path)
    if ran.codes != [0, 0]:
        outcome.kind_failures.append(f"exit codes {ran.codes}: {ran.logs[0][-1500:]}")
    elif not ran.store_reads:
        outcome.kind_failures.append(
            f"the wiped node read no checkpoint file from the store, though its tier and "
            f"its peer's copy were gone (held: {ran.held})")
    return outcome
