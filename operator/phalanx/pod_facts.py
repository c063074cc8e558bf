"""What a pod says about itself (pure, bottom layer): which job, attempt and rank it is, whether it
waits at the gang gate, has finished or is being deleted, and whom it belongs to. Every other module
asks these questions here, so a label or a gate is read one way only. Imports only constants.

Ownership, one rule for pods, the Service and PodGroups: a TrainingJob's own is what it controls,
an ownerReference with `controller: true` and the job's uid. Anything else that holds a name the
job needs, another owner's object or one with no controller at all, whatever its labels, is a name
conflict: never adopted, deleted, counted or evicted, and reported the same way (PodsCreated=False,
reason NameConflict, and a Warning event). Labels alone prove nothing: a job of the same name
deleted with `--cascade=orphan` leaves pods that carry its labels and another job's uid in their
environment (batch/v1 Job selects by its controller's uid for this reason).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Final

from phalanx import constants as c
from phalanx.api.v1alpha1 import TrainingJobSpec

TERMINAL_PHASES: Final = ("Succeeded", "Failed")


def job_of_pod(pod: Mapping[str, Any]) -> str | None:
    """namespace/name of the TrainingJob a pod belongs to, by its label."""
    metadata = pod.get("metadata") or {}
    job = (metadata.get("labels") or {}).get(c.LABEL_JOB_NAME)
    return f"{metadata.get('namespace')}/{job}" if job else None


def pod_attempt(pod: Mapping[str, Any]) -> int:
    """The attempt the pod was created for; -1 without a readable label."""
    try:
        return int(pod["metadata"]["labels"][c.LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return -1


def restarted_in_place(status: Mapping[str, Any]) -> bool:
    """The current attempt restarted in place: status.inPlace belongs to it, not to an earlier one."""
    in_place = status.get("inPlace") or {}
    return bool(in_place) and in_place.get("attempt") == int(status.get("attempt") or 0)


def kept_pod_uids(status: Mapping[str, Any]) -> dict[str, str]:
    """name -> uid of the pods an in-place attempt keeps from an earlier one (status.inPlace), while
    that attempt is the current one; empty otherwise."""
    if not restarted_in_place(status):
        return {}
    return {str(k.get("name")): str(k.get("uid")) for k in status["inPlace"].get("keptPods") or []}


def replaced_pod_uids(status: Mapping[str, Any]) -> frozenset[str]:
    """The uids of the replacements the current in-place attempt deleted to create them again
    (status.inPlace.replacedPods, reconcile/rules/stranded.py); empty otherwise."""
    if not restarted_in_place(status):
        return frozenset()
    return frozenset(str(r.get("uid")) for r in status["inPlace"].get("replacedPods") or [])


def in_current_attempt(pod: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """The one answer to "is this pod part of the job's current attempt": created for it (its
    attempt label), or kept by it when it restarts in place (this very pod: name and uid). A warm
    spare standing by is no attempt's (is_spare), unless the in-place attempt has it take a rank
    (kept, status.inPlace.keptPods with a rank). Observed, housekeeping, the progress client, gang
    timeout and admission all ask here. A replacement the in-place attempt deletes to create it
    again (replaced_pod_uids) is not, while unbound or going: its rank waits for the new pod. Bound
    and not deleted after all (the scheduler bound it before the delete, whose precondition then
    refused), it is the attempt's pod again."""
    metadata = pod.get("metadata") or {}
    if str(metadata.get("uid")) in replaced_pod_uids(status) and (
        not (pod.get("spec") or {}).get("nodeName") or is_deleting(pod)
    ):
        return False
    kept = kept_pod_uids(status)
    if bool(kept) and kept.get(str(metadata.get("name"))) == str(metadata.get("uid")):
        return True
    return not is_spare(pod) and pod_attempt(pod) == int(status.get("attempt") or 0)


def is_spare(pod: Mapping[str, Any]) -> bool:
    """A warm spare (spec.spares) by its label: standing by, or told to take a rank and not
    relabelled yet (then it is also a kept pod of the in-place attempt, in_current_attempt)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(c.LABEL_SPARE) == "true"


def spare_ranks(status: Mapping[str, Any]) -> dict[str, int]:
    """name -> rank of the warm spares the current in-place attempt has take a lost rank
    (status.inPlace.keptPods entries with a rank)."""
    if not restarted_in_place(status):
        return {}
    return {
        str(k.get("name")): int(k["rank"])
        for k in status["inPlace"].get("keptPods") or []
        if isinstance(k.get("rank"), int)
    }


def replica_index(pod: Mapping[str, Any], status: Mapping[str, Any]) -> int:
    """The rank's worker the pod serves in the current attempt: its label, or for a spare the
    in-place attempt has take a rank, that rank (until it is relabelled; then both agree)."""
    taken = spare_ranks(status).get(str((pod.get("metadata") or {}).get("name")))
    return taken if taken is not None else pod_index(pod)


def gang_order(pod: Mapping[str, Any]) -> tuple[int, int, str]:
    """Workers in rank order, then the spares by name: the order a gang is placed in."""
    return (1 if is_spare(pod) else 0, pod_index(pod), str((pod.get("metadata") or {}).get("name")))


def pod_index(pod: Mapping[str, Any]) -> int:
    """The pod's replica index (its global rank's worker); -1 without a readable label."""
    try:
        return int(pod["metadata"]["labels"][c.LABEL_REPLICA_INDEX])
    except (KeyError, ValueError):
        return -1


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Still held at the gang gate: not admitted yet."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == c.GANG_SCHEDULING_GATE for g in gates)


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def is_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        x.get("type") == "Ready" and x.get("status") == "True" for x in status.get("conditions") or []
    )


def is_deleting(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's controlling owner reference; empty when it has none."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((o for o in owners if o.get("controller") is True), {})


def controller_uid(obj: Mapping[str, Any]) -> str:
    """The uid of the object's controlling owner; "" when it has none."""
    return str(controller_ref(obj).get("uid") or "")


def is_owned_by(obj: Mapping[str, Any], job_uid: str) -> bool:
    """The job controls the object (see the ownership rule above)."""
    return bool(job_uid) and controller_uid(obj) == job_uid


def is_node_agent(pod: Mapping[str, Any]) -> bool:
    """A pod that runs on its node for good: a DaemonSet's, or a static pod (its mirror is owned by
    the Node)."""
    return controller_ref(pod).get("kind") in ("DaemonSet", "Node")


def gang_size(pod: Mapping[str, Any]) -> int | None:
    """The size of the attempt the pod was built for (its label); None without a readable one (a pod
    created before the label existed)."""
    try:
        size = int(pod["metadata"]["labels"][c.LABEL_GANG_SIZE])
    except (KeyError, ValueError):
        return None
    return size if size >= 1 else None


def attempt_sizes(pods: Iterable[Mapping[str, Any]], status: Mapping[str, Any]) -> set[int]:
    """The sizes the current attempt's pods were built for: one, or none without labels; more than
    one means the attempt was created from two different views of its size and cannot run."""
    return {s for p in pods if in_current_attempt(p, status) and (s := gang_size(p)) is not None}


def attempt_replicas(
    spec: TrainingJobSpec, status: Mapping[str, Any], pods: Iterable[Mapping[str, Any]] = ()
) -> int:
    """The size of the current attempt: spec.replicas, or for an elastic job the size its pods carry
    (pods given and all agreeing), else the size it was given (status.currentReplicas); kept within
    the spec's range. The pods come first: the status write that records a size can be lost, or be
    read back older than the creates it preceded."""
    if spec.elastic is None:
        return spec.replicas
    sizes = attempt_sizes(pods, status)
    current = next(iter(sizes)) if len(sizes) == 1 else status.get("currentReplicas")
    if not isinstance(current, int):
        return spec.replicas
    return max(spec.elastic.min_replicas, min(spec.replicas, current))


def attempt_spec(
    spec: TrainingJobSpec, status: Mapping[str, Any], pods: Iterable[Mapping[str, Any]] = ()
) -> TrainingJobSpec:
    """The spec as the current attempt runs it: replicas is the attempt's size."""
    replicas = attempt_replicas(spec, status, pods)
    return spec if replicas == spec.replicas else dataclasses.replace(spec, replicas=replicas)


NODE_NAME_FIELD: Final = "metadata.name"  # what admission pins a pod's node by (builders/pods.admitted_pod)


def pinned_node(spec: Mapping[str, Any]) -> str | None:
    """The node admitted_pod pinned this pod spec to (the last metadata.name field of its first
    required term), else None."""
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return None
    pins = [
        f.get("values") or []
        for f in terms[0].get("matchFields") or []
        if f.get("key") == NODE_NAME_FIELD and f.get("operator") == "In"
    ]
    return str(pins[-1][0]) if pins and len(pins[-1]) == 1 else None


def planned_node(pod: Mapping[str, Any]) -> str | None:
    """The node of a pod admitted (pinned, gang gate lifted) and not bound yet; else None."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName") or is_gated(pod):
        return None
    return pinned_node(spec)
