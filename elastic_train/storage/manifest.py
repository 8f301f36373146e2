"""The commit manifest: what the marker of a committed checkpoint records.

Written last into ``checkpoint_NNNNNN/.commit.json`` by the committing rank (see
:mod:`.checkpoint_store`): the checkpoint's index and metrics, every file with
its size, CRC-32 and the rank that uploaded it, the world size that wrote it and
each rank's resume state. The node's local tier checks its kept copies against
it (:func:`~.checkpoint_store.file_matches`), and ``Result.checkpoint`` and
``elastic-train show`` show it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CommitManifest:
    """The marker of a committed checkpoint."""

    index: int
    training_iteration: int
    metrics: dict[str, Any]
    files: dict[str, dict[str, Any]]
    world_size: int
    worker_states: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommitManifest:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @property
    def size_bytes(self) -> int:
        """The checkpoint's size: its files' sizes summed (the marker left out)."""
        return sum(info["size"] for info in self.files.values())

    @property
    def ranks(self) -> list[int] | None:
        """The ranks that uploaded the checkpoint's files (each file once, from the
        lowest rank that had it); None for a marker written before ranks were recorded."""
        ranks = [info.get("rank") for info in self.files.values()]
        return None if None in ranks else sorted(set(ranks))

    def describe_contents(self) -> str:
        """Its size and who wrote it, e.g. ``"400.0 MiB from ranks 0-3"``."""
        ranks = self.ranks
        if ranks is None:
            who = "(ranks not recorded)"
        elif len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
            who = f"from ranks {ranks[0]}-{ranks[-1]}"
        else:
            who = f"from rank{'s' * (len(ranks) != 1)} {', '.join(map(str, ranks))}"
        return f"{format_size(self.size_bytes)} {who}"


def format_size(size: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
