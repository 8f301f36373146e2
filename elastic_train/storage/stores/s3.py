"""S3 and S3-compatible servers (MinIO, SeaweedFS, moto) through s3fs.

What differs here: every retry is ours (s3fs's and botocore's own are turned
off, see :meth:`S3Store.filesystem_options`), large files go in bounded
multipart uploads that a killed writer leaves open until aborted, a bucket is
never created by accident, and SeaweedFS lists an emptied directory until its
``dir/`` key is deleted. s3fs is not imported here: its filesystem is asked
through ``call_s3``.
"""

from __future__ import annotations

import ssl
import sys
from collections.abc import Collection, Hashable
from typing import Any

from elastic_train.storage.stores.base import StoreAdapter

# s3fs's multipart settings for checkpoint files: its defaults (50 MiB parts, 10 at
# once) hold up to 500 MiB of one file in memory; these hold 64 MiB, and files from
# 32 MiB up go in parts, so an interrupted large upload resends parts, not the file.
# botocore error codes of a passing fault (throttling, timeouts, the service's own errors).
TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException",
    "RequestThrottled", "RequestThrottledException", "TooManyRequestsException",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "RequestTimeout",
    "RequestTimeoutException", "InternalError", "ServiceUnavailable", "ServiceUnavailableException",
    "PriorRequestNotComplete", "EC2ThrottledException"})
PART_SIZE = 16 << 20
PARTS_AT_ONCE = 4


class S3Store(StoreAdapter):
    """An S3 bucket (fsspec's ``s3://``, ``s3a://``)."""

    access_hint = ("check the bucket name, the credentials (AWS_ACCESS_KEY_ID and "
                   "AWS_SECRET_ACCESS_KEY, a profile, or the storage options key= and "
                   "secret=) and the endpoint (the storage option endpoint_url=)")

    @classmethod
    def filesystem_options(cls, options: dict[str, Any] | None) -> dict[str, Any]:
        """``options`` with no botocore retries and bounded timeouts, unless set.

        s3fs (5 attempts, backoff up to 15 s) and botocore (its own retries) would each
        retry underneath :mod:`~elastic_train.storage.retry`, whose budget
        (``RunConfig.storage_retry_timeout_s``) then no longer bounds how long an
        outage takes to fail the run. Here every retry is ours: backoff with jitter,
        within that budget.
        """
        out = dict(options or {})
        config = {"retries": {"max_attempts": 1}, "connect_timeout": 10, "read_timeout": 60}
        out["config_kwargs"] = {**config, **out.get("config_kwargs", {})}
        return out

    def configure(self) -> None:
        self.fs.retries = 1  # s3fs's own attempts per call (a class attribute, not an argument)

    def endpoint(self) -> Any:
        return super().endpoint() or self.fs.storage_options.get("client_kwargs", {}).get(
            "endpoint_url")

    def transient(self, exc: BaseException) -> bool:
        """botocore's errors: a ``ClientError`` whose error code or HTTP status passes
        (5xx, 429, throttling and timeout codes), or a lost connection or timeout of
        botocore's HTTP client (no ``ConnectionError`` of Python's) -- but not a TLS
        certificate the client rejected (botocore's ``SSLError`` is a ``ConnectionError``
        too; a bad certificate stays bad for the whole retry budget)."""
        exceptions = sys.modules.get("botocore.exceptions")
        if exceptions is not None and isinstance(exc, exceptions.SSLError):
            return not _certificate_rejected(exc)  # a TLS connection cut: try again
        if exceptions is not None and isinstance(
                exc, (exceptions.ConnectionError, exceptions.HTTPClientError)):
            return True
        response = getattr(exc, "response", None)
        if not isinstance(response, dict):
            return False
        error, meta = response.get("Error"), response.get("ResponseMetadata")
        code = error.get("Code") if isinstance(error, dict) else None
        status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        return code in TRANSIENT_CODES or (isinstance(status, int)
                                           and (status >= 500 or status == 429))

    def version(self, info: dict[str, Any]) -> Hashable:
        """The object's ETag (its bytes' MD5 for a single PUT), beside its size."""
        return info.get("size"), info.get("ETag")

    def put_options(self) -> dict[str, Any]:
        """Bounds the memory one file's upload holds (see PART_SIZE)."""
        return {"chunksize": PART_SIZE, "max_concurrency": PARTS_AT_ONCE}

    def missing_bucket(self, path: str) -> str | None:
        """Asked before the first write: s3fs's ``makedirs`` (and stores that create a
        bucket on first upload) would otherwise create a mistyped bucket. Errors other
        than "not found" (no permission to ask, the endpoint down) answer None: the
        write that follows says what is wrong."""
        bucket = self.fs.split_path(path)[0]
        try:
            self.fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            return bucket
        except Exception:  # the write probe reports it
            return None
        return None

    def remove_tree(self, path: str) -> None:
        """Also deletes the key ``path/``: SeaweedFS's S3 server (a filer underneath)
        keeps an emptied directory in listings until then; elsewhere it is a no-op."""
        super().remove_tree(path)
        bucket, key, _ = self.fs.split_path(path)
        self.fs.call_s3("delete_object", Bucket=bucket, Key=key.rstrip("/") + "/")
        self.fs.invalidate_cache(path)

    def abort_unfinished_uploads(self, path: str, only: Collection[str] | None = None) -> int:
        """Files from ``2 * PART_SIZE`` up go in parts: the parts of an upload cut short
        are invisible to listings, yet stored and billed until aborted. ``only`` limits
        it to uploads to these paths (a writer retrying its own files, while other
        writers' uploads under ``path`` go on)."""
        bucket, key, _ = self.fs.split_path(path)
        listing = self.fs.call_s3("list_multipart_uploads", Bucket=bucket,
                                  Prefix=key.rstrip("/") + "/")
        keys = None if only is None else {self.fs.split_path(p)[1] for p in only}
        uploads = [u for u in listing.get("Uploads", []) if keys is None or u["Key"] in keys]
        for upload in uploads:
            self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"],
                            UploadId=upload["UploadId"])
        return len(uploads)


def _certificate_rejected(exc: BaseException) -> bool:
    """Whether botocore's ``SSLError`` comes from a certificate that failed verification
    (the ssl error it wraps, in its ``error`` argument or its causes)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        wrapped = getattr(current, "kwargs", {}).get("error")
        if isinstance(wrapped, ssl.SSLCertVerificationError) \
                or isinstance(current, ssl.SSLCertVerificationError):
            return True
        current = current.__cause__ or current.__context__
    return False
