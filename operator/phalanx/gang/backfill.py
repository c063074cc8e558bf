"""What the ETA-aware backfill of gang/admission.plan_admission reads (pure): when each node's
current work ends, and how long a waiting gang will run.

- A running TrainingJob ends `status.progress.etaSeconds` from now (the trainer's ETA as last
  reported); one with no ETA, and any pod that is not a TrainingJob's, ends "never" (inf), so its
  node is never lent.
- A waiting gang's estimate is `spec.scheduling.expectedRunSeconds` when set; else, for a job that
  ran before (requeued, preempted), its steps left after the newest checkpoint times the step time
  it last measured (status.goodput.stepMilliseconds); else none, and the gang keeps today's rule.

An estimate that turns out short delays the head by the overrun: the promise holds as far as the
estimates do (conservative backfilling). docs/scheduling.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from phalanx.api.v1alpha1 import TrainingJobSpec


def job_end(status: Mapping[str, Any], now: float, read_at: float | None = None) -> float:
    """When a running job's work ends, as its trainer last estimated (inf: unknown); the ETA runs
    from `read_at`, the poll that read it, when known (up to a poll interval ago)."""
    eta = (status.get("progress") or {}).get("etaSeconds")
    if (
        status.get("phase") != "Running"
        or not isinstance(eta, int | float)
        or isinstance(eta, bool)
        or eta < 0
    ):
        return math.inf
    return (now if read_at is None else min(now, read_at)) + float(eta)


def node_free_at(pods: Iterable[tuple[str, str | None]], job_ends: Mapping[str, float]) -> dict[str, float]:
    """(node, job key or None) of every bound, unfinished pod -> when each node's work ends."""
    free_at: dict[str, float] = {}
    for node, job in pods:
        end = job_ends.get(job, math.inf) if job is not None else math.inf
        free_at[node] = max(free_at.get(node, end), end)
    return free_at


def estimate_seconds(spec: TrainingJobSpec, status: Mapping[str, Any]) -> float | None:
    hint = spec.scheduling.expected_run_seconds
    if hint is not None:
        return float(hint)
    total = (status.get("progress") or {}).get("totalSteps")
    step_ms = (status.get("goodput") or {}).get("stepMilliseconds")
    if not isinstance(total, int) or not isinstance(step_ms, int) or step_ms <= 0:
        return None
    done = (status.get("lastCheckpoint") or {}).get("step")
    left = total - (done if isinstance(done, int) else 0)
    return max(0, left) * step_ms / 1000 if left > 0 else None
