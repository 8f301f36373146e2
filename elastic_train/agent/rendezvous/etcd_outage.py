"""Waiting out an etcd that cannot be reached, for at most ``outage_timeout`` seconds a call.

A request that could not connect (refused, or no answer within the connect timeout:
a host that drops packets) reached no server, so it is safe to send again; without
that, a restarting etcd would end the job (torch's agent asks for waiting nodes every
monitor interval). urllib3's connect retries count attempts, and each attempt may
wait the whole connect timeout: with ``timeout=10`` and ``outage_timeout=30``, 32
attempts of 10 s, over five minutes for one call. Here the clock bounds the call:
each attempt waits to connect at most what is left of ``outage_timeout`` (and at
most the connect timeout), and so do the pauses between attempts (0.125 s, doubling
to 1 s). An ``outage_timeout`` of 0 gives one attempt of the full connect timeout.

The connections also keep TCP alive (a probe after 15 s idle, as Go's dialer and so
etcd's own clients do), so that a NAT or load balancer does not forget an idle pooled
connection or watch stream, and a flow whose far end is gone is found dead by the
kernel (within 30 s) rather than by the next transaction sent on it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.exceptions import ConnectTimeoutError
from urllib3.util.retry import Retry

T = TypeVar("T")

_FIRST_PAUSE_S, _LONGEST_PAUSE_S = 0.125, 1.0
KEEPALIVE_IDLE_S, KEEPALIVE_EVERY_S, KEEPALIVE_PROBES = 15, 5, 3


def keepalive_options() -> list[tuple[int, int, int]]:
    """urllib3's socket options (no Nagle) plus TCP keep-alive, where the OS has it."""
    options = [*HTTPConnection.default_socket_options, (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_EVERY_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


def could_not_connect(exc: BaseException) -> bool:
    """Whether ``exc`` (from urllib3 or requests, wrapped or not) says the request never
    connected: refused, unresolved, or no answer within the connect timeout."""
    seen: object = exc
    for _ in range(4):  # requests' error > urllib3's MaxRetryError > its reason
        if isinstance(seen, ConnectTimeoutError):  # NewConnectionError is one too
            return True
        reason = getattr(seen, "reason", None)
        args = getattr(seen, "args", ())
        seen = reason if reason is not None else (args[0] if args else None)
    return False


@dataclass(frozen=True)
class Outage:
    """How long a call waits for an unreachable etcd (see the module doc)."""

    seconds: float

    def call(self, connect_s: float | None, attempt: Callable[[float | None], T]) -> T:
        """``attempt(connect timeout)`` until it connects or ``seconds`` have passed; the
        error of the last attempt then (any error but a failure to connect at once)."""
        deadline = time.monotonic() + self.seconds
        pause = _FIRST_PAUSE_S
        while True:
            left = deadline - time.monotonic()
            connect = connect_s if self.seconds <= 0 else (
                left if connect_s is None else min(connect_s, left))
            try:
                return attempt(connect)
            except Exception as exc:
                if not could_not_connect(exc) or time.monotonic() + pause >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE_S)


class PatientAdapter(HTTPAdapter):
    """requests' adapter for etcd: each call waits out an unreachable etcd for at most
    ``outage_s`` seconds, and its connections keep TCP alive (see the module doc)."""

    def __init__(self, outage_s: float) -> None:
        self.outage = Outage(outage_s)
        super().__init__(max_retries=Retry(total=None, connect=0, read=0, status=0, other=0,
                                           redirect=0))

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("socket_options", keepalive_options())
        super().init_poolmanager(*args, **kwargs)

    def send(self, request: requests.PreparedRequest, stream: bool = False,
             timeout: Any = None, verify: Any = True, cert: Any = None,
             proxies: Any = None) -> requests.Response:
        connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        return self.outage.call(connect, lambda c: super(PatientAdapter, self).send(
            request, stream=stream, timeout=(c, read), verify=verify, cert=cert,
            proxies=proxies))
