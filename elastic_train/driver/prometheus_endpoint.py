"""A node's Prometheus endpoint: :mod:`.node_metrics`' figures at ``/metrics``.

Opt-in (``MetricsConfig(port=...)``, ``launch --metrics-port``); needs the ``metrics``
extra (``pip install 'elastic-train[metrics]'``, i.e. ``prometheus_client``). The port
is checked by :func:`check_port` before any process starts (a taken or privileged
port is a ConfigError naming the value and the fix), then served by
prometheus_client's own HTTP server thread from the driver once the run starts
(after the worker zygote is forked, so the driver stays safe to fork). Who may reach
it: anyone who can reach the node's address; it serves only these figures (no
secrets, nothing written), read-only, so bind it to an address only the scraper can
reach (``MetricsConfig(address=...)``) when the network is shared.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

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


def check_port(address: str, port: int) -> None:
    """Raises ConfigError unless this node can serve ``address:port`` (and the client is
    installed): the driver's check before any process starts."""
    _client()
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as sock:
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

    def serve(self, address: str, port: int) -> None:
        """Serves ``/metrics`` on ``address:port`` from a daemon thread."""
        self._server, _ = _client().start_http_server(port, address, registry=self.registry)

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
