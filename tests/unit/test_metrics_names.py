"""Metric names: every name the dashboard and the alerts use exists in code, names follow Prometheus
conventions, and the operator's /metrics endpoint serves what METRIC_NAMES promises.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from phalanx import metrics as operator_metrics
from tests.unit.test_chart import helm_binary

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "phalanx"
DASHBOARD = CHART / "files" / "dashboard.json"
SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count")
# Unit suffixes Prometheus recommends; a metric without one must be a plain count or a ratio.
UNIT_SUFFIXES = ("_seconds", "_bytes", "_ratio", "_total", "_info")
METRIC_TOKEN = re.compile(r"\bphalanx_[a-z0-9_]+\b")
QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def trainer_metric_names() -> tuple[str, ...]:
    from phalanx_trainer import metrics as trainer_metrics
    from phalanx_trainer.checkpoint import metrics as checkpoint_metrics

    return tuple(trainer_metrics.METRIC_NAMES) + tuple(checkpoint_metrics.METRIC_NAMES)


def known_names() -> set[str]:
    return set(operator_metrics.METRIC_NAMES) | set(trainer_metric_names())


def family_of(sample_name: str, known: set[str]) -> str | None:
    """The exported family a PromQL name refers to (`x_bucket` -> `x` for histograms)."""
    if sample_name in known:
        return sample_name
    for suffix in SAMPLE_SUFFIXES:
        if sample_name.endswith(suffix) and sample_name.removesuffix(suffix) in known:
            return sample_name.removesuffix(suffix)
    return None


def names_in(expr: str) -> set[str]:
    # Label values may look like metric names (phase="..."), so drop quoted strings first.
    return set(METRIC_TOKEN.findall(QUOTED.sub('""', expr)))


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield f"variable {variable['name']!r}", variable["definition"]


def alert_exprs() -> Iterator[tuple[str, str]]:
    helm = helm_binary()
    rendered = subprocess.run(
        [
            str(helm),
            "template",
            "rel",
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
    (rule_object,) = [doc for doc in yaml.safe_load_all(rendered) if doc]
    for group in rule_object["spec"]["groups"]:
        for rule in group["rules"]:
            yield f"alert {rule['alert']}", rule["expr"]


def exposition_types(registry: CollectorRegistry) -> dict[str, str]:
    """Family name as PromQL sees it -> Prometheus type, read back from the text exposition."""
    text = generate_latest(registry).decode()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))


def assert_follows_conventions(name: str, kind: str) -> None:
    assert re.fullmatch(r"phalanx_[a-z][a-z0-9_]*[a-z0-9]", name), (
        f"{name}: snake_case with the phalanx_ prefix"
    )
    if kind == "counter":
        assert name.endswith("_total"), f"counter {name} must end in _total"
    else:
        assert not name.endswith("_total"), f"{kind} {name} must not end in _total"
    if kind == "histogram":
        assert name.endswith(("_seconds", "_bytes")), f"histogram {name} must carry its unit"
    assert not re.search(r"_(milliseconds|ms|millis|minutes|hours|kb|mb|gb|percent)(_|$)", name), (
        f"{name}: use base units (seconds, bytes, ratio)"
    )


def test_every_dashboard_and_alert_metric_exists_in_code() -> None:
    known = known_names()
    used: dict[str, set[str]] = {}
    for where, expr in [*dashboard_exprs(), *alert_exprs()]:
        for name in names_in(expr):
            used.setdefault(name, set()).add(where)
    assert len(used) >= 15, f"suspiciously few metric names found: {sorted(used)}"
    unknown = {name: sorted(places) for name, places in used.items() if family_of(name, known) is None}
    assert not unknown, f"metric names used but not defined by any METRIC_NAMES: {unknown}"


def test_cross_check_catches_an_unknown_name() -> None:
    known = known_names()
    assert family_of("phalanx_admission_wait_seconds_bucket", known) == "phalanx_admission_wait_seconds"
    assert family_of("phalanx_admission_wait_seconds_total", known) is None
    assert names_in('rate(phalanx_made_up_total{phase="phalanx_not_a_metric"}[5m])') == {
        "phalanx_made_up_total"
    }


def test_operator_metric_names_match_the_exposition_and_conventions() -> None:
    types = exposition_types(operator_metrics.REGISTRY)
    exported = {name: kind for name, kind in types.items() if name.startswith("phalanx_")}
    assert set(exported) == set(operator_metrics.METRIC_NAMES)
    for name, kind in exported.items():
        assert_follows_conventions(name, kind)
        if kind == "gauge":
            assert name.endswith(UNIT_SUFFIXES) or name == "phalanx_jobs" or name.endswith("_phase"), name


def test_trainer_metric_names_follow_conventions() -> None:
    from phalanx_trainer import metrics as trainer_metrics
    from phalanx_trainer.checkpoint import metrics as checkpoint_metrics

    trainer = trainer_metrics.TrainerMetrics(flops_per_token=1.0, peak_flops=1.0, devices=1)
    trainer_types = exposition_types(trainer.registry)
    checkpoint_types = {
        name: kind
        for name, kind in exposition_types(DEFAULT_REGISTRY).items()
        if name.startswith("phalanx_trainer_checkpoint_")
    }
    assert set(trainer_types) == set(trainer_metrics.METRIC_NAMES)
    assert set(checkpoint_types) == set(checkpoint_metrics.METRIC_NAMES)
    for name, kind in {**trainer_types, **checkpoint_types}.items():
        assert_follows_conventions(name, kind)


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def job_value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, job: str) -> list[float]:
    return [value for labels, value in samples.get(name, []) if labels.get("trainingjob") == job]


def test_operator_metrics_endpoint_serves_job_series_and_forgets_deleted_jobs() -> None:
    ns, job = "scrape-ns", "scrape-job"
    server = operator_metrics.start_metrics_server(0, addr="127.0.0.1")
    try:
        port = int(server.server_port)
        operator_metrics.observe_job_created(ns, job)
        operator_metrics.observe_phase_change(ns, job, None, "Pending")
        operator_metrics.observe_admission_wait_started(ns, job, time.time() - 42)
        operator_metrics.observe_gang_admitted(ns, job, waited_seconds=42)
        operator_metrics.observe_phase_change(ns, job, "Pending", "Running")
        operator_metrics.observe_restart(ns, job, "preemption")
        operator_metrics.observe_checkpoint(ns, job, saved_at=time.time() - 300)
        operator_metrics.observe_progress(ns, job, completed_steps=25, total_steps=100)
        operator_metrics.observe_pods_created(4)

        samples = scrape(port)
        assert samples["phalanx_jobs_created_total"][0][1] >= 1
        assert job_value(samples, "phalanx_job_progress_ratio", job) == [0.25]
        (age,) = job_value(samples, "phalanx_job_checkpoint_age_seconds", job)
        assert 299 <= age < 360
        assert job_value(samples, "phalanx_job_admission_waiting_seconds", job) == []
        assert [
            labels["phase"] for labels, _ in samples["phalanx_job_phase"] if labels["trainingjob"] == job
        ] == ["Running"]
        restarts = [(labels["reason"], value) for labels, value in samples["phalanx_job_restarts_total"]]
        assert ("preemption", 1.0) in restarts
        assert samples["phalanx_admission_wait_seconds_count"][0][1] >= 1
        assert samples["phalanx_pods_created_total"][0][1] >= 4
        assert "process_resident_memory_bytes" in samples

        operator_metrics.forget_job(ns, job)
        after = scrape(port)
        for name in (
            "phalanx_job_progress_ratio",
            "phalanx_job_checkpoint_age_seconds",
            "phalanx_job_phase",
            "phalanx_job_restarts_total",
        ):
            assert job_value(after, name, job) == [], f"{name} still has series for a deleted job"
    finally:
        server.shutdown()
        server.server_close()


def sample_value(name: str, **labels: str) -> float:
    return operator_metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_phase_gauge_counts_jobs_once_and_finishes_are_counted_once() -> None:
    ns, job = "phase-ns", "phase-job"
    running_before = sample_value("phalanx_jobs", phase="Running")
    succeeded_before = sample_value("phalanx_jobs_finished_total", result="succeeded")
    operator_metrics.observe_phase_change(ns, job, None, "Running")
    operator_metrics.observe_phase_change(ns, job, None, "Running")  # replayed after an operator restart
    assert sample_value("phalanx_jobs", phase="Running") == running_before + 1
    operator_metrics.observe_phase_change(ns, job, "Running", "Succeeded")
    operator_metrics.observe_phase_change(ns, job, "Succeeded", "Succeeded")
    assert sample_value("phalanx_jobs", phase="Running") == running_before
    assert sample_value("phalanx_jobs_finished_total", result="succeeded") == succeeded_before + 1
    operator_metrics.forget_job(ns, job)
    assert sample_value("phalanx_jobs", phase="Succeeded") == 0


def test_waiting_gauge_grows_until_admission_and_restart_reasons_are_checked() -> None:
    ns, job = "wait-ns", "wait-job"
    operator_metrics.observe_admission_wait_started(ns, job, time.time() - 90)
    waiting = {
        sample.labels["trainingjob"]: sample.value
        for family in text_string_to_metric_families(generate_latest(operator_metrics.REGISTRY).decode())
        if family.name == "phalanx_job_admission_waiting_seconds"
        for sample in family.samples
    }
    assert 90 <= waiting[job] < 120
    operator_metrics.observe_gang_timeout(ns, job)
    with pytest.raises(ValueError, match="restart reason"):
        operator_metrics.observe_restart(ns, job, "bored")  # type: ignore[arg-type]
    operator_metrics.forget_job(ns, job)


def test_reconcile_timer_counts_errors_and_reraises() -> None:
    handler = "test-handler"
    errors_before = sample_value("phalanx_reconcile_errors_total", handler=handler)
    calls_before = sample_value("phalanx_reconcile_duration_seconds_count", handler=handler)
    with operator_metrics.reconcile_timer(handler):
        pass
    with pytest.raises(RuntimeError), operator_metrics.reconcile_timer(handler):
        raise RuntimeError("boom")
    assert sample_value("phalanx_reconcile_errors_total", handler=handler) == errors_before + 1
    assert sample_value("phalanx_reconcile_duration_seconds_count", handler=handler) == calls_before + 2


def served_families(port: int, known: set[str]) -> set[str]:
    return {family for name in scrape(port) if (family := family_of(name, known)) is not None}


@pytest.fixture
def trainer_server() -> Iterator[int]:
    from phalanx_trainer import metrics as trainer_metrics

    metrics = trainer_metrics.TrainerMetrics(flops_per_token=6e9, peak_flops=1e15, devices=8)
    report = trainer_metrics.StepReport(
        step=10,
        total_steps=100,
        loss=2.5,
        learning_rate=3e-4,
        grad_norm=1.0,
        loss_scale=1.0,
        skipped=False,
        data_wait_seconds=0.01,
        forward_backward_seconds=0.2,
        optimizer_seconds=0.05,
        tokens=8192,
        samples=8,
    )
    metrics.record_step(report)
    metrics.publish(report, last_checkpoint=(10, "2026-01-01T00:00:00Z"))
    server = trainer_metrics.MetricsServer(metrics, port=0, serve_progress=True, host="127.0.0.1")
    try:
        yield server.port
    finally:
        server.close()


def test_trainer_endpoint_serves_every_trainer_metric(trainer_server: int) -> None:
    from phalanx_trainer import metrics as trainer_metrics

    known = set(trainer_metrics.METRIC_NAMES)
    assert served_families(trainer_server, known) == known
    samples = scrape(trainer_server)
    assert samples["phalanx_trainer_tokens_per_second"][0][1] > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{trainer_server}/progress", timeout=5) as response:
        progress = json.loads(response.read())
    assert progress["step"] == 10 and progress["total_steps"] == 100


def test_trainer_endpoint_serves_the_checkpoint_metrics_the_dashboard_uses(trainer_server: int) -> None:
    from phalanx_trainer.checkpoint import metrics as checkpoint_metrics

    known = set(checkpoint_metrics.METRIC_NAMES)
    used = {
        family
        for _, expr in dashboard_exprs()
        for name in names_in(expr)
        if (family := family_of(name, known)) is not None
    }
    assert used, "the dashboard uses no checkpoint metric"
    assert used <= served_families(trainer_server, known)
