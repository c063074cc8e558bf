"""The Workload a queued TrainingJob is admitted through (pure; docs/kueue.md).

One Workload per TrainingJob, owned by it (controller=true, so it goes with the job by garbage
collection), named from the job's name and uid: a job re-created under the same name gets a Workload
of its own, never its predecessor's admission. One pod set, "workers", holds the whole gang (count =
replicas): Kueue admits it all or not at all, which is what the trainer needs.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any, Final

from phalanx import constants as c
from phalanx.builders.pods import JobRef

# Kueue's names are DNS subdomains; the job name (at most MAX_JOB_NAME_LENGTH) fits with room.
_PREFIX: Final = "trainingjob"


def queue_name(job: dict[str, Any]) -> str | None:
    """The LocalQueue the job asks for (its kueue.x-k8s.io/queue-name label), None: built-in admission."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    name = labels.get(c.KUEUE_QUEUE_LABEL)
    return str(name) if name else None


def managed_here(job: dict[str, Any]) -> bool:
    """spec.managedBy unset or this operator's name: the MultiKueue contract (another value means a
    manager elsewhere runs the job; this operator leaves it alone)."""
    managed_by = (job.get("spec") or {}).get("managedBy")
    return managed_by in (None, "", c.CONTROLLER_NAME)


def workload_name(job_name: str, uid: str) -> str:
    digest = hashlib.sha256(uid.encode()).hexdigest()[:5]
    return f"{_PREFIX}-{job_name}-{digest}"


def _flag(suspended: bool) -> str:
    return "true" if suspended else "false"


def active_patch(workload: dict[str, Any], suspended: bool) -> dict[str, Any] | None:
    """spec.runPolicy.suspend as Kueue reads it: a suspended job's Workload is inactive (Kueue evicts
    it and, once its pods are gone, takes the quota back); resumed, it is active and queued again.
    Written only when suspend changed since the operator last wrote it (the annotation): Kueue
    (backoffLimitCount, a rejected admission check, maximumExecutionTimeSeconds) or an admin may
    deactivate the Workload of a job that is not suspended, and that is theirs to undo."""
    recorded = ((workload.get("metadata") or {}).get("annotations") or {}).get(c.KUEUE_SUSPENDED_ANNOTATION)
    if recorded == _flag(suspended):
        return None
    if recorded is None and (workload.get("spec") or {}).get("active", True) == (not suspended):
        return None  # made before the annotation, and as the job asks: recorded at the next change
    return {
        "metadata": {"annotations": {c.KUEUE_SUSPENDED_ANNOTATION: _flag(suspended)}},
        "spec": {"active": not suspended},
    }


def _requests(podset: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    spec = (podset.get("template") or {}).get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return [(str(x.get("name")), dict((x.get("resources") or {}).get("requests") or {})) for x in containers]


def stale_in(workload: dict[str, Any], desired: dict[str, Any]) -> str:
    """What Kueue would admit differently from `desired` (the Workload built from the job as it is
    now): queue, priority, pod set counts and requests; "" when nothing. A job changed while
    suspended or queued would otherwise run against the quota of the job as it was."""
    old, new = workload.get("spec") or {}, desired.get("spec") or {}
    changes = []
    if old.get("queueName") != new.get("queueName"):
        changes.append(f"queue {old.get('queueName')}, the job asks {new.get('queueName')}")
    old_class = (old.get("priorityClassRef") or {}).get("name")
    new_class = (new.get("priorityClassRef") or {}).get("name")
    if old.get("priority") != new.get("priority") or old_class != new_class:
        changes.append(
            f"priority {old.get('priority')} ({old_class or 'no class'}), "
            f"the job asks {new.get('priority')} ({new_class or 'no class'})"
        )
    old_sets = {str(ps.get("name")): ps for ps in old.get("podSets") or []}
    for podset in new.get("podSets") or []:
        name = str(podset.get("name"))
        was = old_sets.pop(name, None)
        if was is None:
            changes.append(f"no podSet {name}")
            continue
        if was.get("count") != podset.get("count"):
            changes.append(f"podSet {name}: count {was.get('count')}, the job asks {podset.get('count')}")
        if _requests(was) != _requests(podset):
            changes.append(f"podSet {name}: requests {_requests(was)}, the job asks {_requests(podset)}")
    changes.extend(f"podSet {name} the job no longer has" for name in old_sets)
    return "; ".join(changes)


def podset_template(worker_pod: dict[str, Any]) -> dict[str, Any]:
    """What Kueue counts and matches flavors against: the worker pod's spec as the operator builds it
    (its accelerator or MIG limits, the template's own requests, nodeSelector, tolerations, affinity).
    Limits without requests are copied into requests, as the API server defaults them on the pod."""
    spec = copy.deepcopy(worker_pod.get("spec") or {})
    spec.pop("schedulingGates", None)  # the gang gate is not part of what Kueue admits
    for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        if limits:
            requests = dict(resources.get("requests") or {})
            for name, value in limits.items():
                requests.setdefault(name, value)
            container["resources"] = {**resources, "requests": requests}
    labels = dict((worker_pod.get("metadata") or {}).get("labels") or {})
    return {"metadata": {"labels": labels}, "spec": spec}


def build_workload(
    job: dict[str, Any], queue: str, replicas: int, worker_pod: dict[str, Any], priority: int | None
) -> dict[str, Any]:
    """The Workload for `job` in LocalQueue `queue`; `worker_pod`: one of its pods as the operator
    builds it; `priority`: the value of spec.scheduling.priorityClassName (None: the job names none)."""
    ref = JobRef.of(job)
    suspended = bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
    spec: dict[str, Any] = {
        "queueName": queue,
        "active": not suspended,
        "podSets": [{"name": c.KUEUE_PODSET, "count": replicas, "template": podset_template(worker_pod)}],
    }
    priority_class = ((job.get("spec") or {}).get("scheduling") or {}).get("priorityClassName")
    if priority_class:
        # Kueue reads the value from spec.priority (required with a class ref); the ref is what it shows.
        spec["priorityClassRef"] = {
            "group": "scheduling.k8s.io",
            "kind": "PriorityClass",
            "name": priority_class,
        }
        spec["priority"] = priority or 0
    return {
        "apiVersion": c.KUEUE_API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(ref.name, ref.uid),
            "namespace": ref.namespace,
            "labels": {c.LABEL_JOB_NAME: ref.name, c.LABEL_MANAGED_BY: c.MANAGED_BY},
            "annotations": {c.KUEUE_SUSPENDED_ANNOTATION: _flag(suspended)},
            "ownerReferences": [ref.owner_reference()],
            "finalizers": [c.KUEUE_RESOURCE_IN_USE_FINALIZER],
        },
        "spec": spec,
    }


def owner_uid(workload: dict[str, Any]) -> str | None:
    """The uid of the TrainingJob that controls the Workload; None without one."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == c.KIND:
            return str(ref.get("uid") or "") or None
    return None


def holds_finalizer(workload: dict[str, Any]) -> bool:
    return c.KUEUE_RESOURCE_IN_USE_FINALIZER in ((workload.get("metadata") or {}).get("finalizers") or [])


def orphaned(workload: dict[str, Any], live_uid: str | None) -> bool:
    """Deleted, or its owner gone (`live_uid`: the uid of the job of that name now, None when there
    is none or it is being deleted): nothing will run against it again."""
    if (workload.get("metadata") or {}).get("deletionTimestamp"):
        return True
    return live_uid is None or owner_uid(workload) != live_uid


def finalizer_release(workload: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that removes Kueue's resource-in-use finalizer (guarded by the resourceVersion:
    a finalizer another controller added meanwhile is not dropped); None when it has none."""
    meta = workload.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if c.KUEUE_RESOURCE_IN_USE_FINALIZER not in finalizers:
        return None
    kept = [f for f in finalizers if f != c.KUEUE_RESOURCE_IN_USE_FINALIZER]
    return {"metadata": {"finalizers": kept or None, "resourceVersion": meta.get("resourceVersion")}}
