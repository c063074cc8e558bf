"""When a running gang counts as hung (pure): no training step for longer than a bound.

A rank stuck in a collective (a peer stopped, a wedged device, a deadlock in user code) blocks every
other rank at its next collective, and the gang still looks Running: its pods are up and their
processes alive. The operator sees it in rank 0's /progress: the step stops advancing. The bound is
spec.runPolicy.hangTimeoutSeconds when set; else STEP_MULTIPLE times the step time the trainer
reports, never below FLOOR_SECONDS (saves, evaluation and data-set passes stall the loop for a
while without anything being wrong).

The trainer's own collective timeout is set c.HANG_COLLECTIVE_MARGIN_SECONDS above a bound the spec
sets (builders/pods.py), so the
operator acts first and can name the pods that stopped answering; the trainer's timeout is the
backstop when the operator cannot act.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

REASON_HANG: Final = "Hang"  # the restart's reason, and a bad node's (rules/bad_nodes.py)
FLOOR_SECONDS: Final = 300.0
STEP_MULTIPLE: Final = 20
# Pods are asked whether they still answer once the step has stalled this share of the bound.
PROBE_AT_SHARE: Final = 0.5
# A stall counts only while the operator's own poller keeps looking: one it has not looked at for
# this long (the poller behind, an operator just restarted) is the operator's, not the gang's.
POLL_STALE_SECONDS: Final = 60.0
# The probe asks PROBE_CONCURRENCY pods at a time, each given PROBE_TIMEOUT_SECONDS to answer.
PROBE_TIMEOUT_SECONDS: Final = 2.0
PROBE_CONCURRENCY: Final = 8


@dataclass(frozen=True)
class HangBound:
    seconds: float
    source: str  # how it was chosen, for the message


@dataclass(frozen=True)
class Hang:
    step: int
    stalled_seconds: float
    bound: HangBound
    silent_pods: tuple[str, ...]  # pods whose trainer did not answer when asked

    def message(self) -> str:
        who = (
            f"; not answering: {', '.join(self.silent_pods)}"
            if self.silent_pods
            else "; every pod still answers (a collective or the loop is stuck)"
        )
        return (
            f"no training step for {self.stalled_seconds:.0f}s since step {self.step} "
            f"(bound {self.bound.seconds:.0f}s: {self.bound.source}){who}"
        )


def hang_bound(spec_seconds: int | None, seconds_per_step: float | None) -> HangBound:
    if spec_seconds is not None:
        return HangBound(float(spec_seconds), "spec.runPolicy.hangTimeoutSeconds")
    if seconds_per_step and seconds_per_step * STEP_MULTIPLE > FLOOR_SECONDS:
        return HangBound(seconds_per_step * STEP_MULTIPLE, f"{STEP_MULTIPLE} x the step time")
    return HangBound(FLOOR_SECONDS, f"the {FLOOR_SECONDS:.0f}s floor")


def stalled_since(report: Mapping[str, Any] | None, attempt: int) -> tuple[int, float] | None:
    """The step rank 0 of this attempt last reached and since when (the poller's clock), when it has
    trained a step of this attempt and is not done."""
    if report is None or report.get("attempt") != attempt:
        return None
    # last_step moves at every step; step only at logged ones (a trainer without last_step).
    step = report.get("last_step", report.get("step"))
    seen_at, total = report.get("step_seen_at"), report.get("total_steps")
    if not isinstance(step, int) or not isinstance(seen_at, (int, float)):
        return None
    if not (report.get("startup") or {}).get("first_step"):
        return None  # start-up and restore are the recovery timeline's, not a hang
    if isinstance(total, int) and step >= total:
        return None  # the final save and the exit are not training steps
    return step, float(seen_at)


def _stall(
    report: Mapping[str, Any] | None, attempt: int, spec_seconds: int | None
) -> tuple[int, float, HangBound] | None:
    """The stalled step, since when, and the bound it is held to (None: nothing to look at)."""
    since = stalled_since(report, attempt)
    if since is None or report is None:
        return None
    per_step = report.get("seconds_per_step")
    return *since, hang_bound(spec_seconds, per_step if isinstance(per_step, (int, float)) else None)


def detect(
    report: Mapping[str, Any] | None, attempt: int, now: float, spec_seconds: int | None, pods: int = 1
) -> tuple[Hang | None, float | None]:
    """The hang, if the gang is hung now; else the seconds after which to look again (None: nothing
    to look at). `pods`: the attempt's, which the probe asks (probe_wait_seconds)."""
    stall = _stall(report, attempt, spec_seconds)
    if stall is None or report is None:
        return None, None
    step, seen_at, bound = stall
    stalled = now - seen_at
    if stalled <= bound.seconds:
        return None, bound.seconds - stalled
    polled_at = report.get("polled_at")
    if isinstance(polled_at, (int, float)):
        if now - polled_at > POLL_STALE_SECONDS:
            return None, 5.0  # the poller has not looked lately: no verdict on what it did not see
        if polled_at - seen_at <= bound.seconds:
            # No look has found the step stalled past the bound yet: polled less often than the
            # bound (many jobs, policy/progress_polls.py), it may have moved since the last one.
            # Only the next poll can tell: look again just after it, not every few seconds.
            after = report.get("next_poll_after")
            if isinstance(after, (int, float)) and (left := polled_at + after - now) > 0:
                return None, left + PROBE_TIMEOUT_SECONDS
            return None, 5.0
    silent = report.get("silent_pods")
    if not isinstance(silent, (list, tuple)) and isinstance(polled_at, (int, float)):
        # The poll that found the stall past the bound started the probe too (polled every 30 s
        # against a 10 s bound, it is the first to find any stall): wait for its answer, so the
        # verdict names the silent pods and rules/bad_nodes.py books their nodes; not for ever:
        # counted from the poll that started the probe (the first after the bound, at most one
        # interval after it), not from the latest poll, which moves on with every poll.
        interval = report.get("next_poll_after")
        started = polled_at
        if isinstance(interval, (int, float)):
            started = min(polled_at, seen_at + bound.seconds + float(interval))
        deadline = started + probe_wait_seconds(pods)
        if now < deadline:
            return None, deadline - now
    names = tuple(sorted(str(p) for p in silent)) if isinstance(silent, (list, tuple)) else ()
    return Hang(step, stalled, bound, names), None


def probe_due(report: Mapping[str, Any] | None, attempt: int, now: float, spec_seconds: int | None) -> bool:
    """Time to ask every pod whether its trainer still answers (so a verdict can name the silent)."""
    stall = _stall(report, attempt, spec_seconds)
    return stall is not None and now - stall[1] >= stall[2].seconds * PROBE_AT_SHARE


def probe_wait_seconds(pods: int) -> float:
    """How long after the poll that started it a verdict waits for the probe's answer: its rounds of
    PROBE_CONCURRENCY pods at PROBE_TIMEOUT_SECONDS each, and two timeouts more for a probe queued
    behind another job's and for the reconcile it wakes."""
    rounds = math.ceil(max(1, pods) / PROBE_CONCURRENCY)
    return PROBE_TIMEOUT_SECONDS * (2 + rounds)
