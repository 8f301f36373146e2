"""A run's metric exporters, as its :class:`~elastic_train.MetricsConfig` asks: checked
before any process starts (:func:`check`), started with the run (:func:`start`).

Example::

    exporters.check(run_config.metrics_config)          # NodeRun.__enter__
    metrics = exporters.start(run_config.metrics_config, "digits", "node-a")
    ...                                                # the supervisor feeds it
    metrics.close()
"""

from __future__ import annotations

import logging

from elastic_train.config import MetricsConfig
from elastic_train.driver import otlp_push, prometheus_endpoint
from elastic_train.driver.node_metrics import NodeMetrics, Sink

logger = logging.getLogger(__name__)


def check(config: MetricsConfig) -> None:
    """Raises ConfigError for an exporter that cannot start: a port that is taken or
    privileged, a client that is not installed."""
    if config.port is not None:
        prometheus_endpoint.check_port(config.address, config.port)
    if config.otlp_endpoint is not None:
        otlp_push.check_installed()


def start(config: MetricsConfig, run: str, node: str) -> NodeMetrics | None:
    """The run's exporters, serving and pushing from now on; None when none is asked for.
    One that fails to start now (a port taken since :func:`check`) is a warning: the run
    goes on without it."""
    if not config.enabled:
        return None
    sinks: list[Sink] = []
    if config.port is not None:
        endpoint = prometheus_endpoint.PrometheusSink()
        try:
            endpoint.serve(config.address, config.port)
            sinks.append(endpoint)
            logger.info("Metrics: Prometheus endpoint at http://%s:%d/metrics",
                        config.address, config.port)
        except OSError as exc:
            logger.warning("Metrics: no Prometheus endpoint, %s:%d cannot be served (%s); "
                           "training goes on.", config.address, config.port, exc)
    if config.otlp_url is not None:
        sinks.append(otlp_push.OtlpSink(config.otlp_url, config.otlp_interval_s))
    return NodeMetrics(run, node, sinks)
