"""Creation: the attempt's missing pods are created (deterministic names, so a repeat is harmless);
once all exist, status.createdAttempt records it and the decision goes on. What the I/O layer
learns while creating, a name held by someone else or a refusal by the API server, is written into
the status here too (pure)."""

from __future__ import annotations

from typing import Any, Final

from phalanx import constants as c
from phalanx.pod_facts import is_gated
from phalanx.policy import bad_nodes, elastic
from phalanx.policy.node_loss import attempt_in_names
from phalanx.providers import provider_for
from phalanx.reconcile.conditions import get_condition, set_condition
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import REASON_CREATE_REFUSED, REASON_NAME_CONFLICT, Event, PlanBuilder, iso
from phalanx.reconcile.rules import elastic as elastic_rules
from phalanx.reconcile.rules import gang_timeout
from phalanx.reconcile.rules.restart import restart_reason

# How the admission pass words a gang no cluster of today's nodes could ever hold (admission_pass.py).
NEVER_FITS: Final = "can never fit"
# The Event of a gated gang rebuilt because a node it was built to avoid no longer needs avoiding.
REASON_AVOIDANCE_LIFTED: Final = "AvoidanceLifted"
# PodsCreated=False while a new elastic attempt waits for the stores to list (room unknown).
REASON_WAITING_FOR_CLUSTER_LIST: Final = "WaitingForClusterList"


def apply(b: PlanBuilder, seen: Observed) -> bool:
    status, spec, attempt, current = b.status, seen.spec, seen.attempt, seen.current
    if status.get("createdAttempt") == attempt:
        return False
    if not provider_for(spec).admits_gangs:  # the pods are admitted as they are created
        status.setdefault("admittedTime", b.now_iso)
    size = spec.replicas
    # The attempt's size is chosen once, before its first pod exists, and recorded before any is
    # created (the reconciler writes the status first): a pod store behind the creates sees none yet.
    if not current and status.get("sizedAttempt") != attempt:
        if seen.as_written.elastic is not None and seen.room is None:
            # The stores have not listed yet (the first pass after a start): the room would read as
            # none and the attempt start at minReplicas where more fits. Sized once they have.
            b.condition("PodsCreated", "False", REASON_WAITING_FOR_CLUSTER_LIST,
                        "spec.elastic: the operator has not listed the cluster's nodes and pods yet; the attempt "
                        "is sized from the room once it has")  # fmt: skip
            b.recheck(elastic.UNSIZED_RECHECK_SECONDS)
            return True
        size = _choose_size(b, seen)
        waited = get_condition(status["conditions"], "PodsCreated")
        if waited is not None and waited.get("reason") == REASON_WAITING_FOR_CLUSTER_LIST:
            b.condition("PodsCreated", "False", "Creating", f"creating {size} pod(s) for attempt {attempt}")
    missing = [i for i in range(size) if i not in current]
    if missing and gang_timeout.partly_created(b, seen):
        return True
    if missing:
        b.plan.create_indices.extend(missing)
        b.plan.attempt_in_names = attempt_in_names(current.values(), seen.stale, attempt)
        b.plan.avoid_nodes = sorted(avoided_now(b, seen))
        if attempt == 0 or status.get("phase") not in ("Restarting",):
            b.phase("Pending", "Created", f"created {size} pod(s) for attempt {attempt}")
        return True
    # Every pod of the attempt exists: recorded, and decided on by the next rules in the same pass.
    status["createdAttempt"] = attempt
    if any(x["type"] == "PodsCreated" for x in status["conditions"]):
        b.condition("PodsCreated", "True", "AllPodsCreated", f"all {spec.replicas} pod(s) exist")
    return False


def avoided_now(b: PlanBuilder, seen: Observed) -> set[str]:
    """The nodes a pod created now keeps off: lost nodes where the older pods linger, and nodes that
    failed this job twice (policy/bad_nodes.py)."""
    lingering_on = {
        p.get("spec", {}).get("nodeName") for p in seen.stale if p["metadata"]["name"] in seen.left_behind
    }
    return {n for n in lingering_on if n} | set(bad_nodes.avoided(b.status.get("badNodes"), b.now))


def avoidance_lifted(b: PlanBuilder, seen: Observed) -> bool:
    """A gang not admitted yet whose pods were built to keep off nodes it no longer needs to avoid
    (the old pods lingering there are gone, the lost node is back, a bad node's time is up): its
    pods cannot loosen their node affinity, and a gang that needs those nodes would wait forever
    ("can never fit"). The gated pods are deleted, uncounted, and created again as they would be now."""
    current = list(seen.current.values())
    if not current or not all(is_gated(p) and not (p.get("spec") or {}).get("nodeName") for p in current):
        return False
    if not str(b.status.get("admissionMessage") or "").startswith(NEVER_FITS):
        return False  # a gang that can fit as it is waits its turn: rebuilding it would only churn
    if any((p.get("metadata") or {}).get("deletionTimestamp") for p in current):
        return True  # being rebuilt: wait for the pods to go
    built = {n for p in current for n in _avoided_as_built(p)}
    lifted = built - avoided_now(b, seen)
    if not lifted:
        return False
    # Deleted only while unchanged: the admission pass may be lifting their gates at this moment.
    b.plan.delete_unchanged_pods.extend(sorted(p["metadata"]["name"] for p in current))
    b.status.pop("createdAttempt", None)
    if seen.as_written.elastic is not None:
        b.status.pop("sizedAttempt", None)  # nothing has run: sized again from the room there is now
    if b.old.get("createdAttempt") == seen.attempt:  # once per rebuild, not per pass the store lags
        b.plan.events.append(Event("Normal", REASON_AVOIDANCE_LIFTED,
                                   f"{', '.join(sorted(lifted))} no longer avoided (no pod of the job lingers there, "
                                   f"and it has not failed the job twice lately): recreating the {len(current)} "
                                   f"pod(s) of attempt {seen.attempt}, which could never fit as built"))  # fmt: skip
    return True


def _avoided_as_built(pod: dict[str, Any]) -> set[str]:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_AVOIDED_NODES) or ""
    return {n for n in raw.split(",") if n}


def _choose_size(b: PlanBuilder, seen: Observed) -> int:
    """status.currentReplicas for the new attempt (spec.elastic: as the room allows, policy/elastic.py);
    a change from the attempt before gets its Event, from -> to and why."""
    written = seen.as_written
    cap = elastic_rules.active_cap(b) if written.elastic is not None else None
    unusable = elastic.unusable_sizes(b.status)
    size = elastic.start_size(written, seen.room, cap, unusable)
    previous = b.status.get("currentReplicas")
    if written.elastic is not None and isinstance(previous, int) and previous != size:
        cause = elastic.size_cause(restart_reason(b), seen.room, cap, unusable)
        b.plan.events.append(
            Event("Normal", elastic.REASON_RESIZED, elastic.resize_message(previous, size, cause))
        )
    b.status["currentReplicas"] = size
    b.status["sizedAttempt"] = b.status["attempt"]
    return size


def name_conflict(job: dict[str, Any], status: dict[str, Any], taken: list[str], now: float) -> Event | None:
    """An object this job does not control holds a name it needs (a worker pod's, its Service's, its
    PodGroup's; pod_facts.py): says so in `status` (about to be written). Returns the Warning event
    to record the first time; then the job waits for the object to go."""
    message = (
        f"{', '.join(taken)} hold(s) a name this TrainingJob needs but belong(s) to someone else; "
        "delete or rename it and the job continues"
    )
    first_time = (job.get("status") or {}).get("message") != message
    status["message"] = message
    status["conditions"] = set_condition(
        status.get("conditions") or [], "PodsCreated", "False", REASON_NAME_CONFLICT, message, iso(now),
        job["metadata"].get("generation"),
    )  # fmt: skip
    return Event("Warning", REASON_NAME_CONFLICT, message) if first_time else None


def creation_refused(
    job: dict[str, Any], status: dict[str, Any], refusals: list[str], replicas: int, now: float
) -> Event | None:
    """The API server refused pods (quota, admission policy, an invalid template; `refusals` are its
    messages): says so with its words in `status`. Returns the Warning event to record when the
    message is new. Creation is retried; a gang left half-created is torn down after its gang
    timeout (gang_timeout.partly_created)."""
    message = f"{len(refusals)}/{replicas} pod(s) refused by the API server: {refusals[0]}"
    return spec_refused(job, status, REASON_CREATE_REFUSED, message, now)


def spec_refused(
    job: dict[str, Any], status: dict[str, Any], reason: str, message: str, now: float
) -> Event | None:
    """The job's pods are not created (its spec asks for what the operator's settings refuse,
    policy/host_path.py; or the API server refused them): PodsCreated=False with `reason` in
    `status`. Returns the Warning event to record when the message is new."""
    previous = get_condition((job.get("status") or {}).get("conditions") or [], "PodsCreated")
    status["message"] = message
    status["conditions"] = set_condition(
        status.get("conditions") or [], "PodsCreated", "False", reason, message, iso(now),
        job["metadata"].get("generation"),
    )  # fmt: skip
    if previous is None or previous.get("message") != message:
        return Event("Warning", reason, message)
    return None
