"""Builds charts/phalanx/files/dashboard.json, the Grafana dashboard the chart ships.

The JSON is committed (Grafana imports it as is); this script is its source.  Rebuild with
`.venv/bin/python charts/phalanx/hack/build_dashboard.py`; tests/unit/test_chart.py fails when
the committed file is stale.  Every metric named here must exist in the operator's or the
trainer's METRIC_NAMES (tests/unit/test_metrics_names.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

DASHBOARD_PATH = Path(__file__).resolve().parents[1] / "files" / "dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
JOB_FILTER = 'namespace=~"$namespace", trainingjob=~"$trainingjob"'
NAMESPACE_FILTER = 'namespace=~"$namespace"'
PANEL_WIDTH = 8
PANEL_HEIGHT = 8

PanelType = Literal["timeseries", "stat", "bargauge"]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: PanelType = "timeseries"
    stacked: bool = False
    extra_defaults: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def quantile(q: float, histogram: str, by: str = "", selector: str = "") -> str:
    group = f"le{', ' + by if by else ''}"
    rate = f"rate({histogram}_bucket{{{selector}}}[$__rate_interval])"
    return f"histogram_quantile({q}, sum by ({group}) ({rate}))"


def per_job_max(metric: str) -> str:
    return f"max by (namespace, trainingjob) ({metric}{{{JOB_FILTER}}})"


ROWS: tuple[Row, ...] = (
    Row(
        "Jobs and admission",
        (
            Panel(
                "Jobs by phase",
                "TrainingJobs the operator knows, by phase.",
                (Query("sum by (phase) (phalanx_jobs)", "{{phase}}"),),
                stacked=True,
            ),
            Panel(
                "Admission wait",
                "Time from a gang asking for admission until all its pods were admitted.",
                (
                    Query(quantile(0.5, "phalanx_admission_wait_seconds"), "p50"),
                    Query(quantile(0.95, "phalanx_admission_wait_seconds"), "p95"),
                ),
                unit="s",
            ),
            Panel(
                "Waiting for admission now",
                "Gangs still waiting, and for how long so far.",
                (
                    Query(
                        per_job_max("phalanx_job_admission_waiting_seconds"),
                        "{{namespace}}/{{trainingjob}}",
                    ),
                ),
                unit="s",
                kind="bargauge",
            ),
            Panel(
                "Restarts by reason",
                "Gang restarts: failures count against the backoff limit, preemptions do not.",
                (
                    Query(
                        "sum by (reason) "
                        f"(increase(phalanx_job_restarts_total{{{NAMESPACE_FILTER}}}[$__rate_interval]))",
                        "{{reason}}",
                    ),
                ),
                stacked=True,
            ),
            Panel(
                "Goodput",
                "Productive device time over device time since each job was created (status.goodput).",
                (Query(per_job_max("phalanx_job_goodput_ratio"), "{{namespace}}/{{trainingjob}}"),),
                unit="percentunit",
                extra_defaults={"min": 0, "max": 1},
            ),
            Panel(
                "Stragglers",
                "Each job's slowest rank over its peers' median (data wait + forward), while one is "
                "reported; the Straggler condition names the pod and node.",
                (Query(per_job_max("phalanx_job_straggler_ratio") + " > 0", "{{namespace}}/{{trainingjob}}"),),
                kind="bargauge",
            ),
            Panel(
                "Device time by kind, per namespace",
                "Device-seconds of the namespace's jobs: productive, and lost to waiting, start-up, "
                "recovery, redone steps and checkpoint stalls.",
                (
                    Query(
                        'sum by (namespace, kind) (phalanx_job_device_seconds{kind!="allocated", '
                        + NAMESPACE_FILTER
                        + "})",
                        "{{namespace}} {{kind}}",
                    ),
                ),
                unit="s",
                stacked=True,
            ),
            Panel(
                "Recovery time",
                "From a gang disruption being seen to the first training step after it, by path.",
                (
                    Query(quantile(0.5, "phalanx_recovery_seconds", by="path"), "p50 {{path}}"),
                    Query(quantile(0.95, "phalanx_recovery_seconds", by="path"), "p95 {{path}}"),
                ),
                unit="s",
            ),
            Panel(
                "Recovery phases",
                "Median time of each recovery phase: old pods stopped, new pods running, rendezvous, "
                "state restored, first step.",
                (Query(quantile(0.5, "phalanx_recovery_phase_seconds", by="phase"), "{{phase}}"),),
                unit="s",
                stacked=True,
            ),
            Panel(
                "Gang admissions and timeouts",
                "Gangs admitted whole, and gangs requeued after missing their admission timeout.",
                (
                    Query("sum(rate(phalanx_gang_admissions_total[$__rate_interval]))", "admitted"),
                    Query("sum(rate(phalanx_gang_timeouts_total[$__rate_interval]))", "timed out"),
                ),
                unit="ops",
            ),
            Panel(
                "Progress",
                "Fraction of each job's total steps completed.",
                (
                    Query(
                        per_job_max("phalanx_job_progress_ratio"),
                        "{{namespace}}/{{trainingjob}}",
                    ),
                ),
                unit="percentunit",
                extra_defaults={"min": 0, "max": 1},
            ),
        ),
    ),
    Row(
        "Training",
        (
            # Trainer rates are global (all data-parallel ranks), so every rank reports the same
            # value: take the max per job, not the sum.
            Panel(
                "Tokens per second",
                "Global training throughput of each job.",
                (Query(per_job_max("phalanx_trainer_tokens_per_second"), "{{namespace}}/{{trainingjob}}"),),
                unit="short",
            ),
            Panel(
                "MFU",
                "Model FLOPs utilisation (PaLM's definition); 0 when the device peak is unknown.",
                (Query(per_job_max("phalanx_trainer_mfu_ratio"), "{{namespace}}/{{trainingjob}}"),),
                unit="percentunit",
                extra_defaults={"min": 0, "max": 1},
            ),
            Panel(
                "Step time split",
                "Last step's time by phase (slowest rank): data wait, forward and backward, optimizer.",
                (
                    Query(
                        'max by (phase) (phalanx_trainer_step_seconds{phase!="total", ' + JOB_FILTER + "})",
                        "{{phase}}",
                    ),
                ),
                unit="s",
                stacked=True,
            ),
            Panel(
                "Share of time by phase",
                "Fraction of training time spent in each phase, averaged over ranks.",
                (
                    Query(
                        "avg by (phase) "
                        f"(rate(phalanx_trainer_phase_seconds_total{{{JOB_FILTER}}}[$__rate_interval]))",
                        "{{phase}}",
                    ),
                ),
                unit="percentunit",
                stacked=True,
            ),
            Panel(
                "Loss",
                "Training loss, mean over data-parallel ranks.",
                (Query(per_job_max("phalanx_trainer_loss"), "{{namespace}}/{{trainingjob}}"),),
            ),
            Panel(
                "Accelerator memory peak",
                "Highest peak memory over the job's ranks.",
                (Query(per_job_max("phalanx_trainer_memory_peak_bytes"), "{{namespace}}/{{trainingjob}}"),),
                unit="bytes",
            ),
        ),
    ),
    Row(
        "Checkpoints",
        (
            Panel(
                "Checkpoint age",
                "Seconds since each job's newest valid checkpoint: what a preemption now would lose.",
                (
                    Query(
                        per_job_max("phalanx_job_checkpoint_age_seconds"),
                        "{{namespace}}/{{trainingjob}}",
                    ),
                    Query(
                        "time() - max by (namespace, trainingjob) "
                        f"(phalanx_trainer_checkpoint_last_timestamp_seconds{{{JOB_FILTER}}})",
                        "{{namespace}}/{{trainingjob}} (trainer)",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Checkpoint save time",
                "p95 of the time training was blocked by a save, and of the whole save until commit.",
                (
                    Query(
                        quantile(0.95, "phalanx_trainer_checkpoint_blocking_seconds", selector=JOB_FILTER),
                        "blocking p95",
                    ),
                    Query(
                        quantile(0.95, "phalanx_trainer_checkpoint_save_seconds", selector=JOB_FILTER),
                        "save p95",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Checkpoint fallbacks and skipped emergency saves",
                "Checkpoints refused at resume (failed verification) and SIGTERM saves skipped for time.",
                (
                    Query(
                        "sum by (namespace, trainingjob) "
                        f"(increase(phalanx_trainer_checkpoint_fallbacks_total{{{JOB_FILTER}}}[$__range]))",
                        "fallbacks {{namespace}}/{{trainingjob}}",
                    ),
                    Query(
                        "sum by (namespace, trainingjob) (increase("
                        f"phalanx_trainer_checkpoint_emergency_skipped_total{{{JOB_FILTER}}}[$__range]))",
                        "emergency skipped {{namespace}}/{{trainingjob}}",
                    ),
                ),
                kind="stat",
            ),
        ),
    ),
    Row(
        "Operator",
        (
            Panel(
                "Reconcile duration p99",
                "Wall time of reconcile handler calls.",
                (Query(quantile(0.99, "phalanx_reconcile_duration_seconds", by="handler"), "{{handler}}"),),
                unit="s",
            ),
            Panel(
                "Reconcile errors",
                "Handler calls that raised (kopf retries them).",
                (
                    Query(
                        "sum by (handler) (rate(phalanx_reconcile_errors_total[$__rate_interval]))",
                        "{{handler}}",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Pods created",
                "Worker pods created by the operator.",
                (Query("sum(rate(phalanx_pods_created_total[$__rate_interval]))", "pods/s"),),
                unit="ops",
            ),
        ),
    ),
)


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    custom: dict[str, Any] = {}
    if panel.kind == "timeseries":
        custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
        if panel.stacked:
            custom["stacking"] = {"mode": "normal", "group": "A"}
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": PANEL_HEIGHT, "w": PANEL_WIDTH, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": panel.unit, "custom": custom, **panel.extra_defaults},
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": q.expr, "legendFormat": q.legend}
            for i, q in enumerate(panel.queries)
        ],
    }


def template_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def build_dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for row in ROWS:
        row_panels = row.panels
        panels.append(
            {
                "id": next_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        for index, panel in enumerate(row_panels):
            x = (index * PANEL_WIDTH) % 24
            if index and x == 0:
                y += PANEL_HEIGHT
            panels.append(panel_json(panel, next_id, x, y))
            next_id += 1
        y += PANEL_HEIGHT
    return {
        "uid": "phalanx-overview",
        "title": "Phalanx: training jobs",
        "description": "TrainingJobs, gang admission, restarts, training throughput and checkpoints.",
        "tags": ["phalanx", "training", "kubernetes"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "utc",
        "graphTooltip": 1,
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                template_variable("namespace", "Namespace", "label_values(phalanx_job_phase, namespace)"),
                template_variable(
                    "trainingjob",
                    "TrainingJob",
                    'label_values(phalanx_job_phase{namespace=~"$namespace"}, trainingjob)',
                ),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build_dashboard(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if DASHBOARD_PATH.read_text() != text:
            print(f"{DASHBOARD_PATH} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    DASHBOARD_PATH.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
