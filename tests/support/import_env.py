"""A user module that reads the worker's environment at import, as some do
(``DEVICE = f"cuda:{os.environ['LOCAL_RANK']}"``): each rank writes what it saw."""

import os

import elastic_train as et

IMPORTED_RANK = os.environ.get("RANK")


def train(config):
    rank = et.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"rank-{rank}"), "w") as f:
        f.write(str(IMPORTED_RANK))
