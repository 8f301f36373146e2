"""A run's lease, as files on its store: who writes the run directory, and the fencing token.

One job at a time writes a run directory (``<storage>/<name>/``); the nodes of one
multi-node job are one job. Each driver process of the job keeps a *claim* in
``<storage>/.leases/<name>/`` -- beside the run directory, so that moving the run
aside (``start_over``) does not move its lease -- named
``claim-<token>-<claim id>.json`` and holding :class:`Claim`: the job, the owner
(host, pid, description), its state and time to live. The owner rewrites it every
few seconds (its heartbeat); the store's modification time of the file is the
heartbeat's time, so no two machines' clocks are compared.

The *token* grows by one each time a job acquires the run; the nodes of a job
share it (a claim still being acquired, *pending*, carries 0). Before every commit,
upload, deletion and cleanup, a writer checks that no claim carries a higher token
(:class:`LeaseFence`): a job whose lease went stale and was taken over stops writing
instead of overwriting the new job's checkpoints.

What this relies on, since fsspec stores offer no compare-and-swap (S3's conditional
writes are not available on every S3-compatible store, and not at all on NFS):
whole-file writes that are atomic (a rename on local disk and NFS, one PUT on an
object store), listings that show every file whose write completed before the
listing began (S3 has been strongly consistent since 2020; on NFS a listing opens
the directory, which revalidates it), and the store's modification times. The
acquisition protocol that builds on this is :mod:`elastic_train.driver.run_lease`.
A fence is a check, not a lock held by the store: a writer paused between its check
and its write for longer than a lease's time to live can still land that one write.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import fsspec

from elastic_train.errors import LeaseLostError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.retry import RetryPolicy
from elastic_train.storage.stores import adapter_for

logger = logging.getLogger(__name__)

T = TypeVar("T")

LEASES_DIR = ".leases"
PENDING, HELD, RELEASED = "pending", "held", "released"
# A claim being acquired is no job's token yet: it must never look newer than the job
# that holds the run (every fence and heartbeat compares the highest token).
PENDING_TOKEN = 0
_NAME_RE = re.compile(r"^claim-(\d{10})-([0-9a-f]{16})\.json$")


def lease_path(run_path: str) -> str:
    """``<storage>/.leases/<name>`` for the run directory ``<storage>/<name>``."""
    parent, _, name = run_path.rstrip("/").rpartition("/")
    return fsutil.join(parent, LEASES_DIR, name)


@dataclass(frozen=True)
class Claim:
    """One driver process's claim on a run.

    ``job``: the job's identity (the same on every node of one job). ``state``:
    ``pending`` while acquiring, ``held``, or ``released`` (kept only to carry the
    highest token). ``owner``: who holds it (host, pid, description, started; see
    :class:`elastic_train.driver.run_lease.Owner`). ``beat_at``: the owner's clock at
    its last heartbeat, used only where the store gives no modification time.
    ``modified``: the store's modification time (filled in from a listing).
    """

    token: int
    claim_id: str
    job: str
    state: str
    owner: dict[str, Any]
    ttl_s: float
    beat_at: float = field(default_factory=time.time)
    modified: float | None = None

    @property
    def file_name(self) -> str:
        return f"claim-{self.token:010d}-{self.claim_id}.json"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["modified"]
        return data

    @classmethod
    def from_json(cls, data: Any, modified: float | None, file_name: str | None = None
                  ) -> Claim:
        """A claim as stored; ``ValueError`` for anything else -- claims come from shared
        storage: a field of the wrong type, an unknown state, or (with ``file_name``) a
        token or id that its file's name does not carry."""
        if not isinstance(data, dict):
            raise ValueError(f"a lease claim must be a JSON object, not {type(data).__name__}")
        claim = cls(token=data.get("token"), claim_id=data.get("claim_id"),
                    job=data.get("job"), state=data.get("state"), owner=data.get("owner"),
                    ttl_s=data.get("ttl_s"), beat_at=data.get("beat_at", 0.0),
                    modified=modified)
        numbers = (claim.ttl_s, claim.beat_at)
        if not (type(claim.token) is int and claim.token >= 0
                and all(isinstance(v, str) for v in (claim.claim_id, claim.job))
                and claim.state in (PENDING, HELD, RELEASED) and isinstance(claim.owner, dict)
                and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                        and math.isfinite(v) for v in numbers)):
            raise ValueError(f"a lease claim with fields of the wrong kind: {data!r:.200}")
        if file_name is not None and file_name != claim.file_name:
            raise ValueError(f"a lease claim named {file_name} holds {claim.file_name}'s")
        return claim

    def age_s(self, now: float) -> float:
        """Seconds since the last heartbeat at ``now`` (the store's clock where it has one)."""
        return now - (self.modified if self.modified is not None else self.beat_at)

    def describe(self) -> str:
        owner = self.owner
        return (f"{owner.get('description', 'a job')} on host {owner.get('host', '?')} "
                f"(pid {owner.get('pid', '?')}, lease token {self.token})")


class LeaseDir:
    """The claims of one run on its store."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str,
                 retry: RetryPolicy | None = None):
        self.fs = fs
        self.path = path
        self.adapter = adapter_for(fs)
        self.retry = (retry or RetryPolicy()).for_store(self.adapter)

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        return self.retry.call(what, fsutil.display_path(self.fs, self.path), fn)

    def _listing(self) -> list[dict[str, Any]]:
        def listing() -> list[dict[str, Any]]:
            self.fs.invalidate_cache(self.path)
            try:
                return self.fs.ls(self.path, detail=True)
            except FileNotFoundError:
                return []

        entries = self._retry("listing the run's lease", listing)
        return [e for e in entries if _NAME_RE.match(e["name"].rstrip("/").rsplit("/", 1)[-1])]

    def tokens(self) -> list[int]:
        """The tokens of every claim (one listing, nothing read)."""
        return [int(_NAME_RE.match(e["name"].rsplit("/", 1)[-1]).group(1))
                for e in self._listing()]

    def _read(self) -> tuple[list[Claim], bool]:
        """The claims of one listing, and whether one of them vanished before it was read
        (a claim that cannot be parsed is left out)."""
        claims, vanished = [], False
        for entry in self._listing():
            try:
                data = self._retry("reading a lease claim",
                                   lambda e=entry: fsutil.read_json(self.fs, e["name"]))
                claims.append(Claim.from_json(data, self.adapter.modified(entry),
                                              entry["name"].rstrip("/").rsplit("/", 1)[-1]))
            except FileNotFoundError:
                vanished = True
            except (ValueError, KeyError, TypeError):
                continue
        return claims, vanished

    def claims(self) -> list[Claim]:
        """Every claim, with the store's modification time; a claim that vanished or is
        mid-write while being read is left out."""
        return self._read()[0]

    def settled_claims(self, listings: int = 3) -> list[Claim] | None:
        """Every claim, from a listing none of whose claims vanished before it was read;
        None when they kept vanishing. A claim that vanishes is a driver acquiring or
        leaving the run (a pending claim replaced by its held one): whoever decides who
        holds the run must not decide without it, so it lists again (or backs off)."""
        for _ in range(listings):
            claims, vanished = self._read()
            if not vanished:
                return claims
        return None

    def write(self, claim: Claim) -> None:
        path = fsutil.join(self.path, claim.file_name)
        self._retry("writing a lease claim", lambda: fsutil.write_bytes_atomic(
            self.fs, path, json.dumps(claim.to_json(), sort_keys=True).encode()))

    def remove(self, claim: Claim) -> None:
        path = fsutil.join(self.path, claim.file_name)

        def remove() -> None:
            try:
                self.fs.rm(path)
            except FileNotFoundError:
                pass

        self._retry("removing a lease claim", remove)

    def newest(self) -> Claim | None:
        """The claim with the highest token (the run's current job), if any."""
        claims = self.claims()
        return max(claims, key=lambda c: c.token) if claims else None


class LeaseFence:
    """Refuses writes of a job whose lease was taken over: :meth:`check` before a commit,
    upload, deletion or cleanup.

    Example::

        fence = LeaseFence(LeaseDir(fs, lease_path(run_path)), token=3)
        fence.check("committing checkpoint_000007")   # LeaseLostError if token 4 exists
    """

    def __init__(self, lease_dir: LeaseDir, token: int, display_path: str = ""):
        self.lease_dir = lease_dir
        self.token = token
        self.display_path = display_path or lease_dir.path
        self._checked_at = -float("inf")

    def check(self, what: str, max_age_s: float = 0.0) -> None:
        """Raises LeaseLostError when a newer job holds the run. ``max_age_s``: a check
        passed that recently suffices (for frequent small writes such as metric rows)."""
        if time.monotonic() - self._checked_at <= max_age_s:
            return
        if max(self.lease_dir.tokens(), default=0) > self.token:
            newest = self.lease_dir.newest()
            holder = newest.describe() if newest is not None else "a newer job"
            raise LeaseLostError(
                f"{what} refused: the run {self.display_path} was taken over by {holder}, "
                f"after the lease of this job (token {self.token}) went stale. This job "
                "stops writing to it; the run goes on under its new job.")
        self._checked_at = time.monotonic()
