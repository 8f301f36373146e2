"""A node's Prometheus endpoint: :mod:`.node_metrics`' figures at ``/metrics``.

Opt-in (``MetricsConfig(port=...)``, ``launch --metrics-port``); needs the ``metrics``
extra (``pip install 'elastic-train[metrics]'``, i.e. ``prometheus_client``). The port
is checked by :func:`check_port` before any process starts (a taken or privileged
port is a ConfigError naming the value and the fix), then served by
threads of the driver once the run starts (after the worker zygote is forked, so the
driver stays safe to fork): prometheus_client's handler on a
:class:`~elastic_train._internal.bounded_http.BoundedHTTPServer` with :data:`LIMITS`, so
that idle or slow connections take neither the driver's descriptors nor another
scraper's turn (prometheus_client's own server starts a thread per connection, with no
timeout and no cap). Who may reach it: loopback only by default
(``MetricsConfig.address``); it serves only these figures (no secrets, nothing written),
read-only, so name an address only the scraper can reach when the network is shared.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from typing import Any

from elastic_train._internal.bounded_http import BoundedHTTPServer, Limits
from elastic_train.driver.node_metrics import (
    BUCKETS_S,
    COMMON_LABELS,
    METRICS,
    Kind,
    Metric,
    require,
)
from elastic_train.errors import ConfigError

logger = logging.getLogger(__name__)


def _client() -> Any:
    return require("prometheus_client", "metrics", "port")


# A scrape is one request per connection: a whole request within 5 s, reads of at most
# 5 s, and a few scrapers at once (the driver's descriptors are its workers' too).
LIMITS = Limits(connections=32, admit_timeout_s=5.0, idle_timeout_s=5.0)


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def check_port(address: str, port: int) -> None:
    """Raises ConfigError unless this node can serve ``address:port`` (and the client is
    installed): the driver's check before any process starts."""
    _client()
    with socket.socket(_family(address)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            why = ("is privileged (this user may not bind it)" if exc.errno == errno.EACCES
                   else "is taken by another process" if exc.errno == errno.EADDRINUSE
                   else f"cannot be bound ({exc.strerror})")
            raise ConfigError(
                f"MetricsConfig.port={port} (launch: --metrics-port) on {address} {why}: "
                "pick a free port from 1024 to 65535, e.g. --metrics-port 9464, or drop it.",
                field="MetricsConfig.port") from exc


def _handler(registry: Any) -> type:
    """prometheus_client's handler of ``registry``, admitting a connection once its request
    is whole (the server's limits then let it finish)."""
    base = _client().exposition.MetricsHandler.factory(registry)

    def do_get(self: Any) -> None:
        self.server.admit()
        base.do_GET(self)

    return type("MetricsHandler", (base,), {"do_GET": do_get})


class PrometheusSink:
    """The figures as prometheus_client metrics in a registry of their own."""

    def __init__(self, registry: Any = None):
        client = _client()
        self.registry = registry if registry is not None else client.CollectorRegistry()
        kinds = {Kind.COUNTER: client.Counter, Kind.GAUGE: client.Gauge}
        self._metrics: dict[str, Any] = {}
        for metric in METRICS:
            names = (*COMMON_LABELS, *metric.labels)
            if metric.kind is Kind.HISTOGRAM:
                made = client.Histogram(metric.name, metric.help, names, buckets=BUCKETS_S,
                                        registry=self.registry)
            else:
                made = kinds[metric.kind](metric.name, metric.help, names,
                                          registry=self.registry)
            self._metrics[metric.name] = made
        self._server: Any = None

    def record(self, metric: Metric, value: float, labels: dict[str, str]) -> None:
        child = self._metrics[metric.name].labels(**labels)
        if metric.kind is Kind.COUNTER:
            child.inc(value)
        elif metric.kind is Kind.GAUGE:
            child.set(value)
        else:
            child.observe(value)

    def serve(self, address: str, port: int, limits: Limits = LIMITS) -> None:
        """Serves ``/metrics`` on ``address:port`` from daemon threads, under ``limits``."""
        server_class = type("MetricsServer", (BoundedHTTPServer,),
                            {"address_family": _family(address)})
        self._server = server_class((address, port), _handler(self.registry), limits)
        threading.Thread(target=self._server.serve_forever, name="metrics-endpoint",
                         daemon=True).start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def exposed_names(self) -> set[str]:
        """Every sample name the endpoint can serve (``_total``, ``_bucket``... included)."""
        names = set()
        for family in self.registry.collect():
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
            suffixes = {"counter": ("_total", "_created"),
                        "histogram": ("_bucket", "_count", "_sum", "_created")}
            names.update(family.name + s for s in suffixes.get(family.type, ()))
        return names
