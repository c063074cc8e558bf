"""What the ETA-aware backfill of gang/admission.plan_admission reads (pure): when each node's
current work ends, and how long a waiting gang will run.

- A running TrainingJob ends `status.progress.etaSeconds` from now (the trainer's ETA as last
  reported); one without, in a first attempt that states spec.scheduling.expectedRunSeconds, that
  long after status.startTime (the reading early start trusts too); else "never" (inf), and its
  node is never lent.
- A node's work ends when the last of its TrainingJob pods ends. A pod admitted and not bound yet,
  another owner's pod, and a job more than OVERDUE_SECONDS past its end end "never": none is known
  to end. A node agent (a DaemonSet's pod or a static pod) holding cpu and memory only stays beside
  whatever runs there: it does not keep the node from freeing, or no node of a real cluster would.
- A waiting gang's estimate is `spec.scheduling.expectedRunSeconds` when set; else, for a job that
  ran before (requeued, preempted), its steps left after the newest checkpoint times the step time
  it last measured (status.goodput.stepMilliseconds); else none, and the gang keeps today's rule.

An estimate that turns out short delays the head by the overrun: the promise holds as far as the
estimates do (conservative backfilling). docs/scheduling.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.gang.capacity import ResourceList, holds_extended


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


# An estimate is one: a job this little past its end still ends; one further past has no known end.
OVERDUE_SECONDS: Final = 2.0


# A pod whose priority is not known (a create in flight): assumed the lowest.
UNKNOWN_PRIORITY: Final = -(2**31)


@dataclass(frozen=True, slots=True)
class PodOnNode:
    """A pod holding room on a node, as the backfill and early start read it."""

    node: str
    job: str | None  # the TrainingJob it belongs to ("namespace/name"), None for other owners
    bound: bool  # False: admitted, pinned to the node, not bound yet
    requests: ResourceList  # shared by every pass that reads the pod (gang/usage.py): read, never changed
    priority: int  # its spec.priority, as the scheduler compares it (UNKNOWN_PRIORITY: not known)
    agent: bool = False  # a node agent (a DaemonSet's or a static pod): there for good, beside any work


def stated_end(job: Mapping[str, Any], started: float | None) -> float | None:
    """When a Running job ends by the run time it states: spec.scheduling.expectedRunSeconds after
    `started` (its status.startTime), in a first attempt that never restarted only (startTime is
    not reset by a restart); else None."""
    status = job.get("status") or {}
    expected = ((job.get("spec") or {}).get("scheduling") or {}).get("expectedRunSeconds")
    restarted = bool(status.get("attempt")) or any(
        isinstance(count, int) and count > 0 for count in (status.get("restarts") or {}).values()
    )
    if status.get("phase") != "Running" or started is None or restarted:
        return None
    if not isinstance(expected, int) or isinstance(expected, bool):
        return None
    return started + expected


def node_free_at(pods: Iterable[PodOnNode], job_ends: Mapping[str, float], now: float) -> dict[str, float]:
    """Every pod holding room -> when each node's work ends (a node absent: nothing to wait for)."""
    free_at: dict[str, float] = {}
    for pod in pods:
        if pod.agent and not holds_extended(pod.requests):
            continue  # beside the work for good, bound or about to be: the node frees without it
        end = pod_end(pod, job_ends, now)
        free_at[pod.node] = max(free_at.get(pod.node, end), end)
    return free_at


def pod_end(pod: PodOnNode, job_ends: Mapping[str, float], now: float) -> float:
    """When a pod's work ends (inf: not known): its job's end, once the pod is bound; not for another
    owner's pod, nor for a job more than OVERDUE_SECONDS past its end (an estimate is one: a job a
    little past it still ends)."""
    end = job_ends.get(pod.job, math.inf) if pod.job is not None and pod.bound else math.inf
    return math.inf if end < now - OVERDUE_SECONDS else end


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
