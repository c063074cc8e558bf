"""The Workloads of queued TrainingJobs (I/O side; the decisions are kueue/ and reconcile/rules/kueue.py).

Called by the reconciler for a job labelled kueue.x-k8s.io/queue-name: `gate` reads (or first
creates) the job's Workload and says what Kueue allows; `placement` reads the assigned
ResourceFlavors when the gang is created; `report` writes back what Kueue expects from the owner
(PodsReady, Finished, the quota released after an eviction once the pods are gone). The Workload is
read on each reconcile of such a job, not watched: the job's rule rechecks every few seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping
from typing import Any, Final

from phalanx import metrics
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.pods import JobRef, build_worker_pod
from phalanx.controller.admission_state import PriorityValues
from phalanx.k8s import KubeApi, StatusConflict
from phalanx.kueue import workload_status
from phalanx.kueue.gate import KueueGate, gate_of
from phalanx.kueue.placement import FlavorPlacement, placement_of
from phalanx.kueue.workload import active_patch, build_workload, stale_in, workload_name
from phalanx.reconcile.plan import FINISHED_PHASES, iso

log = logging.getLogger("phalanx.controller")

NO_KUEUE_MESSAGE: Final = (
    "waiting for Kueue: the API server serves no kueue.x-k8s.io/v1beta2 Workloads; install Kueue "
    "(docs/kueue.md) or remove the kueue.x-k8s.io/queue-name label to use the built-in admission"
)


# Status writes tried per pass over Kueue's own (a 409 each); then the caller comes back soon.
WRITE_TRIES: Final = 3
# How soon a pass whose Workload write is still owed runs again.
PENDING_WRITE_RETRY_SECONDS: Final = 1.0


class KueueWorkloads:
    def __init__(self, api: KubeApi, cluster_domain: str) -> None:
        self.api = api
        self.cluster_domain = cluster_domain
        self.priority_values = PriorityValues(lambda: self.api.priority_values())
        self.lock = threading.Lock()  # PriorityValues is read from several reconcile threads
        self.last: dict[str, dict[str, Any]] = {}  # job key -> its Workload as last read or written

    def gate(self, key: str, job: dict[str, Any], spec: TrainingJobSpec, queue: str) -> KueueGate:
        ref = JobRef.of(job)
        name = workload_name(ref.name, ref.uid)
        desired = self._desired(job, spec, queue)
        workload = self.api.get_workload(ref.namespace, name)
        stale = stale_in(workload, desired) if workload is not None else ""
        if workload is not None and stale and not (workload.get("status") or {}).get("admission"):
            # No quota reserved: queued again as the job is now (Kueue's own integrations do the same).
            log.info("recreating Workload %s/%s: %s", ref.namespace, name, stale)
            self.api.delete_workload(ref.namespace, name, workload["metadata"].get("uid"))
            workload, stale = None, ""
        if workload is None:
            workload = self._create(desired, ref.namespace, name, queue)
            if workload is None:
                return KueueGate(workload=name, admitted=False, evicted=False, message=NO_KUEUE_MESSAGE)
        change = active_patch(workload, bool(spec.run_policy.suspend))
        if change is not None:  # suspended or resumed: Kueue evicts it, or queues it again
            workload = self.api.patch_workload(ref.namespace, name, change) or workload
        self.last[key] = workload
        gate = gate_of(workload)
        return dataclasses.replace(gate, stale=stale) if stale else gate

    def _desired(self, job: dict[str, Any], spec: TrainingJobSpec, queue: str) -> dict[str, Any]:
        """The Workload of the job as it is now."""
        pod = build_worker_pod(
            JobRef.of(job), spec, 0, 0, job["spec"].get("template") or {}, cluster_domain=self.cluster_domain
        )
        priority = None
        if spec.scheduling.priority_class_name:
            with self.lock:
                values = self.priority_values.current({spec.scheduling.priority_class_name})
            priority = values.get(spec.scheduling.priority_class_name, 0)
        return build_workload(job, queue, spec.replicas, pod, priority)

    def _create(
        self, manifest: dict[str, Any], namespace: str, name: str, queue: str
    ) -> dict[str, Any] | None:
        try:
            created = self.api.create_if_absent(manifest)
        except Exception as exc:  # 404: Kueue's CRDs are not installed
            if getattr(exc, "status", None) == 404:
                return None
            raise
        if created is None:  # made by an earlier pass whose reply was lost
            return self.api.get_workload(namespace, name)
        log.info("created Workload %s/%s in queue %s", namespace, name, queue)
        return created

    def placement(self, gate: KueueGate) -> FlavorPlacement:
        """The node labels and tolerations of the flavors Kueue assigned (a flavor gone meanwhile
        adds nothing: Kueue evicts a workload whose flavor was deleted)."""
        flavors = [f for name in gate.flavors if (f := self.api.get_resource_flavor(name)) is not None]
        return placement_of(flavors)

    def report(self, key: str, gate: KueueGate, status: dict[str, Any], pods: list[dict[str, Any]],
               nodes: Mapping[str, Mapping[str, Any]], now: float, node_lost_after: float) -> bool:  # fmt: skip
        """Writes back into the Workload what its owner is to tell Kueue. True: a write is still
        owed (Kueue kept writing meanwhile); the caller comes back soon, as a finished job is not
        resynced otherwise."""
        workload = self.last.get(key)
        if workload is None:
            return False
        stopped = workload_status.gang_stopped(pods, nodes, now, node_lost_after)
        phase = status.get("phase")
        meta = workload["metadata"]
        if gate.stale and phase not in FINISHED_PHASES and stopped:
            # Admitted for the job as it was, and nothing runs on that admission: gone, its quota with
            # it; the next pass queues the job as it is now.
            log.info(
                "recreating Workload %s/%s that holds quota: %s", meta["namespace"], meta["name"], gate.stale
            )
            self.api.delete_workload(meta["namespace"], meta["name"], meta.get("uid"))
            self.last.pop(key, None)
            return False
        if phase in FINISHED_PHASES and not stopped:
            # Finished hands the quota back: not while a failed job's pods still stop (their grace
            # period, a SIGTERM checkpoint), or Kueue admits the next job onto busy devices.
            return True
        for _ in range(WRITE_TRIES):
            patch = self._patch_for(workload, gate, status, stopped, iso(now))
            if patch is None:
                return False
            meta = workload["metadata"]
            try:
                stored = self.api.patch_workload_status(
                    meta["namespace"], meta["name"], patch, meta["resourceVersion"]
                )
            except StatusConflict:  # Kueue wrote meanwhile: decided again on what it wrote
                fresh = self.api.get_workload(meta["namespace"], meta["name"])
                if fresh is None:
                    return False
                workload = self.last[key] = fresh
                continue
            if stored is not None:
                self.last[key] = stored
                if "admission" in patch:
                    log.info("released the quota of evicted Workload %s/%s", meta["namespace"], meta["name"])
            return False
        return True

    @staticmethod
    def _patch_for(workload: dict[str, Any], gate: KueueGate, status: dict[str, Any], stopped: bool,
                   now_iso: str) -> dict[str, Any] | None:  # fmt: skip
        phase = status.get("phase")
        if phase in FINISHED_PHASES:
            return workload_status.finished(
                workload, phase == "Succeeded", str(status.get("message") or ""), now_iso
            )
        if gate.evicted or not gate.admitted:
            # Kueue takes the quota back only once the gang has stopped: it may not run twice.
            released = workload_status.released_after_eviction(workload, now_iso) if stopped else None
            return released or workload_status.waiting_for_start(workload, now_iso)
        return workload_status.pods_ready(workload, phase == "Running", now_iso)

    def observe_admitted(self, namespace: str, name: str, gate: KueueGate) -> None:
        metrics.observe_kueue_admitted(namespace, name, gate.cluster_queue or "", gate.waited_seconds or 0.0)

    def forget(self, key: str) -> None:
        self.last.pop(key, None)
