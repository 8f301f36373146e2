"""An object that keeps a checkpoint writer process busy: pickling it in any process but
the one that made it takes ``seconds``. Put in a state given to ``async_save``, it makes
the background write last that long, so that a test can kill a worker mid-write."""

from __future__ import annotations

import os
import time


class SlowToWrite:
    def __init__(self, seconds: float, owner: int | None = None):
        self.seconds = seconds
        self.owner = os.getpid() if owner is None else owner

    def __reduce__(self):
        if os.getpid() != self.owner:  # the writer process serialises it
            time.sleep(self.seconds)
        return SlowToWrite, (self.seconds, self.owner)
