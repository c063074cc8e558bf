"""The TrainingJob state machine (pure): given the job, its pods and the nodes, what to do next.

One decision per call; the I/O layer applies it and calls again on the next event. Every step is
idempotent: pod names are deterministic, and an attempt's pods are only created while none of an
older attempt remain (they share names).

Phases: Pending (waiting for admission or backoff) -> Admitted (pods ungated, not all running) ->
Running -> Succeeded | Failed; Restarting between attempts; Suspended while spec.runPolicy.suspend.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.gang.backoff import gang_timed_out, requeue_at
from phalanx.pod_facts import is_deleting, is_gated, is_ready, is_terminal, pod_attempt, pod_index
from phalanx.policy.node_loss import (
    DEFAULT_NODE_LOST_AFTER_SECONDS,
    attempt_in_names,
    lost_node_names,
    not_ready_since,
    on_lost_node,
    seconds_until_lost,
)
from phalanx.policy.pod_outcome import (
    REASON_NODE_LOST,
    OutcomeKind,
    PodOutcome,
    VerdictKind,
    classify_pod,
    gang_verdict,
    missing_pod_outcome,
)
from phalanx.reconcile.conditions import get_condition, set_condition

FINISHED_PHASES = ("Succeeded", "Failed")
# PodsCreated=False reason: the API server refused a pod (403 quota or policy, 422 invalid); the I/O
# layer sets it with the API's message.
REASON_CREATE_REFUSED = "CreateRefused"
# Preempted=True reason, set by the admission pass on a victim before it evicts the victim's pods.
REASON_PREEMPTED_BY_PRIORITY = "PreemptedByPriority"
GANG_BACKOFF_BASE_SECONDS = 10.0


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


def merged_events(events: list[Event]) -> list[Event]:
    """Normal events of one reconcile as one Event (for example created, then admitted at once):
    one line for a person to read and one write less per job; warnings stay on their own."""
    normal = [e for e in events if e.type == "Normal"]
    if len(normal) < 2:
        return events
    joined = Event("Normal", normal[-1].reason, "; ".join(e.message for e in normal))
    return [joined, *(e for e in events if e.type != "Normal")]


@dataclass
class Plan:
    """What the I/O layer should do, in this order: status, deletions, creations, events."""

    status: dict[str, Any]
    create_indices: list[int] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    # Deleted with no grace period: pods whose node is gone (nothing can run their SIGTERM handler).
    force_delete_pods: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    # Seconds until the state machine has something time-based to check (deadline, timeout, TTL).
    recheck_after: float | None = None
    # The pods to create carry the attempt in their names: pods of an older attempt linger on a lost
    # node under the plain names (policy/node_loss.py).
    attempt_in_names: bool = False
    # Nodes the pods to create must stay off: lost nodes where the older attempt's pods linger.
    avoid_nodes: list[str] = field(default_factory=list)


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


class _Builder:
    """Accumulates the next status and the side effects of one decision."""

    def __init__(self, job: dict[str, Any], now: float) -> None:
        self.now = now
        self.now_iso = iso(now)
        self.generation = job.get("metadata", {}).get("generation")
        self.old = dict(job.get("status") or {})
        self.status = dict(self.old)
        self.status.setdefault("attempt", 0)
        self.status.setdefault("restarts", {"failures": 0, "preemptions": 0})
        self.status["restarts"] = dict(self.status["restarts"])
        self.status.setdefault("conditions", [])
        self.status["observedGeneration"] = self.generation
        self.plan = Plan(status=self.status)

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        self.status["conditions"] = set_condition(
            self.status["conditions"], type_, status, reason, message, self.now_iso, self.generation
        )

    def phase(self, phase: str, reason: str, message: str, event_type: str = "Normal") -> None:
        if self.old.get("phase") != phase:
            self.plan.events.append(Event(event_type, reason, message))
        self.status["phase"] = phase
        self.status["message"] = message
        for type_ in ("Running", "Restarting", "Suspended", "Succeeded", "Failed"):
            if type_ == phase:
                self.condition(type_, "True", reason, message)
            elif any(x["type"] == type_ for x in self.status["conditions"]):
                self.condition(type_, "False", reason, message)

    def recheck(self, seconds: float) -> None:
        seconds = max(seconds, 0.5)
        current = self.plan.recheck_after
        self.plan.recheck_after = seconds if current is None else min(current, seconds)


def decide(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    nodes: dict[str, dict[str, Any]],
    now: float,
    node_lost_after: float = DEFAULT_NODE_LOST_AFTER_SECONDS,
) -> Plan:
    """node_lost_after: seconds a node may be not Ready before its pods count as lost."""
    spec = parse(TrainingJobSpec, job.get("spec"))
    b = _Builder(job, now)
    status = b.status
    attempt: int = status["attempt"]
    current = {pod_index(p): p for p in pods if pod_attempt(p) == attempt}
    stale = [p for p in pods if pod_attempt(p) != attempt]
    lost_nodes = lost_node_names(nodes, now, node_lost_after)
    # Pods of an older attempt on a lost node may never go (nobody confirms their deletion): the next
    # attempt does not wait for them, and takes other names. The others are waited for: they are
    # saving the SIGTERM checkpoint the next attempt resumes from.
    left_behind = [p["metadata"]["name"] for p in stale if on_lost_node(p, nodes, lost_nodes)]
    waited_for = [p for p in stale if p["metadata"]["name"] not in left_behind]
    grace_deleting = [p["metadata"]["name"] for p in stale if not p["metadata"].get("deletionTimestamp")]
    b.plan.delete_pods.extend(grace_deleting)
    # A pod bound to a Node object that no longer exists has no kubelet to stop it: remove it at once
    # (what pod garbage collection does ~40 s later) so the next attempt need not wait.
    b.plan.force_delete_pods.extend(p["metadata"]["name"] for p in pods if _on_lost_node(p, nodes))
    _count_replicas(b, spec, list(current.values()))

    if status.get("phase") in FINISHED_PHASES:
        _finished(b, spec, current)
        return b.plan

    if spec.run_policy.suspend:
        b.plan.delete_pods.extend(p["metadata"]["name"] for p in current.values() if not is_deleting(p))
        b.phase("Suspended", "Suspended", "spec.runPolicy.suspend is true: pods deleted, status kept")
        return b.plan
    if status.get("phase") == "Suspended":
        # Resumed: a fresh attempt, counted neither as failure nor as preemption. The deadline's clock
        # starts again when it runs (batch/v1 Job resets startTime on resume too).
        status["attempt"] = attempt + 1
        status.pop("startTime", None)
        b.phase("Pending", "Resumed", "resumed after suspension; creating a new attempt")
        b.plan.delete_pods.extend(p["metadata"]["name"] for p in current.values() if not is_deleting(p))
        return b.plan

    start = parse_iso(status.get("startTime"))
    deadline = spec.run_policy.active_deadline_seconds
    if deadline and start is not None:
        if now >= start + deadline:
            _fail(b, current, "DeadlineExceeded", f"ran longer than activeDeadlineSeconds={deadline}")
            return b.plan
        b.recheck(start + deadline - now)

    requeue = parse_iso(status.get("requeueAfter"))
    if requeue is not None and now < requeue:
        b.phase("Pending", "Backoff", f"gang timed out; retrying admission after {status['requeueAfter']}")
        b.recheck(requeue - now)
        return b.plan

    if waited_for:
        message = f"waiting for {len(waited_for)} pod(s) of the previous attempt to stop"
        if left_behind:
            message += f"; not for {', '.join(sorted(left_behind))} on lost node(s)"
        b.phase("Restarting", _restart_reason(b), message)
        return b.plan

    if status.get("createdAttempt") != attempt:
        if spec.scheduling.provider != "builtin":
            status.setdefault("admittedTime", b.now_iso)
        missing = [i for i in range(spec.replicas) if i not in current]
        if missing and _partial_gang_timed_out(b, spec, current):
            return b.plan
        if missing:
            b.plan.create_indices.extend(missing)
            b.plan.attempt_in_names = attempt_in_names(current.values(), stale, attempt)
            lingering_on = {
                p.get("spec", {}).get("nodeName") for p in stale if p["metadata"]["name"] in left_behind
            }
            b.plan.avoid_nodes = sorted(n for n in lingering_on if n)
            if attempt == 0 or status.get("phase") not in ("Restarting",):
                b.phase("Pending", "Created", f"created {spec.replicas} pod(s) for attempt {attempt}")
            return b.plan
        # Every pod of the attempt exists: recorded, and decided on below in the same pass.
        status["createdAttempt"] = attempt
        if any(x["type"] == "PodsCreated" for x in status["conditions"]):
            b.condition("PodsCreated", "True", "AllPodsCreated", f"all {spec.replicas} pod(s) exist")

    _recheck_nodes_going_lost(b, current.values(), nodes, node_lost_after)
    outcomes = _outcomes(spec, current, nodes, lost_nodes)
    verdict = gang_verdict(outcomes)
    if verdict.kind is VerdictKind.SUCCEEDED:
        status["completionTime"] = b.now_iso
        b.phase("Succeeded", verdict.reason, "every worker exited 0")
        return b.plan
    if verdict.kind is VerdictKind.FAILED:
        _fail(b, current, verdict.reason, verdict.message)
        return b.plan
    if verdict.kind is VerdictKind.RESTART_PREEMPTION:
        status["restarts"]["preemptions"] = status["restarts"].get("preemptions", 0) + 1
        _restart(b, current, "Preempted", verdict.message)
        return b.plan
    if verdict.kind is VerdictKind.RESTART_FAILURE:
        failures = status["restarts"].get("failures", 0)
        if failures >= spec.run_policy.backoff_limit:
            _fail(b, current, "BackoffLimitExceeded",
                  f"{verdict.message}; backoffLimit={spec.run_policy.backoff_limit} reached")  # fmt: skip
            return b.plan
        status["restarts"]["failures"] = failures + 1
        _restart(b, current, "FailureRestart", verdict.message)
        return b.plan

    running = sum(o.kind in (OutcomeKind.RUNNING, OutcomeKind.SUCCEEDED) for o in outcomes)
    # One pod still gated: the gang is not admitted (the trainer needs every rank). A pass stopped
    # half-way through lifting the gates is finished by the next one.
    if any(is_gated(p) for p in current.values()):
        message = status.get("admissionMessage") or "waiting for the whole gang to fit"
        b.condition("Admitted", "False", "WaitingForCapacity", message)
        b.phase("Pending", "WaitingForCapacity", message)
        return b.plan
    if not status.get("admittedTime"):
        status["admittedTime"] = b.now_iso
    status.pop("admissionMessage", None)
    b.condition("Admitted", "True", "GangAdmitted", f"all {spec.replicas} pod(s) admitted together")
    if running >= spec.replicas:
        status.setdefault("startTime", b.now_iso)
        # Only on the way back to Running: the victim is still Running between the condition and
        # the eviction of its pods.
        preempted = get_condition(status["conditions"], "Preempted")
        if b.old.get("phase") != "Running" and preempted is not None and preempted.get("status") == "True":
            b.condition("Preempted", "False", "Running", f"running again as attempt {attempt}")
        b.phase("Running", "AllWorkersRunning", f"{spec.replicas} worker(s) running, attempt {attempt}")
        return b.plan

    admitted_at = parse_iso(status.get("admittedTime")) or now
    # Only where Phalanx admitted the gang: an external scheduler's queue wait may be longer, and its
    # PodGroup carries its own timeout.
    timeout = spec.scheduling.gang.timeout_seconds if spec.scheduling.provider == "builtin" else 0
    if gang_timed_out(admitted_at, now, timeout, running, spec.replicas):
        timeouts = int(status.get("gangTimeouts") or 0) + 1
        status["gangTimeouts"] = timeouts
        status["requeueAfter"] = iso(requeue_at(now, timeouts, base=GANG_BACKOFF_BASE_SECONDS))
        message = (f"only {running}/{spec.replicas} pod(s) running {timeout}s after admission; "
                   f"gang torn down, retrying after {status['requeueAfter']}")  # fmt: skip
        _new_attempt(b, current)
        b.phase("Pending", "GangTimeout", message, "Warning")
        return b.plan
    if timeout > 0:
        b.recheck(admitted_at + timeout - now)
    if status.get("phase") != "Restarting" or running:
        message = f"{running}/{spec.replicas} worker(s) running"
        why = _unschedulable_message(current.values())
        if why:
            message += f"; the scheduler says: {why}"
        b.phase("Admitted", "GangAdmitted", message)
    return b.plan


def _partial_gang_timed_out(b: _Builder, spec: TrainingJobSpec, current: dict[int, dict[str, Any]]) -> bool:
    """The API server refused some of the attempt's pods (quota, admission policy) for longer than the
    gang timeout while others exist: those hold their nodes for nothing. Tears the attempt down and
    requeues it with backoff, as a gang timeout after admission does (builtin provider only)."""
    refused = get_condition(b.status["conditions"], "PodsCreated")
    timeout = spec.scheduling.gang.timeout_seconds
    if (
        not current
        or spec.scheduling.provider != "builtin"
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
    timeouts = int(b.status.get("gangTimeouts") or 0) + 1
    b.status["gangTimeouts"] = timeouts
    b.status["requeueAfter"] = iso(requeue_at(b.now, timeouts, base=GANG_BACKOFF_BASE_SECONDS))
    # The next attempt's refusal, if any, starts its own clock.
    b.status["conditions"] = [x for x in b.status["conditions"] if x.get("type") != "PodsCreated"]
    message = (
        f"only {len(current)}/{spec.replicas} pod(s) could be created in {timeout}s "
        f"({refused.get('message', '')}); gang torn down, retrying after {b.status['requeueAfter']}"
    )
    _new_attempt(b, current)
    if b.old.get("phase") == "Pending":  # no phase change, so phase() tells no one: a teardown is news
        b.plan.events.append(Event("Warning", "GangTimeout", message))
    b.phase("Pending", "GangTimeout", message, "Warning")
    return True


def _unschedulable_message(pods: Any) -> str:
    for pod in pods:
        for cond in pod.get("status", {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("message"):
                return str(cond["message"])[:300]
    return ""


def _on_lost_node(pod: dict[str, Any], nodes: dict[str, Any]) -> bool:
    node_name = pod.get("spec", {}).get("nodeName")
    return bool(node_name) and bool(nodes) and node_name not in nodes


def _recheck_nodes_going_lost(b: _Builder, pods: Any, nodes: dict[str, Any], node_lost_after: float) -> None:
    """A pod on a node that is not Ready yet not lost: decide again the moment the node counts as lost."""
    for pod in pods:
        node = nodes.get(pod.get("spec", {}).get("nodeName") or "")
        if node is None or is_terminal(pod):
            continue
        left = seconds_until_lost(node, b.now, node_lost_after)
        if left is not None and left > 0:
            b.recheck(left)


def _outcomes(
    spec: TrainingJobSpec,
    current: dict[int, dict[str, Any]],
    nodes: dict[str, Any],
    lost_nodes: frozenset[str],
) -> list[PodOutcome]:
    retryable = frozenset(spec.run_policy.retryable_exit_codes or ())
    outcomes = []
    for index in range(spec.replicas):
        pod = current.get(index)
        if pod is None:
            outcomes.append(missing_pod_outcome(f"worker-{index}"))
            continue
        node_name = pod.get("spec", {}).get("nodeName")
        node = nodes.get(node_name) if node_name else None
        if _on_lost_node(pod, nodes) and not is_terminal(pod):
            message = f"node {node_name} no longer exists"
            outcomes.append(
                PodOutcome(pod["metadata"]["name"], OutcomeKind.PREEMPTED, REASON_NODE_LOST, message)
            )
            continue
        if node is not None and node_name in lost_nodes and not is_terminal(pod):
            # The pod may still say Running: nobody is left to update it. Its rank is gone all the same.
            since = not_ready_since(node)
            message = f"node {node_name} not Ready since {iso(since) if since is not None else 'a while'}"
            outcomes.append(
                PodOutcome(
                    pod["metadata"]["name"], OutcomeKind.PREEMPTED, REASON_NODE_LOST, message, at=since
                )
            )
            continue
        outcomes.append(classify_pod(pod, retryable_exit_codes=retryable, node=node))
    return outcomes


def _count_replicas(b: _Builder, spec: TrainingJobSpec, pods: list[dict[str, Any]]) -> None:
    ready = sum(is_ready(p) for p in pods)
    b.status["replicas"] = {
        "active": sum(not is_terminal(p) for p in pods),
        "ready": ready,
        "succeeded": sum(p.get("status", {}).get("phase") == "Succeeded" for p in pods),
        "failed": sum(p.get("status", {}).get("phase") == "Failed" for p in pods),
    }
    b.status["readySummary"] = f"{ready}/{spec.replicas}"


def _restart_reason(b: _Builder) -> str:
    for cond in b.status["conditions"]:
        if cond["type"] == "Restarting" and cond["status"] == "True":
            return str(cond["reason"])
    return "Restarting"


def _new_attempt(b: _Builder, current: dict[int, dict[str, Any]]) -> None:
    """Moves to attempt+1; the pods of this attempt are deleted with their grace period (SIGTERM)."""
    b.status["attempt"] = int(b.status["attempt"]) + 1
    b.status.pop("admittedTime", None)
    b.status.pop("createdAttempt", None)
    b.plan.delete_pods.extend(p["metadata"]["name"] for p in current.values() if not is_deleting(p))


def _restart(b: _Builder, current: dict[int, dict[str, Any]], reason: str, message: str) -> None:
    _new_attempt(b, current)
    b.status.pop("requeueAfter", None)
    b.phase("Restarting", reason, f"{message}; restarting the gang as attempt {b.status['attempt']} "
            "from the newest checkpoint", "Warning")  # fmt: skip


def _fail(b: _Builder, current: dict[int, dict[str, Any]], reason: str, message: str) -> None:
    b.status["completionTime"] = b.now_iso
    b.plan.delete_pods.extend(
        p["metadata"]["name"] for p in current.values() if not is_terminal(p) and not is_deleting(p)
    )
    b.phase("Failed", reason, message, "Warning")


def _finished(b: _Builder, spec: TrainingJobSpec, current: dict[int, dict[str, Any]]) -> None:
    if b.status.get("phase") == "Failed":
        b.plan.delete_pods.extend(
            p["metadata"]["name"] for p in current.values() if not is_terminal(p) and not is_deleting(p)
        )
    ttl = spec.run_policy.ttl_seconds_after_finished
    done = parse_iso(b.status.get("completionTime"))
    if ttl is not None and done is not None:
        if b.now >= done + ttl:
            b.plan.delete_job = True
        else:
            b.recheck(done + ttl - b.now)
