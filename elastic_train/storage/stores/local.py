"""Local disk and NFS mounts: atomic renames, appends and hard links exist here."""

from __future__ import annotations

import os
import uuid

from elastic_train.storage.stores.base import StoreAdapter


class LocalStore(StoreAdapter):
    """This machine's file system (fsspec's ``file://``)."""

    is_local = True

    def write_bytes_atomic(self, path: str, data: bytes) -> None:
        """Writes a temporary sibling, then renames it over ``path`` (a PUT-like write
        is not atomic on a file system, a rename is)."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def append(self, path: str, data: bytes) -> bool:
        with open(path, "ab") as f:
            f.write(data)
        return True

    def link_files(self, sources: list[str], targets: list[str]) -> bool:
        """Hard links; False (no link left behind) where the file system cannot, e.g.
        across devices."""
        done = []
        try:
            for source, target in zip(sources, targets, strict=True):
                if os.path.lexists(target):
                    os.unlink(target)  # a leftover of an interrupted attempt at this index
                os.link(source, target)
                done.append(target)
        except OSError:
            for target in done:
                os.unlink(target)
            return False
        return True

    def rename_tree(self, source: str, target: str) -> bool:
        os.rename(source, target)
        return True
