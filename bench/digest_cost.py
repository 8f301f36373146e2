"""Figure 16: what the manifest's checksums cost, CRC-32 beside SHA-256 and BLAKE2b, in GB/s.

    python -m bench --only digest_cost --output FILE    the figure (the profile's size)
    python -m bench.digest_cost [MIB]                   the same numbers as one JSON line

Hashes one buffer of ``MIB`` random MiB (default 256) in 1 MiB chunks, as
:func:`elastic_train.storage.filesystem.file_digest` reads a file, on one core,
three times each, and prints one JSON line: the best GB/s of ``zlib.crc32``,
``hashlib.sha256``, ``hashlib.blake2b`` and of
:class:`~elastic_train.storage.manifest.FileDigest` (CRC-32 and SHA-256 in one pass,
what a checkpoint's upload thread computes), with the machine's CPU model and
whether it has the SHA extensions (``sha_ni``) OpenSSL's SHA-256 uses.
:func:`digest_cost` puts them in a table, each beside CRC-32 (#37: the digest's cost).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from bench.report import Table
from elastic_train.storage.manifest import FileDigest

if TYPE_CHECKING:
    from bench.suite import Suite

CHUNK = 1 << 20


def _crc32(chunks: list[memoryview]) -> None:
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)


def _hasher(make: Callable[[], object]) -> Callable[[list[memoryview]], None]:
    def run(chunks: list[memoryview]) -> None:
        digest = make()
        for chunk in chunks:
            digest.update(chunk)  # type: ignore[attr-defined]
    return run


def _both(chunks: list[memoryview]) -> None:
    digest = FileDigest()
    for chunk in chunks:
        digest.update(chunk)  # type: ignore[arg-type]


def _best_gbps(run: Callable[[list[memoryview]], None], chunks: list[memoryview]) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        run(chunks)
        best = min(best, time.perf_counter() - started)
    return round(len(chunks) * CHUNK / best / 1e9, 2)


def _cpu() -> tuple[str, bool]:
    with open("/proc/cpuinfo") as f:
        info = f.read()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), "unknown")
    return model, " sha_ni" in info


def main(mib: int) -> dict:
    data = memoryview(os.urandom(mib * CHUNK))
    chunks = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
    model, sha_ni = _cpu()
    return {"mib": mib, "cpu": model, "sha_ni": sha_ni,
            "crc32_gbps": _best_gbps(_crc32, chunks),
            "sha256_gbps": _best_gbps(_hasher(hashlib.sha256), chunks),
            "blake2b_gbps": _best_gbps(_hasher(hashlib.blake2b), chunks),
            "crc32_and_sha256_gbps": _best_gbps(_both, chunks)}


# (key in main's result, the checksum, where elastic-train uses it)
_ROWS = (("crc32_gbps", "CRC-32 (zlib.crc32)",
          "a manifest's first checksum (a manifest older than #37: its only one)"),
         ("sha256_gbps", "SHA-256 (hashlib)",
          "the digest a copy this process did not write is checked against (#37)"),
         ("blake2b_gbps", "BLAKE2b (hashlib)", "the other digest #37 named (not used)"),
         ("crc32_and_sha256_gbps", "CRC-32 + SHA-256 in one pass (FileDigest)",
          "what is computed per file: a manifest's entry, the check of a copy"))


def digest_cost(suite: Suite) -> list[Table]:
    """Figure 16: GB/s of each checksum over the profile's ``digest_mib``, on one core."""
    result = main(suite.profile.digest_mib)
    table = Table(f"Figure 16 — what a checkpoint file's checksums cost (GB/s on one core, "
                  f"best of 3 over {result['mib']} MiB in 1 MiB chunks)",
                  ["checksum", "GB/s", "time / CRC-32's", "used for"])
    crc = result["crc32_gbps"]
    for key, name, use in _ROWS:
        table.add(name, f"{result[key]:.2f}", f"{crc / result[key]:.2f}", use)
    table.notes = [
        f"CPU: {result['cpu']}; SHA extensions (sha_ni), which OpenSSL's SHA-256 uses: "
        f"{'yes' if result['sha_ni'] else 'no'}.",
        "Random bytes in memory, fed in 1 MiB chunks as `file_digest` "
        "(elastic_train/storage/filesystem.py) reads a file: the checksums' own cost, "
        "without the disk's.",
    ]
    return [table]


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 256)))
