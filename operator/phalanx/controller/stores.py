"""The controller's watch-fed copies of the cluster (cache.py, fed by reflector.py) and the few
questions every part of the controller asks them."""

from __future__ import annotations

from typing import Any

from phalanx.cache import Store, object_key, slim_job, slim_node, slim_pod, slim_priority_class
from phalanx.gang.usage import UsageIndex
from phalanx.pod_facts import is_owned_by, job_of_pod


class ClusterStores:
    def __init__(self) -> None:
        self.usage = UsageIndex()  # room held per node, fed by the pod store
        self.pods = Store(slim_pod, index=job_of_pod, observer=self.usage, by_node=True)
        self.nodes = Store(slim_node)
        self.jobs = Store(slim_job)
        # Not part of synced(): until listed, admission lists them itself (admission_state.py).
        self.priority_classes = Store(slim_priority_class)

    def synced(self) -> bool:
        """Every store has listed once: a decision over the whole cluster may be made."""
        return all(store.synced.is_set() for store in (self.jobs, self.pods, self.nodes))

    def current_nodes(self) -> dict[str, dict[str, Any]]:
        """Nodes by name; empty until the first list, which decide() reads as "not known yet"."""
        return self.nodes.as_dict() if self.nodes.synced.is_set() else {}

    def own_pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The job's pods in the store: labelled for it and controlled by it (pod_facts.py)."""
        uid = job["metadata"].get("uid", "")
        return [p for p in self.pods.indexed(object_key(job)) if is_owned_by(p, uid)]
