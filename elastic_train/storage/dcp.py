"""A ``torch.distributed.checkpoint`` (DCP) reader for checkpoints where they are stored.

``dcp.load(state, storage_reader=CheckpointReader(checkpoint))`` reads a sharded
checkpoint in place on any fsspec store, through the checkpoint's own
filesystem and credentials. Each rank fetches ``.metadata`` and the byte ranges
of the tensors it loads -- with an unchanged world size, its own shards -- not
every file, as ``as_directory()`` does. Files the node holds in its local tier
(:mod:`.local_tier`: what its ranks uploaded, or checked before the restart) are
read from local disk, once they match the commit manifest.

torch's ``FsspecReader`` also reads through fsspec, but builds its filesystem
from a URL and options (the credentials again), reads through the store's file
objects (s3fs fetches 50 MiB blocks) and knows no local copies. Ray Train has
no counterpart: there, a rank downloads the checkpoint's directory.

Ranges next to each other in a file are fetched in one request, up to
``request_bytes``; requests go out ``requests_at_once`` at a time (fsspec's
``cat_ranges``, concurrent on object stores), so a rank holds at most
``request_bytes * requests_at_once`` of raw bytes at once.
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pickle
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.local_tier import LocalTier
from elastic_train.storage.retry import run_policy
from elastic_train.storage.stores import adapter_for

if TYPE_CHECKING:
    from elastic_train.checkpoint import Checkpoint

logger = logging.getLogger(__name__)

METADATA = ".metadata"  # DCP's name for the file of the global plan and storage index
_MIB = 1 << 20


@dataclass
class _Span:
    """One request: a byte range of one file and the read items inside it."""

    relpath: str
    start: int
    end: int
    items: list[tuple[ReadItem, Any]] = field(default_factory=list)


def plan_spans(items: list[tuple[ReadItem, Any]], request_bytes: int,
               gap_bytes: int = 64 << 10) -> list[_Span]:
    """Groups ``(read item, storage info)`` pairs into requests: per file, by offset,
    merging ranges at most ``gap_bytes`` apart while the request stays within
    ``request_bytes`` (a single larger item gets a request of its own)."""
    spans: list[_Span] = []
    ordered = sorted(items, key=lambda pair: (pair[1].relative_path, pair[1].offset))
    for item, info in ordered:
        end = info.offset + info.length
        last = spans[-1] if spans else None
        if (last is not None and last.relpath == info.relative_path
                and info.offset - last.end <= gap_bytes
                and max(end, last.end) - last.start <= request_bytes):
            last.end = max(last.end, end)
        else:
            last = _Span(info.relative_path, info.offset, end)
            spans.append(last)
        last.items.append((item, info))
    return spans


class CheckpointReader(StorageReader):
    """Reads a DCP checkpoint in place: each rank fetches only what it loads.

    Our addition (Ray Train has none). Pass it to ``dcp.load`` instead of a
    ``checkpoint_id``; it works on local disk and any fsspec store, inside and
    outside workers. ``bytes_fetched`` / ``bytes_local`` count what it read from
    the store and from local disk.

    Args:
        checkpoint: The checkpoint, e.g. ``elastic_train.get_checkpoint()``.
        request_bytes: The largest byte range fetched in one request.
        requests_at_once: Requests in flight together.

    Example::

        import torch.distributed.checkpoint as dcp
        from elastic_train.torch import CheckpointReader

        if (checkpoint := elastic_train.get_checkpoint()):
            state = {"model": model_state, "optim": optim_state}   # the shapes to fill
            dcp.load(state, storage_reader=CheckpointReader(checkpoint))
    """

    def __init__(self, checkpoint: Checkpoint, request_bytes: int = 32 * _MIB,
                 requests_at_once: int = 4):
        super().__init__()
        self.fs = checkpoint.filesystem
        self.path = checkpoint.path.rstrip("/")
        self.request_bytes = request_bytes
        self.requests_at_once = requests_at_once
        self.bytes_fetched = 0
        self.bytes_local = 0
        self._manifest = checkpoint.get_commit_info()
        adapter = adapter_for(self.fs)
        self._is_local = adapter.is_local
        self._tier = None if self._is_local else LocalTier.of_node()
        self._retry = run_policy().for_store(adapter)
        self._storage_data: dict[Any, Any] = {}
        self._load_id = uuid.uuid4().hex

    @property
    def checkpoint_id(self) -> str:
        return fsutil.display_path(self.fs, self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False  # built from a Checkpoint, never chosen by DCP for a bare id

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self._storage_data = {}
        self._load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = METADATA if rank is None else f"__{rank}{METADATA}"
        with ExitStack() as stack:
            local = self._local_file(name, stack)
            if local is not None:
                with open(local, "rb") as f:
                    data = f.read()
                self.bytes_local += len(data)
            else:
                data = self._retry.call(f"reading {name}", self.checkpoint_id,
                                        lambda: self.fs.cat_file(fsutil.join(self.path, name)))
                self.bytes_fetched += len(data)
        metadata = pickle.loads(data)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self._load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self._storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        items = [(item, self._storage_data[item.storage_index]) for item in plan.items]
        spans = plan_spans(items, self.request_bytes)
        with ExitStack() as stack:  # the node's copies stay while they are read
            for span, data in self._fetch(spans, stack):
                for item, info in span.items:
                    offset = info.offset - span.start
                    self._load(item, info, data[offset:offset + info.length], planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _local_file(self, rel: str, stack: ExitStack) -> str | None:
        """A verified local copy of ``rel``, if the node has one (held while ``stack``)."""
        if self._is_local:
            return fsutil.join(self.path, rel)
        if self._tier is None or self._manifest is None or rel not in self._manifest.files:
            return None
        entry = self._tier.entry(self.fs, self.path, self._manifest.index)
        stack.enter_context(entry.locked(fcntl.LOCK_SH))
        return self._tier.local_file(entry, rel, self._manifest.files[rel])

    def _fetch(self, spans: list[_Span], stack: ExitStack) -> Iterator[tuple[_Span, bytes]]:
        """Each span's bytes: read from local files, fetched in batches from the store."""
        local = {rel: self._local_file(rel, stack) for rel in {s.relpath for s in spans}}
        remote = [s for s in spans if local[s.relpath] is None]
        for span in spans:
            if (path := local[span.relpath]) is not None:
                with open(path, "rb") as f:
                    f.seek(span.start)
                    data = f.read(span.end - span.start)
                self.bytes_local += len(data)
                yield span, data
        for at in range(0, len(remote), self.requests_at_once):
            batch = remote[at:at + self.requests_at_once]
            paths = [fsutil.join(self.path, s.relpath) for s in batch]
            blobs = self._retry.call(
                "reading checkpoint shards", self.checkpoint_id,
                lambda b=batch, p=paths: self.fs.cat_ranges(
                    p, [s.start for s in b], [s.end for s in b], on_error="raise"))
            for span, data in zip(batch, blobs, strict=True):
                self.bytes_fetched += len(data)
                yield span, data

    @staticmethod
    def _load(item: ReadItem, info: Any, data: bytes, planner: LoadPlanner) -> None:
        if getattr(info, "transform_descriptors", None):
            raise NotImplementedError(
                f"{info.relative_path} was written with DCP stream extensions "
                f"{list(info.transform_descriptors)}, which CheckpointReader does not read; "
                "load it with torch's FileSystemReader on checkpoint.as_directory().")
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, io.BytesIO(data))
            return
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise ValueError(f"{item.storage_index}: the checkpoint holds a tensor of shape "
                             f"{tuple(tensor.size())} where {tuple(target.size())} is loaded")
        target.copy_(tensor)
        planner.commit_tensor(item, target)
