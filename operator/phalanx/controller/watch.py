"""What the reflectors' change callbacks do (on the reflector threads): turn a changed pod, node or
job into keys for the work queue and a wake-up for the admission pass. Nothing is decided here."""

from __future__ import annotations

from phalanx.cache import INDEX_NODE, Slim, frees_or_changes_capacity, node_changed_for_admission
from phalanx.controller.queue import WorkQueue
from phalanx.controller.stores import ClusterStores
from phalanx.gang.capacity import BLOCKING_EFFECTS
from phalanx.pod_facts import job_of_pod
from phalanx.policy.node_drain import is_cordoned
from phalanx.policy.pod_outcome import node_is_ready


def _blocking_taints(node: Slim) -> set[tuple[str, str, str]]:
    taints = (node.get("spec") or {}).get("taints") or ()
    return {(str(t.get("key")), str(t.get("value") or ""), str(t.get("effect"))) for t in taints
            if t.get("effect") in BLOCKING_EFFECTS}  # fmt: skip


def stopped_taking_pods(old: Slim, new: Slim) -> bool:
    """No longer Ready, newly cordoned, or newly tainted NoSchedule/NoExecute: pods bound there may
    be lost, pods admitted there may never bind."""
    return (
        (node_is_ready(old) and not node_is_ready(new))
        or (not is_cordoned(old) and is_cordoned(new))
        or bool(_blocking_taints(new) - _blocking_taints(old))
    )


class WatchCallbacks:
    def __init__(self, stores: ClusterStores, work: WorkQueue) -> None:
        self.stores = stores
        self.work = work

    def on_pod_change(self, key: str, old: Slim | None, new: Slim | None) -> None:
        job = job_of_pod(new or old or {})
        dirty = frees_or_changes_capacity(old, new)
        if job is None and not dirty:
            return
        self.work.from_watch(job, dirty)

    def on_job_change(self, key: str, old: Slim | None, new: Slim | None) -> None:
        """Spec edits and deletions reach the reconcile from here too (kopf's handler enqueues as
        well; the queue keeps one), so a job the store did not have yet is looked at again."""
        if new is None:
            return
        deleting = new["metadata"].get("deletionTimestamp")
        if (
            old is None
            or old.get("spec") != new.get("spec")
            or old["metadata"].get("deletionTimestamp") != deleting
        ):
            self.work.enqueue_threadsafe(key)

    def on_node_change(self, key: str, old: Slim | None, new: Slim | None) -> None:
        if node_changed_for_admission(old, new):
            self.work.admission_dirty_threadsafe()
        if new is None or (old is not None and stopped_taking_pods(old, new)):
            # Gone, no longer Ready, cordoned or tainted: the jobs with pods bound or admitted there
            # decide now, not at the next resync (rules/node_loss.py, rules/stranded.py).
            for pod in self.stores.pods.indexed(key, index=INDEX_NODE):  # its pods, not every pod
                job = job_of_pod(pod)
                if job is not None:
                    self.work.enqueue_threadsafe(job)
