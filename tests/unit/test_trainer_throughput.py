"""Honest throughput: tokens/s from the wall time between step starts, MFU from a table of device
peaks, and model FLOPs that leave embedding lookups out."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from phalanx_trainer.hardware import PEAK_FLOPS_TABLE, peak_flops_for
from phalanx_trainer.metrics import StepReport, TrainerMetrics, seconds_per_step_between
from phalanx_trainer.models import model_flops_per_token

pytestmark = pytest.mark.unit


def report(step: int, phase_seconds: float) -> StepReport:
    return StepReport(
        step=step,
        total_steps=10,
        loss=1.0,
        learning_rate=1e-3,
        grad_norm=1.0,
        loss_scale=1.0,
        skipped=False,
        data_wait_seconds=0.0,
        forward_backward_seconds=phase_seconds,
        optimizer_seconds=0.0,
        tokens=1000,
        samples=4,
    )


def test_seconds_per_step_is_the_mean_interval_between_step_starts() -> None:
    assert seconds_per_step_between([10.0, 11.0, 13.0]) == pytest.approx(1.5)
    assert seconds_per_step_between([10.0]) is None
    assert seconds_per_step_between([]) is None


def test_tokens_per_second_counts_what_happens_between_steps() -> None:
    # Each step computes for 0.5 s, then a checkpoint staging and the stop agreement take 0.5 s
    # more before the next step starts: the rate is 1000 tokens per 1 s, not per 0.5 s.
    metrics = TrainerMetrics(flops_per_token=6.0, peak_flops=6000.0, devices=1)
    for step in range(1, 5):
        metrics.step_started(at=float(step - 1))
        metrics.record_step(report(step, phase_seconds=0.5))
    progress = metrics.publish(report(4, phase_seconds=0.5), None)
    assert progress["tokens_per_second"] == pytest.approx(1000.0)
    assert progress["eta_seconds"] == pytest.approx(6 * 1.0)
    assert metrics.mfu._value.get() == pytest.approx(1.0)  # 6 FLOPs x 1000 tokens/s over 6000


def test_each_interval_is_counted_in_one_window_only() -> None:
    metrics = TrainerMetrics(flops_per_token=1.0, peak_flops=0.0, devices=1)
    for step, start in enumerate([0.0, 1.0, 2.0], start=1):
        metrics.step_started(at=start)
        metrics.record_step(report(step, phase_seconds=0.1))
    metrics.publish(report(3, phase_seconds=0.1), None)
    for step, start in enumerate([6.0, 10.0], start=4):  # the interval 2 -> 6 s belongs to step 3
        metrics.step_started(at=start)
        metrics.record_step(report(step, phase_seconds=0.1))
    progress = metrics.publish(report(5, phase_seconds=0.1), None)
    assert progress["tokens_per_second"] == pytest.approx(1000.0 / 4.0)


def test_the_first_report_falls_back_to_the_measured_phases() -> None:
    metrics = TrainerMetrics(flops_per_token=1.0, peak_flops=0.0, devices=1)
    metrics.step_started(at=0.0)
    metrics.record_step(report(1, phase_seconds=0.25))
    assert metrics.publish(report(1, phase_seconds=0.25), None)["tokens_per_second"] == pytest.approx(4000.0)


@pytest.mark.parametrize(
    ("device_name", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100-PCIE-40GB", 312e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA B200", 2250e12),
        ("NVIDIA GB200", 2500e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA A10G", 70e12),
        ("NVIDIA A10", 125e12),
        ("AMD Instinct MI300X", 1307e12),
    ],
)
def test_peak_flops_come_from_the_device_name(device_name: str, peak: float) -> None:
    assert peak_flops_for(device_name) == pytest.approx(peak, rel=0.01)


def test_unknown_devices_have_no_peak() -> None:
    assert peak_flops_for("cpu") is None
    assert peak_flops_for("NVIDIA Tesla V100-SXM2-16GB") is None  # no bf16 tensor cores


def test_every_table_row_is_reachable() -> None:
    # A broad pattern listed before a narrower one (h200 before gh200) would shadow it.
    for index, (_, example, peak) in enumerate(PEAK_FLOPS_TABLE):
        assert peak_flops_for(example) == peak, (index, example)


def test_flops_of_a_custom_model_leave_the_embedding_out() -> None:
    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(1000, 8)  # a lookup, no multiply-adds
            self.proj = nn.Linear(8, 8)  # 72 parameters
            self.head = nn.Linear(8, 1000, bias=False)  # 8000 parameters

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.head(self.proj(self.embed(x)))
            return out

    assert model_flops_per_token(Custom()) == 6.0 * (72 + 8000)


def test_a_weight_tied_to_the_head_is_counted_once_as_a_matmul() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(100, 4)
            self.head = nn.Linear(4, 100, bias=False)
            self.head.weight = self.embed.weight

    assert model_flops_per_token(Tied()) == 6.0 * 400


def test_phase_timer_on_cpu_reads_the_host_clock_between_marks() -> None:
    from phalanx_trainer.timing import PhaseTimer

    timer = PhaseTimer(torch.device("cpu"))
    for _ in range(3):
        timer.mark()
    first, second = timer.seconds()
    assert first >= 0 and second >= 0
    assert timer.seconds() == []  # each step starts afresh
