"""The check before a restart: is the checkpoint to resume from intact?

Every file of the checkpoint is compared with its commit manifest (size and
CRC-32) exactly once, by one rank: the rank that uploaded it, modulo the new
world size (rank 0 for files of markers that recorded no rank). The ranks then
agree: if any found a bad file, all of them try the previous checkpoint.

Split this way, a rank checks (and, on a remote store, brings to its node) the
files it wrote itself -- with DCP's sharded checkpoints, exactly the shards it
reads back when the world size is unchanged. On a node that survived, they are
in its local tier already (see :mod:`.local_tier`) and nothing is downloaded;
a replacement node downloads its ranks' share. Nobody fetches the whole
checkpoint just to check it, and the checking runs on every rank at once.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable

from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_store import (
    CheckpointStore,
    file_matches,
)
from elastic_train.storage.local_tier import LocalTier, copy_checked
from elastic_train.storage.manifest import CommitManifest

logger = logging.getLogger(__name__)


def assigned_files(manifest: CommitManifest, rank: int, world_size: int) -> list[str]:
    """The files of ``manifest`` that ``rank`` of a group of ``world_size`` checks."""
    return sorted(rel for rel, info in manifest.files.items()
                  if info.get("rank", 0) % world_size == rank)


def check_share(store: CheckpointStore, manifest: CommitManifest, rank: int, world_size: int,
                tier: LocalTier | None) -> list[str]:
    """The files of this rank's share that do not match the manifest.

    On local disk the files are read in place. On a remote store each file is
    taken from the node's local tier when a good copy is there, else from a peer
    node's copy (see :mod:`.peer_replicas`), else downloaded into the tier
    (streamed and checked on the way when there is no tier).
    """
    fs, path = store.fs, store.path(manifest.index)
    rels = assigned_files(manifest, rank, world_size)
    if store.adapter.is_local:
        return [rel for rel in rels
                if not file_matches(os.path.join(path, rel), manifest.files[rel])]
    where = fsutil.display_path(fs, path)
    if tier is None:
        return [rel for rel in rels if not store.retry.call(
            f"checking {rel}", where, lambda r=rel: copy_checked(
                fs, fsutil.join(path, r), None, manifest.files[r]))]
    entry = tier.entry(fs, path, manifest.index)
    with entry.locked(fcntl.LOCK_SH):
        return [rel for rel in rels
                if tier.obtain(fs, path, entry, rel, manifest.files[rel]) is None]


def choose_intact(store: CheckpointStore, manifests: list[CommitManifest], rank: int,
                  world_size: int, all_ok: Callable[[bool], bool]) -> CommitManifest | None:
    """The newest of ``manifests`` (oldest first) that every rank found intact.

    Collective: every rank calls it with the same manifests; ``all_ok(mine)``
    tells whether every rank's share was intact. Afterwards the node's local tier
    keeps only the checkpoint chosen (see :mod:`.local_tier`).
    """
    tier = LocalTier.of_node()
    chosen = None
    for manifest in reversed(manifests):
        bad = check_share(store, manifest, rank, world_size, tier)
        if bad:
            logger.warning("Checkpoint %s is damaged: files not matching its manifest: %s.",
                           manifest.name, ", ".join(bad[:5]))
        if all_ok(not bad):
            chosen = manifest
            break
        if rank == 0:
            logger.warning("Resuming from a checkpoint older than %s.", manifest.name)
    if tier is not None:
        tier.prune(store.fs, store.run_path,
                   lambda index: chosen is not None and index == chosen.index)
    return chosen
