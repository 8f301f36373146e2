"""Which library the (c) driver and its hooks import: elastic-train, or Ray Train.

Variant (e) runs the very same driver and hooks with ``BENCH_TRAIN_API=ray``:
the port is only the imports (``ray.train`` for ``elastic_train``,
``ray.train.torch`` for ``elastic_train.torch``), which is the claim the
project makes for Ray Train scripts.
"""

from __future__ import annotations

import importlib
import os

API_ENV = "BENCH_TRAIN_API"
NAME = "ray.train" if os.environ.get(API_ENV) == "ray" else "elastic_train"

train = importlib.import_module(NAME)
train_torch = importlib.import_module(f"{NAME}.torch")
