"""A worker for many-agent rendezvous tests (no torch, started with ``--no-python``).

    rdzv_light_worker.py OUT_DIR [SECONDS]

Appends "<group rank> <world size> <pid>" to OUT_DIR/starts when it starts, then
waits until OUT_DIR/stop exists (or SECONDS passed) and exits 0.
"""

import os
import sys
import time

if __name__ == "__main__":
    out = sys.argv[1]
    until = time.monotonic() + (float(sys.argv[2]) if len(sys.argv) > 2 else 3600.0)
    with open(os.path.join(out, "starts"), "a") as f:
        f.write(f"{os.environ['GROUP_RANK']} {os.environ['WORLD_SIZE']} {os.getpid()}\n")
    while not os.path.exists(os.path.join(out, "stop")) and time.monotonic() < until:
        time.sleep(0.1)
