"""One writer per run directory: the driver's lease on its run, taken before any process starts.

Every driver process of a job (every node's ``fit()`` or ``launch``) holds a claim
on the run (:mod:`elastic_train.storage.lease`) from before it starts anything
until it ends, and renews it every ``ttl/4`` seconds. The nodes of one job --
the same rendezvous backend and run id -- share the claim's token; a driver of
another job finding a live claim is refused with :class:`RunInUseError`, which
names the holder and says when a dead holder's lease goes stale.

A claim is *live* while it is held and either its owner's process is alive
(checked directly when the owner is on this host, in this pid namespace:
a SIGKILLed driver's run is taken over at once) or, for an owner elsewhere, its
heartbeat is younger than its time to live (``ELASTIC_TRAIN_LEASE_TTL_S``,
20 s), measured on the store's clock. A job that finds only stale claims takes
the run over with the next token; writers of the old job are then fenced.

Acquiring without compare-and-swap: a driver writes a *pending* claim, then
lists the claims. If it sees a live claim of another job, it withdraws (and is
refused when that claim is held, or retries after a random pause when it is
pending too). Of two drivers that write at the same time, at least the later
lister sees the other's claim. A claim listed but gone when read is a rival
replacing its pending claim by its held one: the driver lists again, and backs off
if the claims keep changing (skipping it let two jobs take one token). Once it has
written its held claim, it lists once more and withdraws if another job holds the
run with its token or a newer one. So two jobs never both hold the run. A pending
claim carries token 0, so that it fences nobody: with a token of its own it would
look like a newer job to the heartbeats and fences of the nodes running the run
for as long as it stands, whether it is another node of theirs joining or a
second job about to be refused.

Example::

    lease = RunLease.acquire(storage, rendezvous, "fit()")   # RunInUseError if taken
    storage.use_fence(lease.token)
    try:
        ...  # the workers get lease.worker_env()
    finally:
        lease.release()
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import random
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace

from elastic_train._internal import env_vars, process_identity
from elastic_train.errors import LeaseLostError, RunInUseError
from elastic_train.rendezvous_config import RendezvousConfig
from elastic_train.storage import RunStorage
from elastic_train.storage.lease import HELD, PENDING, PENDING_TOKEN, RELEASED, Claim, LeaseDir

logger = logging.getLogger(__name__)

DEFAULT_TTL_S = 20.0
_ATTEMPTS = 5  # acquisitions that meet a rival's pending claim retry this often


def lease_ttl_s() -> float:
    """The time to live of this driver's claims: ``ELASTIC_TRAIN_LEASE_TTL_S`` or 20 s."""
    ttl = env_vars.Switches.from_environ().lease_ttl_s
    return DEFAULT_TTL_S if ttl is None else ttl


def job_id(rendezvous: RendezvousConfig) -> str:
    """The identity the nodes of one job share: its rendezvous backend and run id (the
    endpoint is left out: nodes may name one server differently)."""
    return hashlib.sha256(f"{rendezvous.backend}|{rendezvous.run_id}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Owner:
    """This driver process, as its claim names it."""

    description: str
    host: str
    pid: int
    start_ticks: str
    boot_id: str
    pid_namespace: str
    started: float

    @classmethod
    def this_process(cls, description: str) -> Owner:
        return cls(description=description, host=platform.node(), pid=os.getpid(),
                   start_ticks=process_identity.start_ticks(os.getpid()),
                   boot_id=process_identity.boot_id(),
                   pid_namespace=process_identity.pid_namespace(), started=time.time())

    def can_see(self, owner: dict) -> bool:
        """Whether ``owner``'s pid means the same process here (same host, boot and pid
        namespace), so that its liveness can be checked directly."""
        return bool(self.boot_id and self.pid_namespace) and (
            owner.get("host"), owner.get("boot_id"), owner.get("pid_namespace")) == (
            self.host, self.boot_id, self.pid_namespace)


def _alive(owner: dict) -> bool:
    return process_identity.is_running(int(owner.get("pid", 0)), owner.get("start_ticks") or "")


def is_live(claim: Claim, me: Owner, now: float) -> bool:
    """Whether ``claim`` still holds (or is acquiring) the run, as seen at ``now``."""
    if claim.state == RELEASED:
        return False
    if me.can_see(claim.owner):
        return _alive(claim.owner)
    return claim.age_s(now) <= claim.ttl_s


def held_by_a_live_job(storage: RunStorage) -> bool | None:
    """Whether a live job holds the run now (for ``ls``/``show``: a run.json that says
    ``running`` after its driver was killed with SIGKILL says so forever); None when the
    run has no claims to tell (a run from before leases). A dead process on this host
    is recognised at once, one elsewhere once its lease is stale."""
    claims = storage.lease_dir(retry_budget_s=0.0).claims()
    if not claims:
        return None
    me, now = Owner.this_process("a reader"), time.time()
    return any(claim.state == HELD and is_live(claim, me, now) for claim in claims)


def in_use_message(display_path: str, holder: Claim, now: float) -> str:
    """The refusal of a second job: who holds the run, and how to take it over if dead."""
    age = max(holder.age_s(now), 0.0)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.owner.get("started", 0)))
    return (
        f"The run {display_path} is in use by {holder.describe()}, running since {started}, "
        f"last heartbeat {age:.0f} s ago. Two jobs writing one run directory would destroy "
        "each other's checkpoints, so this one does not start. Wait for that job to end (or "
        "stop it), or use another run name. If that job is dead -- its host down or cut off "
        f"from the storage -- its lease goes stale {holder.ttl_s:.0f} s after its last "
        f"heartbeat (in about {max(holder.ttl_s - age, 0.0):.0f} s): start this job again "
        "then and it takes the run over (a dead process on this host is recognised at once).")


def _store_now(claims: list[Claim], mine: Claim) -> float:
    """Now on the store's clock: the modification time of the claim just written."""
    own = next((c.modified for c in claims if c.claim_id == mine.claim_id), None)
    return own if own is not None else time.time()


def _token(others: list[Claim], live: list[Claim], job: str) -> int:
    """The token to hold: the running members' if no claim is newer, else a new one.
    Pending claims (nodes of this job acquiring now) do not count: they take the same."""
    top = max((c.token for c in others if c.state != PENDING), default=0)
    members = [c.token for c in live if c.job == job and c.state == HELD]
    return max(members) if members and max(members) >= top else top + 1


class RunLease:
    """This driver's claim on a run, renewed by a heartbeat thread until :meth:`release`."""

    def __init__(self, storage: RunStorage, claim: Claim, me: Owner):
        self.storage = storage
        # A heartbeat retried past a quarter of the time to live is late anyway; the next
        # one tries again (and the driver's exit never waits on a store that is down).
        self.lease_dir: LeaseDir = storage.lease_dir(retry_budget_s=claim.ttl_s / 4)
        self.claim = claim
        self.me = me
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name="run-lease", daemon=True)

    @property
    def token(self) -> int:
        return self.claim.token

    @classmethod
    def acquire(cls, storage: RunStorage, rendezvous: RendezvousConfig, description: str,
                ttl_s: float | None = None) -> RunLease:
        """Claims the run for this job (joining the claims of its other nodes), or raises
        RunInUseError naming the live job that holds it."""
        me = Owner.this_process(description)
        lease_dir = storage.lease_dir()
        for attempt in range(_ATTEMPTS):
            claim = cls._attempt(storage, lease_dir, me, job_id(rendezvous),
                                 ttl_s or lease_ttl_s())
            if claim is not None:
                lease = cls(storage, claim, me)
                lease._thread.start()
                return lease
            time.sleep(random.uniform(0.1, 0.5) * (attempt + 1))
        raise RunInUseError(f"The run {storage.display_path} is being started by another job "
                            "at this very moment; try again, or use another run name.")

    @staticmethod
    def _attempt(storage: RunStorage, lease_dir: LeaseDir, me: Owner, job: str,
                 ttl_s: float) -> Claim | None:
        """Writes a pending claim and looks: the held claim, or None when a rival was
        acquiring too (RunInUseError when a rival holds the run)."""
        pending = Claim(token=PENDING_TOKEN, claim_id=uuid.uuid4().hex[:16], job=job,
                        state=PENDING, owner=asdict(me), ttl_s=ttl_s)
        lease_dir.write(pending)
        claims = lease_dir.settled_claims()
        if claims is None:  # claims come and go: another driver is acquiring right now
            lease_dir.remove(pending)
            return None
        now = _store_now(claims, pending)
        others = [c for c in claims if c.claim_id != pending.claim_id]
        live = [c for c in others if is_live(c, me, now)]
        rivals = [c for c in live if c.job != job]
        if rivals:
            lease_dir.remove(pending)
            held = [c for c in rivals if c.state == HELD]
            if held:
                holder = max(held, key=lambda c: c.token)
                raise RunInUseError(in_use_message(storage.display_path, holder, now))
            return None
        claim = replace(pending, state=HELD, token=_token(others, live, job),
                        beat_at=time.time())
        lease_dir.write(claim)
        lease_dir.remove(pending)
        if RunLease._rivalled(lease_dir, claim, me):
            lease_dir.remove(claim)
            return None
        for dead in (c for c in others if c not in live):  # ours carries the highest token
            lease_dir.remove(dead)
        if any(c.state != RELEASED and c not in live for c in others):
            logger.warning("Took over the run %s: the lease of its previous job was stale.",
                           storage.display_path)
        return claim

    @staticmethod
    def _rivalled(lease_dir: LeaseDir, claim: Claim, me: Owner) -> bool:
        """Whether, after ``claim`` was written held, another job holds the run with its
        token or a newer one (a listing that missed the rival's claim), or the claims
        cannot be told: then this job withdraws. Of two jobs that wrote "held" with one
        token, the later to look sees the other, so at most one keeps it."""
        claims = lease_dir.settled_claims()
        if claims is None:
            return True
        now = _store_now(claims, claim)
        return any(c.job != claim.job and c.state == HELD and c.token >= claim.token
                   and is_live(c, me, now) for c in claims)

    def _heartbeat(self) -> None:
        """Renews the claim every ``ttl/4`` s. A store that fails (down for a while, or
        full) is said once, in one line, and again when a renewal works: not a
        traceback every beat."""
        failing = False
        while not self._stop.wait(self.claim.ttl_s / 4):
            try:
                self._renew()
            except LeaseLostError as exc:
                self.lost = str(exc)
                logger.error("%s", exc)
                return
            except Exception as exc:  # the store may be down for a while: try again
                log = logger.debug if failing else logger.warning
                log("Could not renew the lease of %s (%s); trying again every %.3g s "
                    "(said again only once it works).", self.storage.display_path, exc,
                    self.claim.ttl_s / 4, exc_info=failing)
                failing = True
                continue
            if failing:
                logger.warning("Renewed the lease of %s again.", self.storage.display_path)
                failing = False

    def _renew(self) -> None:
        newest = max(self.lease_dir.tokens(), default=0)
        if newest > self.token:
            raise LeaseLostError(
                f"The lease of this job on {self.storage.display_path} (token {self.token}) "
                f"was taken over by a newer job (token {newest}) while it could not renew it; "
                "this job stops writing to the run.")
        self.claim = replace(self.claim, beat_at=time.time())
        self.lease_dir.write(self.claim)

    def check(self) -> None:
        """Raises LeaseLostError when this job's lease was taken over."""
        if self.lost:
            raise LeaseLostError(self.lost)
        try:
            self._renew()
        except LeaseLostError as exc:
            self.lost = str(exc)
            raise

    def _members(self) -> list[Claim]:
        """The other live claims of this job with this token (other nodes' drivers)."""
        claims = self.lease_dir.claims()
        now = _store_now(claims, self.claim)
        return [c for c in claims if c.claim_id != self.claim.claim_id
                and c.job == self.claim.job and c.token == self.token
                and is_live(c, self.me, now)]

    def is_sole_member(self) -> bool:
        """Whether no other node of this job still runs on the lease (then the job ends
        with this node); False when that cannot be told."""
        try:
            return not self.lost and not self._members()
        except Exception:
            logger.warning("Could not read the lease of %s.", self.storage.display_path,
                           exc_info=True)
            return False

    def release(self) -> None:
        """Stops the heartbeat; the last node of the job leaves a released claim behind
        (it carries the highest token for the next job)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.claim.ttl_s)
        if self.lost:
            return
        try:
            if self._members():
                self.lease_dir.remove(self.claim)
            else:
                self.lease_dir.write(replace(self.claim, state=RELEASED, beat_at=time.time()))
        except Exception as exc:  # it goes stale on its own; the run's own error stands
            logger.warning("Could not release the lease of %s (%s); it goes stale on its "
                           "own %.0f s after its last heartbeat.", self.storage.display_path,
                           exc, self.claim.ttl_s)
