"""Run storage through fsspec: the run directory, checkpoint commits, retention, retries.

Only this package turns a storage path or URL into a filesystem
(:func:`.filesystem.resolve`), and only its ``stores/`` know how one store
differs from another (one adapter per store, picked by fsspec protocol in
:mod:`.stores`). Other parts hold an ``(fs, path)`` pair and use fsspec's common
methods on it (``Checkpoint``, ``Result``, the callbacks) or the helpers of
:mod:`.filesystem` (atomic writes, also of an agent's or worker's local status
files); none of them asks which store it holds.
"""

from elastic_train.storage.checkpoint_store import CheckpointStore
from elastic_train.storage.manifest import CommitManifest
from elastic_train.storage.run_storage import RunStorage

__all__ = ["CheckpointStore", "CommitManifest", "RunStorage"]
