"""The retry policy: backoff and jitter bounds, the budget, transient vs permanent errors.

A fake clock stands in for ``time`` in the retry module: no test sleeps.
"""

import errno
import os
import random

import fsspec
import pytest

from elastic_train.errors import StorageError, StorageFullError
from elastic_train.storage import retry
from elastic_train.storage.retry import RetryPolicy, is_transient
from elastic_train.storage.stores import StoreAdapter


class FakeClock:
    """``time.monotonic``/``time.sleep`` of the retry module: sleeping moves the clock."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


class Flaky:
    """Fails with ``errors`` one per call, then returns "ok"."""

    def __init__(self, *errors):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(retry, "time", fake)
    return fake


@pytest.fixture
def longest_waits(monkeypatch):
    """Jitter always draws its upper bound, so the schedule of caps shows."""
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: high)


def test_backoff_doubles_up_to_the_cap(clock, longest_waits):
    fn = Flaky(*[ConnectionResetError("reset")] * 7)
    assert RetryPolicy(budget_s=1000, base_delay_s=0.2, max_delay_s=3.0).call("w", "x", fn) \
        == "ok"
    assert clock.sleeps == pytest.approx([0.4, 0.8, 1.6, 3.0, 3.0, 3.0, 3.0])
    assert fn.calls == 8


def test_full_jitter_draws_each_wait_between_zero_and_its_cap(clock, monkeypatch):
    draws = []
    rng = random.Random(7)

    def uniform(low, high):
        draws.append((low, high))
        return rng.uniform(low, high)

    monkeypatch.setattr(retry.random, "uniform", uniform)
    policy = RetryPolicy(budget_s=1000, base_delay_s=0.1, max_delay_s=1.0)
    policy.call("w", "x", Flaky(*[TimeoutError()] * 20))
    caps = [min(1.0, 0.1 * 2 ** n) for n in range(1, 21)]
    assert draws == [(0, cap) for cap in caps]
    assert all(0 <= s <= cap for s, cap in zip(clock.sleeps, caps, strict=True))
    assert len(set(clock.sleeps)) > 15  # jittered, not a fixed schedule


def test_an_outage_past_the_budget_names_the_operation_and_the_last_error(clock):
    last = ConnectionRefusedError(errno.ECONNREFUSED, "refused, last")
    fn = Flaky(*[ConnectionRefusedError(errno.ECONNREFUSED, "refused")] * 50, last)
    with pytest.raises(StorageError) as info:
        RetryPolicy(budget_s=10, base_delay_s=0.5, max_delay_s=2).call(
            "writing run.json", "s3://bucket/run", fn)
    message = str(info.value)
    assert "writing run.json at s3://bucket/run failed after" in message
    assert f"after {len(clock.sleeps) + 1} attempts over 10s" in message
    assert "refused" in message and isinstance(info.value.__cause__, ConnectionRefusedError)
    assert sum(clock.sleeps) <= 10
    assert fn.calls == len(clock.sleeps) + 1


def test_the_budget_starts_at_the_first_failure_not_the_first_attempt(clock):
    """A long upload that fails at its end is retried like a quick call."""
    def ten_minutes_then(fail: Flaky):
        def call():
            clock.now += 600
            return fail()
        return call

    assert RetryPolicy(budget_s=10).call("w", "x", ten_minutes_then(
        Flaky(ConnectionResetError("reset")))) == "ok"


def test_a_zero_budget_tries_once(clock):
    fn = Flaky(TimeoutError("slow"))
    with pytest.raises(StorageError, match="after 1 attempts"):
        RetryPolicy(budget_s=0).call("w", "x", fn)
    assert fn.calls == 1 and clock.sleeps == []


@pytest.mark.parametrize("error", [FileNotFoundError("gone"), PermissionError("denied"),
                                   ValueError("bad json"), KeyError("k")])
def test_permanent_errors_fail_at_once_as_they_are(clock, error):
    fn = Flaky(error)
    with pytest.raises(type(error)):
        RetryPolicy().call("w", "x", fn)
    assert fn.calls == 1 and clock.sleeps == []


def test_before_retry_runs_before_every_retry_and_not_the_first_attempt(clock):
    cleared = []
    fn = Flaky(TimeoutError(), TimeoutError())
    RetryPolicy().call("w", "x", fn, before_retry=lambda: cleared.append(fn.calls))
    assert cleared == [1, 2] and fn.calls == 3


class HTTPError(Exception):
    """An HTTP client's error carrying the status: aiohttp's ``.status``, or requests'
    ``.response.status_code``."""

    def __init__(self, status, where="status"):
        super().__init__("Service Unavailable" if status >= 500 else "Forbidden")
        if where == "status":
            self.status = status
        else:
            self.response = type("Response", (), {"status_code": status})()


def chained(outer, inner, how="cause"):
    setattr(outer, f"__{how}__", inner)
    return outer


@pytest.mark.parametrize("exc,expected", [
    (ConnectionResetError(), True),
    (TimeoutError(), True),
    (OSError(errno.ETIMEDOUT, "x"), True),
    (OSError(errno.EHOSTUNREACH, "x"), True),
    (OSError(errno.ENOSPC, "No space left on device"), False),
    (HTTPError(503), True),
    (HTTPError(429), True),
    (HTTPError(500, "response"), True),
    (HTTPError(403), False),
    (HTTPError(400, "response"), False),
    (ValueError("not a number"), False),
    (chained(RuntimeError("wrapped"), ConnectionError()), True),
    (chained(RuntimeError("wrapped"), TimeoutError(), how="context"), True),
    # permanent at the top wins over a transient cause
    (chained(PermissionError("denied"), ConnectionError()), False),
    (chained(FileNotFoundError("gone"), TimeoutError()), False),
])
def test_transient_or_permanent(exc, expected):
    assert is_transient(exc) is expected


# The message text is never a sign: it holds paths and names the user chose (#24, item 7).
@pytest.mark.parametrize("exc", [
    OSError(errno.ENOSPC, "No space left on device", "/runs/bs500/checkpoint_000500/model.pt"),
    OSError(errno.EROFS, "Read-only file system", "/runs/timeout-sweep/checkpoint_000503"),
    OSError(errno.EDQUOT, "Disk quota exceeded", "/runs/connect-4/checkpoint_000502"),
    RuntimeError("cannot write /runs/slowdown-temporarily/checkpoint_000500: 504 rows"),
    ValueError("Expecting value: line 1 column 500 (char 499)"),
])
def test_a_message_that_looks_transient_is_not_retried(exc):
    assert is_transient(exc) is False


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_disk_full_on_a_path_with_500_in_it_fails_at_once_saying_so(clock, code):
    """Not retried, and said: the storage is full, which file, the way out."""
    fn = Flaky(OSError(code, os.strerror(code), "/runs/bs500/checkpoint_000500"))
    with pytest.raises(StorageFullError) as info:
        RetryPolicy(budget_s=300).call("uploading checkpoint_000500", "s3://b/runs", fn)
    assert fn.calls == 1 and clock.sleeps == []
    assert str(info.value).startswith("uploading checkpoint_000500 at s3://b/runs failed: the "
                                      "storage is full"), info.value
    assert "/runs/bs500/checkpoint_000500" in str(info.value) and "Free space" in str(info.value)


class ClientError(Exception):
    """botocore's ClientError as s3fs sees it: the code and status in ``response``."""

    def __init__(self, code, status):
        super().__init__(f"An error occurred ({code})")
        self.response = {"Error": {"Code": code, "Message": "m"},
                         "ResponseMetadata": {"HTTPStatusCode": status}}


@pytest.mark.parametrize("exc,expected", [
    (ClientError("SlowDown", 503), True),
    (ClientError("Throttling", 400), True),  # throttled with a 400: the code says it
    (ClientError("RequestTimeout", 400), True),
    (ClientError("InternalError", 500), True),
    (ClientError("AccessDenied", 403), False),
    (ClientError("NoSuchBucket", 404), False),
    # s3fs's translation: an OSError whose cause is the ClientError
    (chained(OSError(errno.EBUSY, "Please reduce your request rate."),
             ClientError("SlowDown", 503)), True),
    (chained(OSError(errno.EIO, "timeout 500 internal"), ClientError("InvalidRange", 416)),
     False),
])
def test_s3_errors_are_judged_by_their_code_and_status(exc, expected):
    from elastic_train.storage.stores.s3 import S3Store

    assert is_transient(exc, S3Store(fsspec.filesystem("memory")).transient) is expected


def test_a_rejected_certificate_is_not_retried_a_cut_tls_connection_is():
    import ssl

    from botocore.exceptions import SSLError

    from elastic_train.storage.stores.s3 import S3Store

    transient = S3Store(fsspec.filesystem("memory")).transient
    rejected = SSLError(endpoint_url="https://s3.example", error=ssl.SSLCertVerificationError(
        1, "certificate verify failed"))
    cut = SSLError(endpoint_url="https://s3.example", error=ssl.SSLEOFError(8, "EOF"))
    assert is_transient(rejected, transient) is False
    assert is_transient(chained(OSError(errno.EIO, "x"), rejected), transient) is False
    assert is_transient(cut, transient) is True


def test_a_cycle_of_causes_ends():
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert is_transient(a) is False


class QuotaError(Exception):
    """An error only its store knows to be passing."""


class QuotaStore(StoreAdapter):
    def transient(self, exc):
        return isinstance(exc, QuotaError)


def test_a_stores_own_signs_are_retried_only_for_that_store(clock):
    store = QuotaStore(fsspec.filesystem("memory"))
    assert RetryPolicy().for_store(store).call("w", "x", Flaky(QuotaError())) == "ok"
    assert is_transient(chained(RuntimeError("wrapped"), QuotaError()), store.transient)
    with pytest.raises(QuotaError):
        RetryPolicy().call("w", "x", Flaky(QuotaError()))
