"""Prometheus metrics of the checkpoint manager (the trainer's /metrics serves the default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)

SAVE_BLOCKING_SECONDS = Histogram(
    "phalanx_trainer_checkpoint_blocking_seconds",
    "Seconds training was held up by one checkpoint save (staging to CPU)",
    buckets=_SECONDS_BUCKETS,
)
SAVE_TOTAL_SECONDS = Histogram(
    "phalanx_trainer_checkpoint_save_seconds",
    "Seconds from the start of one save until its checkpoint was committed",
    buckets=_SECONDS_BUCKETS,
)
SAVE_BYTES = Gauge(
    "phalanx_trainer_checkpoint_bytes",
    "Bytes this rank wrote in the last committed checkpoint",
)
LAST_STEP = Gauge(
    "phalanx_trainer_checkpoint_last_step",
    "Step of the newest committed (or restored) checkpoint",
)
LAST_TIME = Gauge(
    "phalanx_trainer_checkpoint_last_timestamp_seconds",
    "Unix time of the newest committed (or restored) checkpoint",
)
FALLBACKS = Counter(
    "phalanx_trainer_checkpoint_fallbacks",  # exposed as phalanx_trainer_checkpoint_fallbacks_total
    "Checkpoints skipped at resume because they failed verification (rank 0 counts)",
)
EMERGENCY_SKIPPED = Counter(
    "phalanx_trainer_checkpoint_emergency_skipped",
    "SIGTERM checkpoints skipped because the estimate exceeded the budget",
)

METRIC_NAMES: tuple[str, ...] = (
    "phalanx_trainer_checkpoint_blocking_seconds",
    "phalanx_trainer_checkpoint_save_seconds",
    "phalanx_trainer_checkpoint_bytes",
    "phalanx_trainer_checkpoint_last_step",
    "phalanx_trainer_checkpoint_last_timestamp_seconds",
    "phalanx_trainer_checkpoint_fallbacks_total",
    "phalanx_trainer_checkpoint_emergency_skipped_total",
)
