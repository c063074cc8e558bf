"""Restart in place (spec.runPolicy.restartStrategy InPlace; policy/in_place.py), pure.

apply: a preemption or retryable failure of some pods of a running gang moves to attempt+1 keeping
the pods still running (status.inPlace, written with the attempt in one status write); only the lost
pods are deleted, and their indices are recreated once they are gone (rules/restart.py,
rules/creation.py). The restart counts as the rule it stands in for would count it: a preemption
leaves the failure budget alone, a retryable failure spends it. Where in place cannot work, an
InPlaceFallback event says why and the ordinary rules restart the whole gang.

fallback: the in-place attempt cannot go on (a kept pod's launcher refused its generation or could
not be reached, a kept pod crashed before the attempt's first step, or the replacement did not run
within the gang timeout): a full restart as a new,
uncounted attempt of the same recovery (the disruption was counted once already).
"""

from __future__ import annotations

from phalanx.pod_facts import is_deleting, is_terminal
from phalanx.policy.in_place import (
    REASON_IN_PLACE_FALLBACK,
    STOP_AT_CHECKPOINT,
    STOP_NOW,
    Fallback,
    in_place_attempt_unfinished,
    kept_pods_status,
    plan_in_place,
)
from phalanx.policy.pod_outcome import (
    REASON_CHECKPOINTED,
    REASON_DEVICE_ERROR,
    REASON_OOM,
    OutcomeKind,
    VerdictKind,
)
from phalanx.policy.spares import assign_spares
from phalanx.providers import provider_for
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import Event, PlanBuilder, parse_iso
from phalanx.reconcile.rules.restart import restart_reason
from phalanx.reconcile.rules.transitions import failure_budget_spent, new_attempt

CASCADE_KINDS = (OutcomeKind.FAILED_PERMANENT, OutcomeKind.FAILED_RETRYABLE)
CAUSES_OF_THEIR_OWN = (REASON_DEVICE_ERROR, REASON_OOM)


def apply(b: PlanBuilder, seen: Observed) -> bool:
    verdict, restarts = seen.verdict, b.status["restarts"]
    if verdict.kind not in (VerdictKind.RESTART_PREEMPTION, VerdictKind.RESTART_FAILURE):
        return False
    failure = verdict.kind is VerdictKind.RESTART_FAILURE
    if failure and failure_budget_spent(restarts) >= seen.spec.run_policy.backoff_limit:
        return False  # rules/failure.py fails the job
    decision = plan_in_place(
        seen.spec.run_policy.restart_strategy, b.old, seen.outcomes, seen.current, seen.nodes
    )
    if decision is None:
        return False
    if isinstance(decision, Fallback):
        b.plan.events.append(
            Event("Warning", REASON_IN_PLACE_FALLBACK, f"{decision.why}; restarting the whole gang instead")
        )
        return False  # rules/failure.py or rules/preemption.py restarts the gang, counted as ever
    counter = "failures" if failure else "preemptions"
    restarts[counter] = restarts.get(counter, 0) + 1
    attempt = int(b.status["attempt"]) + 1
    b.status["attempt"] = attempt
    for bookkeeping in ("admittedTime", "createdAttempt", "requeueAfter"):
        b.status.pop(bookkeeping, None)
    # A preempted rank checkpoints with its peers on SIGTERM (the agreed stop), so the kept ranks
    # stop at that checkpoint; after a crash there is no one to agree with: they stop now, and the
    # state comes from the newest checkpoint.
    # A pod replaced because its node is being emptied is still running: it takes part like a kept one.
    disrupted = [i for i in decision.lost if i not in decision.emptied]
    stop = STOP_AT_CHECKPOINT if all(_takes_part_in_checkpoint(seen, i) for i in disrupted) else STOP_NOW
    # A warm spare standing by takes each lost rank it can (policy/spares.py): told the rank with the
    # generation, kept like the survivors, relabelled as that rank's worker; no pod is created for it.
    # Not one asked to give its room to a waiting gang: it is being deleted (rules/spares.py).
    # Nor one on a node being emptied: it is evicted next.
    usable = [
        s
        for s in seen.spares.ready
        if seen.asked_to_yield(s) is None
        and str((seen.spare_pods.get(s, {}).get("spec") or {}).get("nodeName")) not in decision.emptying_nodes
    ]
    taken = assign_spares(decision.lost, usable)
    spares = [
        {"name": name, "uid": str(seen.spare_pods[name]["metadata"].get("uid")), "rank": rank}
        for rank, name in sorted(taken.items())
    ]
    b.status["inPlace"] = {"attempt": attempt, "keptPods": [*kept_pods_status(decision), *spares],
                           "time": b.now_iso, "stop": stop}  # fmt: skip
    lost = [seen.current[i] for i in decision.lost if i in seen.current]
    b.plan.delete_pods.extend(p["metadata"]["name"] for p in lost if not is_deleting(p))
    kept = ", ".join(k.name for k in decision.kept)
    replaced = [f"worker-{i}" + (f" ({decision.emptied[i]})" if i in decision.emptied else "")
                for i in decision.lost if i not in taken]  # fmt: skip
    changes = [f"replacing {', '.join(replaced)}"]
    if taken:
        takeovers = ", ".join(f"{name} takes rank {rank}" for rank, name in sorted(taken.items()))
        changes = [f"spare {takeovers}", *(changes if len(taken) < len(decision.lost) else [])]
    b.phase("Restarting", "FailureRestart" if failure else "Preempted",
            f"{verdict.message}; restarting in place as attempt {attempt}: keeping {kept}, "
            f"{', '.join(changes)}", "Warning")  # fmt: skip
    return True


def fallback(b: PlanBuilder, seen: Observed) -> bool:
    if not in_place_attempt_unfinished(b.status):
        return False
    gone = _kept_gone(b, seen)
    why = (
        f"kept pod(s) {', '.join(gone)} gone before the attempt trained (a second disruption)"
        if gone
        else None
    )
    if gone:
        restarts = b.status["restarts"]
        restarts["preemptions"] = restarts.get("preemptions", 0) + 1  # a disruption of its own
    else:
        why = _why_fall_back(b, seen)
    if why is None:
        return False
    reason = restart_reason(b)
    new_attempt(b, seen.current)
    b.status.pop("requeueAfter", None)
    message = f"{why}; restarting the whole gang as attempt {b.status['attempt']} from the newest checkpoint"
    b.plan.events.append(Event("Warning", REASON_IN_PLACE_FALLBACK, message))
    b.phase("Restarting", reason, message, "Warning")
    return True


def _takes_part_in_checkpoint(seen: Observed, index: int) -> bool:
    """The lost rank saved with its peers (exit 75), or is still saving: terminating with a grace
    period. Otherwise (a crash, a SIGKILL, a forced deletion) it can agree on nothing."""
    outcome = seen.outcomes[index]
    if outcome.reason == REASON_CHECKPOINTED:
        return True
    pod = seen.current.get(index)
    if outcome.kind is not OutcomeKind.PREEMPTED or pod is None or is_terminal(pod) or not is_deleting(pod):
        return False
    return int((pod.get("metadata") or {}).get("deletionGracePeriodSeconds") or 0) > 0


def _kept_gone(b: PlanBuilder, seen: Observed) -> list[str]:
    """Kept pods no longer there (deleted, their node gone): creation must not quietly recreate them
    as if they were the lost ones."""
    present = {(p["metadata"]["name"], p["metadata"].get("uid")) for p in seen.current.values()}
    kept = (b.status.get("inPlace") or {}).get("keptPods") or []
    return sorted(str(k.get("name")) for k in kept if (k.get("name"), k.get("uid")) not in present)


def _why_fall_back(b: PlanBuilder, seen: Observed) -> str | None:
    kept = {k.get("name") for k in (b.status.get("inPlace") or {}).get("keptPods") or []}
    # By outcome, not pod phase: a sidecar keeps a pod Running after its trainer exited.
    ended = [
        o for o in seen.outcomes if o.pod in kept and o.kind not in (OutcomeKind.RUNNING, OutcomeKind.PENDING)
    ]
    # A kept rank that crashes before the attempt trains crashed because its peer went (a torchrun
    # agent giving up on the rendezvous, a worker stuck in a collective): the disruption's cascade,
    # as in a full restart (policy/pod_outcome.py), not a failure of its own. A genuine bug recurs in
    # the full restart, with no disruption before it, and fails the job then. What has a cause of
    # its own (a device error, out of memory) is judged and counted by failure.py, and a kept pod
    # preempted by preemption.py, as at any other time.
    crashed = [o for o in ended if o.kind in CASCADE_KINDS and o.reason not in CAUSES_OF_THEIR_OWN]
    if crashed and len(crashed) == len([o for o in ended if o.kind is not OutcomeKind.PREEMPTED]):
        if any(o.kind is OutcomeKind.PREEMPTED for o in ended):
            restarts = b.status["restarts"]
            restarts["preemptions"] = restarts.get("preemptions", 0) + 1  # a disruption of its own
        return "; ".join(
            f"kept pod {o.pod} failed ({o.message}) before attempt {b.status['attempt']} trained its first "
            "step: a consequence of the disruption it was kept through"
            for o in crashed
        )
    if ended:
        return None
    refused = sorted((pod, why) for pod, why in seen.launcher_refusals.items() if pod in kept)
    if refused:
        return "; ".join(f"the launcher of {pod} did not take the generation: {why}" for pod, why in refused)
    timeout = seen.spec.scheduling.gang.timeout_seconds if provider_for(seen.spec).admits_gangs else 0
    since = parse_iso((b.status.get("inPlace") or {}).get("time"))
    if timeout <= 0 or since is None or seen.running >= seen.spec.replicas:
        return None
    # The replacement is created only once the lost pod has gone, which may take its grace period.
    grace = seen.spec.run_policy.termination_grace_period_seconds
    if b.now < since + grace + timeout:
        b.recheck(since + grace + timeout - b.now)
        return None
    return (
        "the replacement pod(s) did not run within spec.runPolicy.terminationGracePeriodSeconds="
        f"{grace} + spec.scheduling.gang.timeoutSeconds={timeout}"
    )
