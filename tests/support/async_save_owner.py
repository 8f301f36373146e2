"""``python -m tests.support.async_save_owner``: a process whose single-file
``async_save`` is still being written when it waits to be killed. It prints
``WRITING <directory>`` once its writer process has written one file and is busy
with the next (see :class:`tests.support.slow_write.SlowToWrite`)."""

from __future__ import annotations

import sys
import time

import torch

from elastic_train.torch import async_save
from tests.support.slow_write import SlowToWrite


def main() -> None:
    async_save({"w": torch.ones(4)}, "first.pt").written.result()  # the writer is up
    checkpoint = async_save({"w": torch.ones(4), "slow": SlowToWrite(120)}, "second.pt")
    print(f"WRITING {checkpoint.path}", flush=True)
    time.sleep(120)


if __name__ == "__main__":
    sys.exit(main())
