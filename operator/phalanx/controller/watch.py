"""What the reflectors' change callbacks do (on the reflector threads): turn a changed pod, node or
job into keys for the work queue and a wake-up for the admission pass. Nothing is decided here."""

from __future__ import annotations

from phalanx.cache import INDEX_NODE, Slim, frees_or_changes_capacity, node_changed_for_admission
from phalanx.controller.queue import WorkQueue
from phalanx.controller.stores import ClusterStores
from phalanx.pod_facts import job_of_pod
from phalanx.policy.node_drain import being_removed, is_cordoned
from phalanx.policy.pod_outcome import node_is_ready


def takes_pods(node: Slim) -> bool:
    """Ready, not cordoned and not being removed."""
    return node_is_ready(node) and not is_cordoned(node) and being_removed(node) is None


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
        if new is None or (old is not None and takes_pods(old) and not takes_pods(new)):
            # Gone, no longer Ready, cordoned or going: the jobs with pods bound or admitted there
            # decide now, not at the next resync (rules/node_loss.py, rules/stranded.py).
            for pod in self.stores.pods.indexed(key, index=INDEX_NODE):  # its pods, not every pod
                job = job_of_pod(pod)
                if job is not None:
                    self.work.enqueue_threadsafe(job)
