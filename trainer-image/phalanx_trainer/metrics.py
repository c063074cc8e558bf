"""Prometheus metrics and the /progress JSON, served by one small HTTP server per process.

METRIC_NAMES lists every name this module registers so the chart and dashboards can be checked
against it; /metrics also serves prometheus_client's default registry (checkpoint metrics).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from phalanx_trainer import startup
from phalanx_trainer.contract import PROGRESS_PATH

PREFIX = "phalanx_trainer_"
PHASES = ("data_wait", "forward_backward", "optimizer")

METRIC_NAMES: tuple[str, ...] = (
    "phalanx_trainer_step",
    "phalanx_trainer_total_steps",
    "phalanx_trainer_loss",
    "phalanx_trainer_learning_rate",
    "phalanx_trainer_grad_norm",
    "phalanx_trainer_loss_scale",
    "phalanx_trainer_skipped_steps_total",
    "phalanx_trainer_step_seconds",  # label phase: data_wait | forward_backward | optimizer | total
    "phalanx_trainer_phase_seconds_total",  # label phase
    "phalanx_trainer_tokens_total",
    "phalanx_trainer_tokens_per_second",
    "phalanx_trainer_samples_per_second",
    "phalanx_trainer_mfu_ratio",
    "phalanx_trainer_eta_seconds",
    "phalanx_trainer_memory_allocated_bytes",
    "phalanx_trainer_memory_peak_bytes",
    "phalanx_trainer_last_checkpoint_step",
)


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class StepReport:
    """What one optimizer step measured; rates are global (all data-parallel ranks)."""

    step: int
    total_steps: int
    loss: float
    learning_rate: float
    grad_norm: float
    loss_scale: float
    skipped: bool
    data_wait_seconds: float
    forward_backward_seconds: float
    optimizer_seconds: float
    tokens: int  # global tokens this step
    samples: int
    memory_allocated_bytes: int = 0
    memory_peak_bytes: int = 0
    forward_seconds: float = 0.0  # the forward passes alone (inside forward_backward_seconds)

    @property
    def step_seconds(self) -> float:
        return self.data_wait_seconds + self.forward_backward_seconds + self.optimizer_seconds


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops: float, devices: int) -> float:
    """PaLM's model FLOPs utilisation: achieved model FLOP/s over the peak of all devices."""
    if peak_flops <= 0 or devices <= 0:
        return 0.0
    return flops_per_token * tokens_per_second / (peak_flops * devices)


def seconds_per_step_between(step_starts: list[float]) -> float | None:
    """Mean wall time between consecutive step starts; None with fewer than two starts.

    Between step starts, not the sum of a step's phases: the interval also holds what runs after
    the optimizer (checkpoint staging, the preemption stop agreement, logging), which costs the job
    time as much as the step does.
    """
    if len(step_starts) < 2:
        return None
    return (step_starts[-1] - step_starts[0]) / (len(step_starts) - 1)


def eta_seconds(step: int, total_steps: int, seconds_per_step: float) -> float:
    return max(0, total_steps - step) * seconds_per_step


def build_progress(
    step: int,
    total_steps: int,
    loss: float,
    tokens_per_second: float,
    eta: float,
    last_checkpoint: tuple[int, str] | None,
    attempt: int,
    updated: str,
    startup_times: dict[str, str] | None = None,
    seconds_per_step: float = 0.0,
    checkpoint_stall_seconds: float = 0.0,
    resumed_from_step: int = 0,
    stragglers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The /progress document of docs/environment.md."""
    return {
        "stragglers": stragglers or [],
        "startup": startup_times or {},
        "seconds_per_step": seconds_per_step,
        "checkpoint_stall_seconds": checkpoint_stall_seconds,
        "resumed_from_step": resumed_from_step,
        "step": step,
        "total_steps": total_steps,
        "loss": loss,
        "tokens_per_second": tokens_per_second,
        "eta_seconds": eta,
        "last_checkpoint": {"step": last_checkpoint[0], "time": last_checkpoint[1]}
        if last_checkpoint
        else None,
        "attempt": attempt,
        "updated": updated,
    }


@dataclass
class TrainerMetrics:
    flops_per_token: float
    peak_flops: float
    devices: int
    attempt: int = 0
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    progress: dict[str, Any] = field(default_factory=dict)
    # Seconds the training loop waited for checkpoint saves in this process (goodput's stalls).
    checkpoint_stall_seconds: float = 0.0
    resumed_from_step: int = 0  # the checkpoint's step this process started from (0: none)
    stragglers: list[dict[str, Any]] = field(default_factory=list)  # rank 0: straggler.py's verdict
    # Rates come from the step starts since the last report (smoothed, so one slow step does not
    # swing them); the phase sums serve only until two steps have started.
    _step_starts: list[float] = field(default_factory=list)
    _window_phase_seconds: float = 0.0
    _window_steps: int = 0
    _seconds_per_step: float = 0.0

    def __post_init__(self) -> None:
        r = self.registry
        self.step = Gauge(PREFIX + "step", "Last completed optimizer step", registry=r)
        self.total_steps = Gauge(PREFIX + "total_steps", "Optimizer steps in the run", registry=r)
        self.loss = Gauge(PREFIX + "loss", "Training loss, mean over data-parallel ranks", registry=r)
        self.learning_rate = Gauge(PREFIX + "learning_rate", "Learning rate of the last step", registry=r)
        self.grad_norm = Gauge(PREFIX + "grad_norm", "Global gradient L2 norm before clipping", registry=r)
        self.loss_scale = Gauge(PREFIX + "loss_scale", "fp16 dynamic loss scale (1 otherwise)", registry=r)
        self.skipped = Counter(PREFIX + "skipped_steps_total", "Steps skipped on fp16 overflow", registry=r)
        self.step_seconds = Gauge(PREFIX + "step_seconds", "Last step's time by phase", ["phase"], registry=r)
        self.phase_seconds = Counter(PREFIX + "phase_seconds_total", "Time by phase", ["phase"], registry=r)
        self.tokens = Counter(PREFIX + "tokens_total", "Tokens trained on, all ranks", registry=r)
        self.tokens_per_second = Gauge(PREFIX + "tokens_per_second", "Global training tokens/s", registry=r)
        self.samples_per_second = Gauge(PREFIX + "samples_per_second", "Global sequences/s", registry=r)
        self.mfu = Gauge(PREFIX + "mfu_ratio", "Model FLOPs utilisation (0 when peak unknown)", registry=r)
        self.eta = Gauge(PREFIX + "eta_seconds", "Estimated seconds to the last step", registry=r)
        self.memory = Gauge(PREFIX + "memory_allocated_bytes", "Accelerator memory allocated", registry=r)
        self.memory_peak = Gauge(PREFIX + "memory_peak_bytes", "Peak accelerator memory", registry=r)
        self.last_checkpoint = Gauge(
            PREFIX + "last_checkpoint_step", "Step of the newest checkpoint", registry=r
        )

    def step_started(self, at: float) -> None:
        """Marks a step's start (time.perf_counter() seconds); rates use the intervals between starts."""
        self._step_starts.append(at)

    def record_step(self, report: StepReport) -> None:
        """Cheap per-step bookkeeping; `publish` turns it into rates."""
        self.phase_seconds.labels("data_wait").inc(report.data_wait_seconds)
        self.phase_seconds.labels("forward_backward").inc(report.forward_backward_seconds)
        self.phase_seconds.labels("optimizer").inc(report.optimizer_seconds)
        self.tokens.inc(report.tokens)
        if report.skipped:
            self.skipped.inc()
        self._window_phase_seconds += report.step_seconds
        self._window_steps += 1

    def publish(self, report: StepReport, last_checkpoint: tuple[int, str] | None) -> dict[str, Any]:
        """Updates gauges and /progress from the steps since the last publish; returns the progress."""
        between_starts = seconds_per_step_between(self._step_starts)
        if between_starts is None:
            between_starts = self._window_phase_seconds / max(self._window_steps, 1)
        self._seconds_per_step = max(between_starts, 1e-9)
        # The newest start opens the next window: every interval is counted once.
        self._step_starts = self._step_starts[-1:]
        self._window_phase_seconds, self._window_steps = 0.0, 0
        tokens_per_second = report.tokens / self._seconds_per_step
        samples_per_second = report.samples / self._seconds_per_step
        eta = eta_seconds(report.step, report.total_steps, self._seconds_per_step)

        self.step.set(report.step)
        self.total_steps.set(report.total_steps)
        self.loss.set(report.loss)
        self.learning_rate.set(report.learning_rate)
        self.grad_norm.set(report.grad_norm)
        self.loss_scale.set(report.loss_scale)
        for phase, value in zip(
            PHASES,
            (report.data_wait_seconds, report.forward_backward_seconds, report.optimizer_seconds),
            strict=True,
        ):
            self.step_seconds.labels(phase).set(value)
        self.step_seconds.labels("total").set(report.step_seconds)
        self.tokens_per_second.set(tokens_per_second)
        self.samples_per_second.set(samples_per_second)
        self.mfu.set(mfu(self.flops_per_token, tokens_per_second, self.peak_flops, self.devices))
        self.eta.set(eta)
        self.memory.set(report.memory_allocated_bytes)
        self.memory_peak.set(report.memory_peak_bytes)
        if last_checkpoint is not None:
            self.last_checkpoint.set(last_checkpoint[0])
        self.progress = build_progress(
            report.step,
            report.total_steps,
            report.loss,
            tokens_per_second,
            eta,
            last_checkpoint,
            self.attempt,
            utc_now(),
            startup.marks(),
            self._seconds_per_step,
            self.checkpoint_stall_seconds,
            self.resumed_from_step,
            self.stragglers,
        )
        return self.progress

    def note_startup(self, startup_times: dict[str, str]) -> None:
        """Serves the start-up times at once, not at the next logged step: a recovery ends at the
        first step, and a person watching it should not wait `log_every` steps to see that."""
        self.progress = {
            **self.progress,
            "attempt": self.attempt,
            "startup": startup_times,
            "resumed_from_step": self.resumed_from_step,
        }


class MetricsServer:
    """GET /metrics (Prometheus text) and GET /progress (JSON) on one port, in a daemon thread."""

    def __init__(
        self, metrics: TrainerMetrics, port: int, serve_progress: bool, host: str = "0.0.0.0"
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    # The trainer's own registry plus the default one, where the checkpoint manager
                    # (phalanx_trainer.checkpoint.metrics) and the process collectors register.
                    body = generate_latest(outer.metrics.registry) + generate_latest(REGISTRY)
                    self._reply(200, CONTENT_TYPE_LATEST, body)
                elif path == PROGRESS_PATH and outer.serve_progress:
                    self._reply(200, "application/json", json.dumps(outer.metrics.progress).encode())
                else:
                    self._reply(404, "text/plain", b"not found\n")

            def _reply(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
                return  # scrapes every few seconds would drown the training log

        self.metrics = metrics
        self.serve_progress = serve_progress
        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="phalanx-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
