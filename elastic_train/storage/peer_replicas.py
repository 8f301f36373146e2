"""Copies of each node's checkpoint files on its peers, so that a replacement node (or
one whose disk was wiped) restores its share from a peer instead of the remote store.

With ``CheckpointConfig(peer_replicas=K)`` (default 1), a remote store and more than
one node, every node runs a replica server on its local tier
(:mod:`.replica_server`), and at each start of the group the ranks learn every
node's server (:class:`PeerRing`, gathered with the restore agreement):

* **Sending.** Once a rank's files are uploaded and kept in its node's tier, its
  uploader thread sends them to the K nodes after its own in node-rank order (a
  ring: node ``n``'s copies go to ``n+1 .. n+K`` modulo the number of nodes), each
  with the SHA-256 the manifest records, signed with the peer's key
  (:mod:`.replica_server`), and the peer keeps them as unchecked copies of the same
  tier entry. Sent as soon as uploaded rather than pulled after the
  commit: the sender knows its files and when they are ready, the receiver needs to
  learn nothing, and a copy is used only once a committed manifest says it matches
  (as the node's own kept files). A copy of a checkpoint that never commits goes
  with the entry, at the next prune. A send that fails is a warning: the checkpoint
  is in the store. The send is part of the rank's upload job, so it never holds up a
  training step; a ``report()`` waits for it only as it waits for a slow upload (at
  most one job uploading and one queued).
* **Pruning.** Copies live in the peer's tier as any kept file, so they go when the
  tier drops the entry (a newer checkpoint committed, a restart that resumes from
  another one, the node's run ending).
* **Restoring.** Before a restart each rank checks its share
  (:mod:`.restore_check`): a file the node lacks is asked, in order, of the nodes
  that should hold a copy -- the ring successors of the node that wrote it, then
  that node itself -- and checked against the manifest's SHA-256 as it arrives (no
  more than the manifest's size is read); the remote store is the fallback when none
  has a matching copy, and the only source for a manifest without SHA-256s.

What one machine cannot show: the peers here share one loopback interface and
disk, so the figure (BENCHMARKS.md, 10b) shows the protocol's cost against a
throttled store, not a real network's bandwidth, congestion when many nodes restore
at once, or a peer's disk contention with its own training.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import threading
import urllib.parse
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from elastic_train.storage.local_tier import TierEntry, confined
from elastic_train.storage.manifest import FileDigest, is_trusted
from elastic_train.storage.replica_server import (
    AUTH_HEADER,
    CHUNK,
    SHA256_HEADER,
    ReplicaTLS,
    signature,
    stored_copy,
)

logger = logging.getLogger(__name__)

TIMEOUT_S = 30.0  # per socket operation: a peer that stops answering is skipped


@dataclass(frozen=True)
class PeerRing:
    """The job's nodes in ring order, as one rank sees them at a start of the group.

    Attributes:
        node: This rank's node rank.
        urls: Each node's replica server by node rank ("" where it has none).
        keys: Each node's server key (:mod:`.replica_server`), by node rank.
        copies: K, how many successors keep a node's copies (``peer_replicas``).
        workers_per_node: Ranks per node, to find the node that wrote a rank's file.
        tls: This node's certificate, when the job has them.
    """

    node: int
    urls: dict[int, str]
    keys: dict[int, str]
    copies: int
    workers_per_node: int
    tls: ReplicaTLS | None = None

    @classmethod
    def of(cls, node: int, gathered: Sequence[tuple[int, str, str]], copies: int,
           workers_per_node: int, tls: ReplicaTLS | None = None) -> PeerRing:
        """The ring from every rank's ``(node rank, server URL, server key)``."""
        return cls(node, {n: url for n, url, _ in gathered},
                   {n: key for n, _, key in gathered}, copies, workers_per_node, tls)

    @property
    def nodes(self) -> list[int]:
        return sorted(self.urls)

    def successors(self, node: int) -> list[int]:
        """The up to K nodes after ``node`` in ring order, never ``node`` itself."""
        ring = self.nodes
        if node not in ring:
            return []
        at = ring.index(node)
        return [ring[(at + step) % len(ring)]
                for step in range(1, min(self.copies, len(ring) - 1) + 1)]

    def holders(self, writer_rank: int) -> list[int]:
        """The nodes to ask for a file written by ``writer_rank``: the successors of its
        node, then its node, leaving out this node and any without a server."""
        writer = writer_rank // self.workers_per_node
        return [n for n in [*self.successors(writer), writer]
                if n != self.node and self.urls.get(n)]

    def url_path(self, entry: TierEntry, rel: str) -> str:
        """The server's path of ``rel`` of ``entry`` (the same on every node)."""
        group = os.path.basename(os.path.dirname(entry.base))
        name = os.path.basename(entry.base)
        return "/" + "/".join(urllib.parse.quote(p) for p in (group, name, *rel.split("/")))


def _connect(url: str, tls: ReplicaTLS | None) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        if tls is None:
            raise OSError(f"{url} serves TLS, and this node was given no certificate")
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=TIMEOUT_S,
                                           context=tls.client_context())
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT_S)


def send(ring: PeerRing, entry: TierEntry, files: dict[str, dict[str, Any]],
         cancelled: threading.Event | None = None) -> None:
    """Sends this rank's ``files`` (rel -> manifest info) of ``entry`` from the tier to
    the K successors of this node, until ``cancelled`` is set (an in-process restart
    waits for no more than the file being sent); a peer that fails is named in a
    warning."""
    for node in ring.successors(ring.node):
        url = ring.urls.get(node)
        if not url:
            continue
        try:
            _send_to(node, ring, entry, files, cancelled or threading.Event())
        except (OSError, http.client.HTTPException) as exc:
            logger.warning("Could not copy checkpoint files to node %d (%s): %s; a "
                           "replacement of this node will read them from the store.",
                           node, url, exc)


def _send_to(node: int, ring: PeerRing, entry: TierEntry, files: dict[str, dict[str, Any]],
             cancelled: threading.Event) -> None:
    conn = _connect(ring.urls[node], ring.tls)
    try:
        for rel, info in sorted(files.items()):
            path = stored_copy(entry, rel)
            if path is None or cancelled.is_set():  # pruned meanwhile, or abandoned
                return
            url_path = ring.url_path(entry, rel)
            with open(path, "rb") as f:
                conn.request("PUT", url_path, body=f, headers={
                    "Content-Length": str(info["size"]), SHA256_HEADER: info["sha256"],
                    AUTH_HEADER: signature(ring.keys[node], "PUT", url_path, info["size"],
                                           info["sha256"])})
                response = conn.getresponse()
                response.read()
            if response.status != 201:
                raise http.client.HTTPException(f"{rel}: HTTP {response.status}")
    finally:
        conn.close()


def fetch(ring: PeerRing, entry: TierEntry, rel: str, info: dict[str, Any]) -> str | None:
    """Brings ``rel`` into the entry's verified files from the first peer whose copy
    matches ``info`` (size, CRC-32 and SHA-256); the local path, or None when no peer
    had one, or the manifest has no SHA-256 to check a copy against."""
    if not is_trusted(info):
        return None
    for node in ring.holders(info.get("rank", 0)):
        try:
            if _fetch_from(node, ring, entry, rel, info):
                return confined(entry.verified, rel)
        except (OSError, http.client.HTTPException) as exc:
            logger.info("Node %d could not give %s: %s", node, rel, exc)
    return None


def _fetch_from(node: int, ring: PeerRing, entry: TierEntry, rel: str,
                info: dict[str, Any]) -> bool:
    """Whether node ``node`` gave a copy of ``rel`` that matches ``info``: read up to one
    byte past the manifest's size, checked, then moved into the verified files."""
    url, url_path = ring.urls[node], ring.url_path(entry, rel)
    target = confined(entry.verified, rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    partial = f"{target}.part-{uuid.uuid4().hex[:8]}"
    conn = _connect(url, ring.tls)
    try:
        conn.request("GET", url_path, headers={
            AUTH_HEADER: signature(ring.keys[node], "GET", url_path)})
        response = conn.getresponse()
        if response.status != 200 or (response.length or 0) > info["size"]:
            return False
        digest, left = FileDigest(), info["size"] + 1
        with open(partial, "wb") as out:
            while left > 0 and (chunk := response.read(min(CHUNK, left))):
                digest.update(chunk)
                left -= len(chunk)
                out.write(chunk)
        if not digest.matches(info):
            logger.warning("The copy of %s on %s does not match the checkpoint's manifest.",
                           rel, url)
            return False
        os.replace(partial, target)
        return True
    finally:
        conn.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
