"""Retries of storage operations: exponential backoff with full jitter, within a time budget.

Only transient errors are retried -- refused or reset connections, timeouts,
HTTP 5xx and throttling; a missing file, a permission error, a full or read-only
disk fail at once (a full one as a :class:`~elastic_train.errors.StorageFullError` that
says so and names the file). An error is judged by what it carries -- its type, errno, HTTP
status, a store's error code -- never by its message, which holds paths and run
names (``checkpoint_000500``, a run called ``bs500``).
The signs every store shares are here (:func:`is_transient`); a store's own
(e.g. botocore's error code and HTTP status) come from its adapter
(:meth:`~elastic_train.storage.stores.StoreAdapter.transient`), which the
run's storage binds to its policy (:meth:`RetryPolicy.for_store`).
When the budget is spent, :class:`~elastic_train.errors.StorageError` names the
operation, the storage URL and the last error.
"""

from __future__ import annotations

import errno
import logging
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from elastic_train.errors import StorageError, StorageFullError
from elastic_train.storage import node_settings

if TYPE_CHECKING:
    from elastic_train.storage.stores import StoreAdapter

logger = logging.getLogger(__name__)

T = TypeVar("T")
# A store's call with retries, as its owner makes it: (what, operation) -> the result.
Retrying = Callable[[str, Callable[[], Any]], Any]

_TRANSIENT_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE,
                     errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EAGAIN}
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
# HTTP statuses that pass: a timeout, throttling, the server's errors.
_TRANSIENT_STATUSES = {408, 429}


def _no_sign(exc: BaseException) -> bool:
    return False


def is_transient(exc: BaseException,
                 store_sign: Callable[[BaseException], bool] = _no_sign) -> bool:
    """Whether ``exc`` (or its cause) looks like a passing network or server fault;
    ``store_sign`` adds a store's own signs, asked of each exception in the chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError,
                            NotADirectoryError, FileExistsError)):
            return False
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return True
        if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
            return True
        if store_sign(exc) or _is_transient_status(http_status(exc)):
            return True
        if _is_http_client_fault(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def full_store(what: str, where: str, exc: BaseException) -> StorageFullError | None:
    """The error for ``exc`` when it says the store is full (ENOSPC, EDQUOT): the file it
    failed on and the way out; None for any other error."""
    if not (isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS):
        return None
    return StorageFullError(
        f"{what} at {where} failed: the storage is full ({exc.strerror}, writing "
        f"{exc.filename or 'a file'}). Free space there (fewer checkpoints kept: "
        "CheckpointConfig(num_to_keep=N)) or use another storage_path; then run the job "
        "again to continue from its latest checkpoint.")


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an HTTP client's error carries: aiohttp's ``status``, requests'
    ``response.status_code``, urllib's ``status``; None for other errors."""
    response = getattr(exc, "response", None)
    for value in (getattr(exc, "status", None), getattr(response, "status_code", None),
                  getattr(response, "status", None)):
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
            return value
    return None


def _is_transient_status(status: int | None) -> bool:
    return status is not None and (status >= 500 or status in _TRANSIENT_STATUSES)


def _is_http_client_fault(exc: BaseException) -> bool:
    """aiohttp's lost connections and server timeouts (fsspec's HTTP store), which are no
    ``ConnectionError``; aiohttp is asked only if something imported it already."""
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(
        exc, (aiohttp.ClientConnectionError, aiohttp.ServerTimeoutError))


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff with full jitter within ``budget_s`` seconds from the first failure.

    From the first failure, not the first attempt: an upload that ran for ten
    minutes before the store went away gets its retries like a quick call does.

    The n-th retry waits a random time between 0 and
    ``min(max_delay_s, base_delay_s * 2**n)``; there is no retry whose wait would
    end past the budget. ``store_sign`` is the store's own test for a passing fault
    (see :func:`is_transient`).
    """

    budget_s: float = 120.0
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    store_sign: Callable[[BaseException], bool] = _no_sign

    def for_store(self, store: StoreAdapter) -> RetryPolicy:
        """This policy, retrying what ``store`` (a store's adapter) says passes as well."""
        return replace(self, store_sign=store.transient)

    def call(self, what: str, where: str, fn: Callable[[], T],
             before_retry: Callable[[], object] | None = None) -> T:
        """Runs ``fn``, retrying transient errors; ``what``/``where`` name it in errors.

        ``before_retry`` runs first in every attempt after the first, within the
        same retries (e.g. to clear what the failed attempt left behind).
        """
        deadline = None
        attempt = 0
        while True:
            try:
                if attempt and before_retry is not None:
                    before_retry()
                return fn()
            except Exception as exc:
                if not is_transient(exc, self.store_sign):
                    full = full_store(what, where, exc)
                    if full is not None:
                        raise full from exc
                    raise
                deadline = deadline or time.monotonic() + self.budget_s
                attempt += 1
                delay = random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**attempt))
                if time.monotonic() + delay > deadline:
                    raise StorageError(
                        f"{what} at {where} failed after {attempt} attempts over "
                        f"{self.budget_s:.0f}s of retries; last error: {exc!r}"
                    ) from exc
                logger.warning("%s at %s failed (%r); retry %d in %.1fs", what, where, exc,
                               attempt, delay)
                time.sleep(delay)


def run_policy() -> RetryPolicy:
    """The run's policy in a worker: ``RunConfig.storage_retry_timeout_s``, which the
    node's worker plan carries (see :mod:`.node_settings`) for what reads checkpoints
    outside the session; the default outside a run."""
    budget = node_settings.current().retry_budget_s
    return RetryPolicy(budget_s=budget) if budget is not None else RetryPolicy()
