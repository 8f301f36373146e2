"""A worker module for tests/e2e/test_zygote.py: ``main(argv)`` does what argv says."""

import os
import signal
import sys
import time


def main(argv: list[str]) -> None:
    action, *rest = argv
    print(f"pid {os.getpid()} cwd {os.getcwd()} value {os.environ.get('ZYGOTE_TEST_VALUE')}",
          flush=True)
    if action == "exit":
        sys.exit(int(rest[0]))
    if action == "threads":
        import torch

        print(f"threads {torch.get_num_threads()}", flush=True)
    if action == "seed":
        import torch

        print(f"seed {torch.initial_seed()}", flush=True)
    if action == "wait-for-term":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
        print("ready", flush=True)
        # Short sleeps: a signal that arrives between the print and a long sleep's system
        # call would run its handler only when that sleep ends (CPython checks for
        # signals between bytecodes and when a system call is interrupted).
        for _ in range(600):
            time.sleep(0.1)
    if action == "sleep":
        print("ready", flush=True)
        time.sleep(60)


if __name__ == "__main__":  # a worker started without the zygote
    main(sys.argv[1:])
