"""Prints, as one JSON array, every PromQL expression the chart ships: dashboard queries (with
Grafana's macros replaced by what Grafana would substitute) and the PrometheusRule's alert rules.

Feed it to the parser check built from Prometheus's own PromQL parser:

    .venv/bin/python charts/phalanx/hack/promql_exprs.py | (cd charts/phalanx/hack/promql-check && go run .)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1]
REPO_ROOT = CHART.parents[1]
GRAFANA_MACROS = {"$__rate_interval": "1m", "$__range": "1h", "$namespace": ".*", "$trainingjob": ".*"}


def without_macros(expr: str) -> str:
    for macro, value in GRAFANA_MACROS.items():
        expr = expr.replace(macro, value)
    return expr


def dashboard_exprs() -> list[str]:
    dashboard: dict[str, Any] = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [without_macros(t["expr"]) for panel in dashboard["panels"] for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        match = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable.get("definition", ""))
        if match:
            exprs.append(without_macros(match.group(1)))
    return exprs


def alert_exprs() -> list[str]:
    bin_dir = subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "cluster-bin.sh"), "--print-dir"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    rendered = subprocess.run(
        [
            f"{bin_dir}/helm",
            "template",
            "r",
            str(CHART),
            "--kube-version",
            "1.36.3",
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--show-only",
            "templates/prometheus/prometheusrule.yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rule_object: dict[str, Any] = yaml.safe_load(rendered)
    return [rule["expr"] for group in rule_object["spec"]["groups"] for rule in group["rules"]]


def main() -> int:
    json.dump(dashboard_exprs() + alert_exprs(), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
