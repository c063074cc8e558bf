"""Gang timeout (builtin provider only): a gang that does not run whole within
spec.scheduling.gang.timeoutSeconds, after admission or while the API server refuses some of its
pods, holds nodes for nothing. The attempt is torn down and requeued with backoff (gang/backoff.py);
it counts in neither restarts.failures nor restarts.preemptions (pure)."""

from __future__ import annotations

from phalanx.gang.backoff import gang_timed_out, requeue_at
from phalanx.providers import provider_for
from phalanx.reconcile.conditions import get_condition
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import (
    GANG_BACKOFF_BASE_SECONDS,
    REASON_CREATE_REFUSED,
    Event,
    PlanBuilder,
    iso,
    parse_iso,
)
from phalanx.reconcile.rules import elastic
from phalanx.reconcile.rules.transitions import new_attempt


def _tear_down(b: PlanBuilder, seen: Observed) -> None:
    timeouts = int(b.status.get("gangTimeouts") or 0) + 1
    b.status["gangTimeouts"] = timeouts
    b.status["requeueAfter"] = iso(requeue_at(b.now, timeouts, base=GANG_BACKOFF_BASE_SECONDS))
    elastic.cap_after_teardown(b, seen)  # else the next attempt is sized from the same room again
    new_attempt(b, seen.current)


def after_admission(b: PlanBuilder, seen: Observed) -> bool:
    """Admitted, not every replica running, and the timeout has passed since admission."""
    spec = seen.spec
    admitted_at = parse_iso(b.status.get("admittedTime")) or b.now
    # Only where Phalanx admitted the gang: an external scheduler's queue wait may be longer, and its
    # PodGroup carries its own timeout.
    timeout = spec.scheduling.gang.timeout_seconds if provider_for(spec).admits_gangs else 0
    if gang_timed_out(admitted_at, b.now, timeout, seen.running, spec.replicas):
        _tear_down(b, seen)
        message = (f"only {seen.running}/{spec.replicas} pod(s) running {timeout}s after admission; "
                   f"gang torn down, retrying after {b.status['requeueAfter']}")  # fmt: skip
        b.phase("Pending", "GangTimeout", message, "Warning")
        return True
    if timeout > 0:
        b.recheck(admitted_at + timeout - b.now)
    return False


def partly_created(b: PlanBuilder, seen: Observed) -> bool:
    """The API server refused some of the attempt's pods (quota, admission policy) for longer than
    the gang timeout while others exist: those hold their nodes for nothing."""
    spec, current = seen.spec, seen.current
    refused = get_condition(b.status["conditions"], "PodsCreated")
    timeout = spec.scheduling.gang.timeout_seconds
    if (
        not current
        or not provider_for(spec).admits_gangs
        or timeout <= 0
        or refused is None
        or refused.get("status") != "False"
        or refused.get("reason") != REASON_CREATE_REFUSED
    ):
        return False
    since = parse_iso(refused.get("lastTransitionTime")) or b.now
    if b.now < since + timeout:
        b.recheck(since + timeout - b.now)
        return False
    _tear_down(b, seen)
    # The next attempt's refusal, if any, starts its own clock.
    b.status["conditions"] = [x for x in b.status["conditions"] if x.get("type") != "PodsCreated"]
    message = (
        f"only {len(current)}/{spec.replicas} pod(s) could be created in {timeout}s "
        f"({refused.get('message', '')}); gang torn down, retrying after {b.status['requeueAfter']}"
    )
    if b.old.get("phase") == "Pending":  # no phase change, so phase() tells no one: a teardown is news
        b.plan.events.append(Event("Warning", "GangTimeout", message))
    b.phase("Pending", "GangTimeout", message, "Warning")
    return True
