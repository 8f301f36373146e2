"""The run lease without processes: acquiring, joining, refusing, taking over a stale or dead
holder, contention, fencing of every write that could harm a newer job."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from elastic_train.driver import run_lease
from elastic_train.driver.run_lease import RunLease
from elastic_train.errors import LeaseLostError, RunInUseError
from elastic_train.rendezvous_config import RendezvousConfig
from elastic_train.storage import CommitManifest, RunStorage
from elastic_train.storage.lease import HELD, PENDING, RELEASED, Claim, LeaseDir
from elastic_train.storage.run_state import RunState
from tests.support.full_disk import FullDiskFS, fill


@pytest.fixture
def storage(tmp_path):
    storage = RunStorage.open(str(tmp_path / "results"), "run")
    storage.ensure_writable()
    return storage


def rendezvous(run_id: str) -> RendezvousConfig:
    return RendezvousConfig(backend="c10d", endpoint="127.0.0.1:0", run_id=run_id, conf={})


def foreign(storage: RunStorage, token: int, *, age_s: float = 0.0, state: str = HELD,
            job: str = "another-job", ttl_s: float = 20.0) -> Claim:
    """A claim of a driver on another host, last renewed ``age_s`` ago."""
    claim = Claim(token=token, claim_id=f"{token:016x}", job=job, state=state,
                  owner={"host": "elsewhere", "pid": 4242, "description": "fit()",
                         "started": time.time() - 100}, ttl_s=ttl_s)
    lease_dir = storage.lease_dir()
    lease_dir.write(claim)
    path = os.path.join(lease_dir.path, claim.file_name)
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return claim


def test_acquire_release_and_acquire_again_with_a_new_token(storage):
    lease = RunLease.acquire(storage, rendezvous("a"), "fit()")
    assert lease.token == 1
    [claim] = storage.lease_dir().claims()
    assert (claim.state, claim.owner["pid"]) == (HELD, os.getpid())
    lease.release()
    assert [c.state for c in storage.lease_dir().claims()] == [RELEASED]
    again = RunLease.acquire(storage, rendezvous("b"), "fit()")
    assert again.token == 2
    assert [c.token for c in storage.lease_dir().claims()] == [2]  # the released one is gone
    again.release()


def test_a_second_job_is_refused_while_the_first_lives(storage):
    first = RunLease.acquire(storage, rendezvous("a"), "fit()")
    try:
        holder = rf"in use by fit\(\) on host .* \(pid {os.getpid()},"
        with pytest.raises(RunInUseError, match=holder):
            RunLease.acquire(storage, rendezvous("b"), "fit()")
        assert [c.token for c in storage.lease_dir().claims()] == [1]  # withdrawn
    finally:
        first.release()


def test_nodes_of_one_job_share_the_token_and_only_the_last_cleans_up(storage):
    first = RunLease.acquire(storage, rendezvous("job42"), "fit()")
    second = RunLease.acquire(storage, rendezvous("job42"), "fit()")
    assert second.token == first.token == 1
    assert not first.is_sole_member() and not second.is_sole_member()
    second.release()
    assert first.is_sole_member()
    first.release()


def test_a_fresh_foreign_holder_is_named_with_when_its_lease_goes_stale(storage):
    foreign(storage, 3, age_s=5.0)
    with pytest.raises(RunInUseError) as refused:
        RunLease.acquire(storage, rendezvous("b"), "fit()")
    text = str(refused.value)
    assert "host elsewhere (pid 4242, lease token 3)" in text
    assert "goes stale 20 s after its last heartbeat (in about 15 s)" in text


def test_a_stale_foreign_holder_is_taken_over_and_its_writes_fenced(storage):
    old = foreign(storage, 3, age_s=60.0)
    storage.use_fence(old.token)  # what the stale job's workers hold
    lease = RunLease.acquire(storage, rendezvous("b"), "fit()")
    try:
        assert lease.token == 4
        assert [c.token for c in storage.lease_dir().claims()] == [4]
        with pytest.raises(LeaseLostError, match="taken over by fit"):
            storage.write_run_state(RunState(name="run"))
        manifest = CommitManifest(index=0, training_iteration=1, metrics={}, files={},
                                  world_size=1)
        with pytest.raises(LeaseLostError, match="committing checkpoint_000000"):
            storage.checkpoints.commit(manifest)
        with pytest.raises(LeaseLostError):
            storage.checkpoints.remove_uncommitted()
        storage.use_fence(lease.token)
        storage.write_run_state(RunState(name="run"))  # the new job writes
    finally:
        lease.release()


def test_a_dead_holder_on_this_host_is_taken_over_at_once(storage):
    lease = RunLease.acquire(storage, rendezvous("a"), "fit()")
    lease._stop.set()  # as if SIGKILLed: no release, and its pid is gone
    claim = lease.claim
    dead = {**claim.owner, "pid": 2 ** 22 - 1}  # no such process
    storage.lease_dir().remove(claim)
    storage.lease_dir().write(Claim(**{**claim.__dict__, "owner": dead}))
    taker = RunLease.acquire(storage, rendezvous("b"), "fit()")
    assert taker.token == 2
    taker.release()


def test_a_rival_acquiring_at_the_same_moment_makes_one_back_off(storage, monkeypatch):
    monkeypatch.setattr(run_lease.random, "uniform", lambda a, b: 0.0)
    foreign(storage, 1, state=PENDING)  # another job, still acquiring (and it stays so)
    with pytest.raises(RunInUseError, match="at this very moment"):
        RunLease.acquire(storage, rendezvous("b"), "fit()")
    assert [c.state for c in storage.lease_dir().claims()] == [PENDING]  # ours withdrawn


@pytest.mark.parametrize("job", ["a", "b"])  # a node of the job joining; another job refused
def test_a_claim_being_acquired_fences_nobody(storage, monkeypatch, job):
    """While a driver's pending claim stands (its store is slow to list, say), the job
    holding the run renews its lease and writes: the pending claim is not a newer job."""
    holder = RunLease.acquire(storage, rendezvous("a"), "fit()")
    storage.use_fence(holder.token)
    write, checked = LeaseDir.write, []

    def write_then_look(self, claim):
        write(self, claim)
        if claim.state == PENDING:
            holder.check()
            storage.write_run_state(RunState(name="run"))
            checked.append(claim.claim_id)

    monkeypatch.setattr(LeaseDir, "write", write_then_look)
    try:
        if job == "a":
            RunLease.acquire(storage, rendezvous(job), "fit()").release()
        else:
            with pytest.raises(RunInUseError):
                RunLease.acquire(storage, rendezvous(job), "fit()")
        assert len(checked) == 1
        holder.check()
    finally:
        holder.release()


def test_check_raises_once_the_run_was_taken_over(storage):
    lease = RunLease.acquire(storage, rendezvous("a"), "fit()")
    lease.check()
    foreign(storage, 2)
    with pytest.raises(LeaseLostError, match="token 2"):
        lease.check()
    assert not lease.is_sole_member()  # it must not clean up either
    lease.release()
    assert {c.token for c in storage.lease_dir().claims()} == {1, 2}  # left as it was


def test_the_same_protocol_on_s3(tmp_path, s3_endpoint):
    """On an object store (moto's S3 server): refused while live, taken over once stale
    (judged by the store's LastModified times), the stale job's writes fenced."""
    from tests.conftest import make_storage

    s3 = make_storage("s3", tmp_path, s3_endpoint).run("run")
    s3.ensure_writable()
    first = RunLease.acquire(s3, rendezvous("a"), "fit()", ttl_s=1.0)
    first._stop.set()  # its heartbeat stops, as on a frozen host
    first._thread.join()
    with pytest.raises(RunInUseError, match="lease token 1"):
        RunLease.acquire(s3, rendezvous("b"), "fit()")
    stale_owner = {**first.claim.owner, "host": "elsewhere"}  # not checkable from here
    s3.lease_dir().write(Claim(**{**first.claim.__dict__, "owner": stale_owner}))
    time.sleep(2.5)  # LastModified has whole seconds
    s3.use_fence(first.token)
    taker = RunLease.acquire(s3, rendezvous("b"), "fit()")
    try:
        assert taker.token == 2
        with pytest.raises(LeaseLostError):
            s3.write_metrics([])
    finally:
        taker.release()


def test_a_claim_rewritten_between_listing_and_reading_is_read_on_s3(tmp_path, s3_endpoint,
                                                                     monkeypatch):
    """Another node's heartbeat rewrites its claim right after this node listed the lease
    (moto's S3 server): the claim is read as it is now. s3fs opened it with the listing's
    ETag and raised FileExpired, which ended a 2-node fit() on S3 (bench figure 10)."""
    import fsspec

    from elastic_train.storage.lease import LeaseDir
    from tests.conftest import make_storage
    from tests.support.servers import s3_options

    s3 = make_storage("s3", tmp_path, s3_endpoint).run("run")
    s3.ensure_writable()
    lease_dir = s3.lease_dir()
    claim = Claim(token=1, claim_id="1" * 16, job="another-job", state=HELD,
                  owner={"host": "elsewhere", "pid": 4242}, ttl_s=20.0)
    lease_dir.write(claim)
    other_node = LeaseDir(fsspec.filesystem("s3", **s3_options(s3_endpoint)), lease_dir.path)
    listing = LeaseDir._listing

    def listed_then_renewed(self):
        entries = listing(self)
        other_node.write(Claim(**{**claim.__dict__, "state": PENDING}))  # another ETag
        return entries

    monkeypatch.setattr(LeaseDir, "_listing", listed_then_renewed)
    assert [c.state for c in lease_dir.claims()] == [PENDING]


def _in_thread(name: str, fn) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        try:
            result["lease"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- carried to the test thread
            result["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, result


@pytest.mark.timeout(60)
def test_a_claim_that_vanishes_while_read_is_an_acquisition_under_way(storage, monkeypatch):
    """#24 item 1, forced: job B lists the claims while job A is between its listing and
    its held claim; A writes "held" and removes its pending claim before B reads it. B
    must not take the run too (before: both jobs held token 1, fencing neither)."""
    monkeypatch.setattr(run_lease.random, "uniform", lambda a, b: 0.0)
    a_listed, b_listed, a_acquired = threading.Event(), threading.Event(), threading.Event()
    write, remove, listing = LeaseDir.write, LeaseDir.remove, LeaseDir._listing

    def paced_write(self, claim):
        if threading.current_thread().name == "job-a" and claim.state == HELD:
            assert b_listed.wait(10), "job B never listed"
        write(self, claim)

    def paced_remove(self, claim):
        remove(self, claim)
        if threading.current_thread().name == "job-a" and claim.state == PENDING:
            a_acquired.set()

    def paced_listing(self):
        entries = listing(self)
        if threading.current_thread().name == "job-a":
            a_listed.set()
        if threading.current_thread().name == "job-b" and not b_listed.is_set():
            b_listed.set()
            assert a_acquired.wait(10), "job A never held the run"
        return entries

    monkeypatch.setattr(LeaseDir, "write", paced_write)
    monkeypatch.setattr(LeaseDir, "remove", paced_remove)
    monkeypatch.setattr(LeaseDir, "_listing", paced_listing)
    thread_a, a = _in_thread("job-a", lambda: RunLease.acquire(storage, rendezvous("a"), "A"))
    assert a_listed.wait(10)  # A's pending claim is written and A has looked: B starts
    thread_b, b = _in_thread("job-b", lambda: RunLease.acquire(storage, rendezvous("b"), "B"))
    thread_a.join(30)
    thread_b.join(30)
    try:
        assert "error" not in a, a.get("error")
        assert a["lease"].token == 1
        held = [(c.owner["description"], c.token) for c in storage.lease_dir().claims()
                if c.state == HELD]
        assert held == [("A", 1)], f"two jobs hold the run: {held}"
        assert isinstance(b.get("error"), RunInUseError), b
    finally:
        for result in (a, b):
            if "lease" in result:
                result["lease"].release()


@pytest.mark.timeout(60)
def test_a_job_that_finds_another_holding_its_token_withdraws(storage, monkeypatch):
    """#24 item 1: a listing that missed a rival's claim (a stale listing, say) lets two
    jobs write "held" with one token; the later one sees the other on its check after
    writing and withdraws, so one job holds the run."""
    monkeypatch.setattr(run_lease.random, "uniform", lambda a, b: 0.0)
    first = RunLease.acquire(storage, rendezvous("a"), "A")
    listing, blind = LeaseDir._listing, [True]

    def stale_once(self):  # the first listing of B's acquisition misses A's claim
        entries = listing(self)
        if blind:
            blind.clear()
            return [e for e in entries if first.claim.file_name not in e["name"]]
        return entries

    monkeypatch.setattr(LeaseDir, "_listing", stale_once)
    try:
        with pytest.raises(RunInUseError, match="in use by A"):
            RunLease.acquire(storage, rendezvous("b"), "B")
        held = [(c.owner["description"], c.token) for c in storage.lease_dir().claims()]
        assert held == [("A", 1)]
    finally:
        first.release()


def test_a_full_store_is_said_once_by_the_heartbeat_and_does_not_fail_the_release(
        tmp_path, caplog):
    """A disk that fills: the heartbeat says so in one line (not a traceback every beat)
    and again once a renewal works; the release at the end logs it and raises nothing, so
    the run's own error is the one the user sees."""
    fs = FullDiskFS(str(tmp_path / "full"))
    storage = RunStorage.open(str(tmp_path / "results"), "run", fs)
    storage.ensure_writable()
    lease = RunLease.acquire(storage, rendezvous("a"), "fit()", ttl_s=0.2)  # a beat per 0.05 s
    with caplog.at_level(logging.WARNING, logger=run_lease.__name__):
        fill(fs)
        time.sleep(0.5)
        said = [r for r in caplog.records if "Could not renew" in r.getMessage()]
        assert len(said) == 1 and not said[0].exc_info, caplog.text
        assert "the storage is full" in said[0].getMessage(), caplog.text
        os.remove(fs.full_flag)
        time.sleep(0.3)
        assert "Renewed the lease" in caplog.text and len(said) == 1
        fill(fs)
        lease.release()
    released = [r for r in caplog.records if "Could not release" in r.getMessage()]
    assert len(released) == 1 and not released[0].exc_info, caplog.text
