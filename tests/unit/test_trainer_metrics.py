"""Throughput, MFU, ETA, the /progress document and the metrics server of the trainer."""

from __future__ import annotations

import json
import urllib.request

import pytest

from phalanx_trainer.metrics import (
    METRIC_NAMES,
    MetricsServer,
    StepReport,
    TrainerMetrics,
    build_progress,
    eta_seconds,
    mfu,
)

pytestmark = pytest.mark.unit

# The keys of the example in docs/environment.md ("Progress"), which the operator parses.
DOCUMENTED_PROGRESS_KEYS = {
    "stragglers",
    "startup",
    "seconds_per_step",
    "checkpoint_stall_seconds",
    "resumed_from_step",
    "step",
    "total_steps",
    "loss",
    "tokens_per_second",
    "eta_seconds",
    "last_checkpoint",
    "attempt",
    "updated",
}


def report(step: int, seconds: float = 0.5) -> StepReport:
    return StepReport(
        step=step,
        total_steps=100,
        loss=2.5,
        learning_rate=1e-3,
        grad_norm=0.7,
        loss_scale=1.0,
        skipped=False,
        data_wait_seconds=0.1 * seconds,
        forward_backward_seconds=0.7 * seconds,
        optimizer_seconds=0.2 * seconds,
        tokens=1000,
        samples=10,
    )


def test_mfu_is_model_flops_over_peak_of_all_devices() -> None:
    # 6e6 FLOPs per token at 1e5 tokens/s on 4 devices of 1e12 peak: 6e11 / 4e12.
    assert mfu(6e6, 1e5, 1e12, 4) == pytest.approx(0.15)
    assert mfu(6e6, 1e5, 0.0, 4) == 0.0


def test_eta_counts_remaining_steps() -> None:
    assert eta_seconds(40, 100, 0.5) == 30.0
    assert eta_seconds(120, 100, 0.5) == 0.0


def test_progress_document_has_the_documented_keys() -> None:
    progress = build_progress(120, 400, 2.31, 5400.0, 88.5, (100, "2026-11-30T10:00:00Z"), 1, "now")
    assert set(progress) == DOCUMENTED_PROGRESS_KEYS
    assert progress["last_checkpoint"] == {"step": 100, "time": "2026-11-30T10:00:00Z"}
    assert build_progress(1, 2, 3.0, 4.0, 5.0, None, 0, "now")["last_checkpoint"] is None


def test_publish_turns_the_window_into_rates_and_eta() -> None:
    metrics = TrainerMetrics(flops_per_token=6e6, peak_flops=1e12, devices=1)
    for step in range(1, 5):
        metrics.record_step(report(step, seconds=0.5))
    progress = metrics.publish(report(4, seconds=0.5), None)
    assert progress["tokens_per_second"] == pytest.approx(2000.0)  # 4000 tokens in 2 s
    assert progress["eta_seconds"] == pytest.approx(96 * 0.5)
    assert metrics.mfu._value.get() == pytest.approx(6e6 * 2000.0 / 1e12)


def test_server_serves_metrics_and_progress() -> None:
    metrics = TrainerMetrics(flops_per_token=1.0, peak_flops=0.0, devices=1)
    metrics.record_step(report(1))
    metrics.publish(report(1), (1, "t"))
    server = MetricsServer(metrics, port=0, serve_progress=True, host="127.0.0.1")
    try:
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(base + "/progress", timeout=5) as response:
            assert json.loads(response.read())["step"] == 1
        with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
            text = response.read().decode()
        for name in METRIC_NAMES:
            assert name in text, name
    finally:
        server.close()


def test_other_ranks_do_not_serve_progress() -> None:
    server = MetricsServer(TrainerMetrics(1.0, 0.0, 1), port=0, serve_progress=False, host="127.0.0.1")
    try:
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/progress", timeout=5)
        assert caught.value.code == 404
    finally:
        server.close()
