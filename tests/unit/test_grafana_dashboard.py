"""docs/deploy/grafana-dashboard.json queries only what the Prometheus endpoint exports:
every metric name in every panel's expression is one the exporter's registry serves, and
every exported figure has a panel."""

from __future__ import annotations

import json
import re
from pathlib import Path

from elastic_train.driver.node_metrics import METRICS
from elastic_train.driver.prometheus_endpoint import PrometheusSink
from tests.support.paths import REPO

DASHBOARD = Path(REPO) / "docs" / "deploy" / "grafana-dashboard.json"


def _exprs() -> dict[str, list[str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {panel["title"]: [t["expr"] for t in panel["targets"]] for panel in panels}


def test_every_panel_queries_metrics_the_endpoint_exports():
    exported = PrometheusSink().exposed_names()
    for title, exprs in _exprs().items():
        assert exprs, f"panel {title!r} has no query"
        for expr in exprs:
            names = set(re.findall(r"\belastic_train_\w+", expr))
            assert names, f"panel {title!r} queries no elastic-train metric: {expr}"
            unknown = names - exported
            assert not unknown, f"panel {title!r} queries {sorted(unknown)}, not exported"


def test_every_exported_figure_has_a_panel():
    queried = " ".join(e for exprs in _exprs().values() for e in exprs)
    missing = [m.name for m in METRICS if m.name not in queried]
    assert not missing, f"no panel shows {missing}"


def test_the_template_variables_query_an_exported_metric():
    exported = PrometheusSink().exposed_names()
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    for variable in variables:
        if variable["type"] == "query":
            names = set(re.findall(r"\belastic_train_\w+", variable["query"]["query"]))
            assert names and names <= exported, variable
