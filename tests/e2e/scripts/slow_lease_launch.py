"""``elastic-train launch`` on a store that is slow right after a lease claim is written.

    python -m tests.e2e.scripts.slow_lease_launch SECONDS LAUNCH_ARGS...

The node acquires the run's lease as every node does, but its *pending* claim
stays on the store for SECONDS before it looks at the others' claims (a slow
store: an S3 listing of many claims, a busy NFS server, a starved node). The
rest is the real ``elastic-train launch LAUNCH_ARGS...``.
"""

from __future__ import annotations

import sys
import time

from elastic_train.cli.main import main
from elastic_train.storage.lease import PENDING, Claim, LeaseDir


def _slow_after_pending_writes(seconds: float) -> None:
    write = LeaseDir.write

    def slow_write(self: LeaseDir, claim: Claim) -> None:
        write(self, claim)
        if claim.state == PENDING:
            time.sleep(seconds)

    LeaseDir.write = slow_write  # type: ignore[method-assign]


if __name__ == "__main__":
    _slow_after_pending_writes(float(sys.argv[1]))
    sys.exit(main(["launch", *sys.argv[2:]]))
