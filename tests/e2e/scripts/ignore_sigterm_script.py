"""A launched worker that ignores SIGTERM (the preemption notice) and never ends: only the
SIGKILL at the end of the grace period stops it. Writes ``pid-<pid>`` into argv[1]."""

import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(sys.argv[1], f"pid-{os.getpid()}"), "w") as f:
    f.write("up\n")
while True:
    time.sleep(0.1)
