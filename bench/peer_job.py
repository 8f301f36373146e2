"""The script of figure 10b (bench/peer_figure.py), run by ``elastic-train launch`` on each
of two nodes (one worker each): every rank checkpoints a file of ``--size-mb`` random
bytes (its share) each epoch, SYNC, so that each report returns once every rank's
files are uploaded, kept and sent to the peer. After epoch ``--wipe-epoch``'s report,
rank 1 removes its node's whole local tier (a wiped disk, as a replacement node has
it) and exits 1; the restarted group resumes from the newest checkpoint.

Rank 1 appends to ``--events``/rank1.jsonl, at the restart, ``restored``: the time
before and after its first ``get_checkpoint()`` -- under ``launch`` the collective
start of the session, where each rank checks its share of the checkpoint against
the manifest and brings what its node lacks from a peer or the store -- the
share's size, and ``$PEER_BENCH_AGENT`` (which agent it runs under).

Usage: elastic-train launch ... bench/peer_job.py --size-mb N --epochs E --wipe-epoch W
--events DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import torch.distributed as dist

import elastic_train as et
from elastic_train.storage import node_settings

MIB = 1 << 20


def _note(events: str, rank: int, event: str, **fields) -> None:
    with open(os.path.join(events, f"rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("size-mb", "epochs", "wipe-epoch"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--events", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    before = time.time()
    checkpoint = et.get_checkpoint()
    after = time.time()
    start = 0
    if checkpoint is not None:
        info = checkpoint.get_commit_info()
        start = info.metrics["epoch"] + 1
        share = sum(i["size"] for i in info.files.values() if i["rank"] == rank)
        _note(args.events, rank, "restored", start=before, end=after, share_bytes=share,
              checkpoint=info.name, agent=int(os.environ["PEER_BENCH_AGENT"]))
    for epoch in range(start, args.epochs):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"share_{rank}.bin"), "wb") as f:
                f.write(os.urandom(args.size_mb * MIB))
            et.report({"epoch": epoch}, checkpoint=et.Checkpoint.from_directory(d),
                      checkpoint_upload_mode=et.CheckpointUploadMode.SYNC)
        marker = os.path.join(args.events, "wiped")
        if epoch == args.wipe_epoch and rank == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            shutil.rmtree(node_settings.current().tier_root)
            _note(args.events, rank, "wiped")
            os._exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
