"""Where a run's metrics go: a Prometheus endpoint, an OpenTelemetry collector, or neither.

Both are opt-in and off by default (no port opened, no thread started, nothing imported
that the ``metrics``/``otel`` extras install). The figures and their names are those of
:mod:`elastic_train.driver.node_metrics`; docs/observability.md says how to turn each on.

Example::

    RunConfig(metrics_config=MetricsConfig(port=9464, otlp_endpoint="http://collector:4318"))
    # elastic-train launch --metrics-port 9464 --otlp-endpoint http://collector:4318 ...
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from elastic_train.errors import ConfigError


@dataclass(frozen=True)
class MetricsConfig:
    """The run's metric exporters (our addition; Ray Train exports only to its own dashboard).

    Args:
        port: Serve Prometheus's text format at ``http://<node>:<port>/metrics`` from each
            node's driver (None, the default: no endpoint). 1024-65535; a port that is
            taken is refused before any process starts. ``launch --metrics-port``.
        address: The address the endpoint listens on (default ``0.0.0.0``: every
            interface of the node). ``launch --metrics-address``.
        otlp_endpoint: Push the same metrics over OTLP/HTTP to this collector, e.g.
            ``http://collector:4318`` (``/v1/metrics`` is added when the URL has no path).
            None, the default: no push. ``launch --otlp-endpoint``.
        otlp_interval_s: Seconds between two pushes (default 10).
    """

    port: int | None = None
    address: str = "0.0.0.0"
    otlp_endpoint: str | None = None
    otlp_interval_s: float = 10.0

    def __post_init__(self) -> None:
        port = self.port
        if port is not None and not (isinstance(port, int) and not isinstance(port, bool)
                                     and 1024 <= port <= 65535):
            raise ConfigError(
                f"MetricsConfig.port={port!r} is invalid: use a free port from 1024 to 65535 "
                "(ports below 1024 are privileged), e.g. MetricsConfig(port=9464) or "
                "launch --metrics-port 9464, or None for no endpoint.",
                field="MetricsConfig.port")
        endpoint = self.otlp_endpoint
        if endpoint is not None and not (isinstance(endpoint, str) and urllib.parse.urlsplit(
                endpoint).scheme in ("http", "https") and urllib.parse.urlsplit(endpoint).netloc):
            raise ConfigError(
                f"MetricsConfig.otlp_endpoint={endpoint!r} is invalid: use the collector's "
                "OTLP/HTTP URL, e.g. 'http://collector:4318', or None for no push.",
                field="MetricsConfig.otlp_endpoint")
        interval = self.otlp_interval_s
        if not (isinstance(interval, (int, float)) and not isinstance(interval, bool)
                and interval > 0):
            raise ConfigError(
                f"MetricsConfig.otlp_interval_s={interval!r} is invalid: use a number of "
                "seconds > 0, e.g. 10.", field="MetricsConfig.otlp_interval_s")

    @property
    def enabled(self) -> bool:
        """Whether any exporter is on."""
        return self.port is not None or self.otlp_endpoint is not None

    @property
    def otlp_url(self) -> str | None:
        """The collector's metrics URL: ``otlp_endpoint``, with ``/v1/metrics`` when it has
        no path of its own."""
        if self.otlp_endpoint is None:
            return None
        parts = urllib.parse.urlsplit(self.otlp_endpoint)
        return self.otlp_endpoint if parts.path.strip("/") else \
            self.otlp_endpoint.rstrip("/") + "/v1/metrics"
