"""Run storage through fsspec: the only part of the project that knows about fsspec."""

from elastic_train.storage.checkpoint_store import CheckpointStore, CommitManifest
from elastic_train.storage.run_storage import RunStorage

__all__ = ["CheckpointStore", "CommitManifest", "RunStorage"]
