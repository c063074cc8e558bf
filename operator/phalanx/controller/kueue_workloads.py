"""The Workloads of queued TrainingJobs (I/O side; the decisions are kueue/ and reconcile/rules/kueue.py).

Called by the reconciler for a job labelled kueue.x-k8s.io/queue-name: `gate` reads (or first
creates) the job's Workload and says what Kueue allows; `placement` reads the assigned
ResourceFlavors when the gang is created; `report` writes back what Kueue expects from the owner
(PodsReady, Finished, the quota released after an eviction once the pods are gone). The Workload is
read on each reconcile of such a job; it is also watched (once the API server serves Workloads:
`watched`, fed by a reflector the controller starts), so that a change of Kueue's (admitted,
evicted) enqueues its job at once. The job's rule still rechecks every few seconds, should a watch
be lost.

The Workload carries Kueue's resource-in-use finalizer from its creation: deleted (by garbage
collection of its job, say), it keeps its quota until `release_orphans` sees every pod of its job
stopped. A job deleted while the operator was down is found again by `orphan_keys` (the resync).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from phalanx import constants as c
from phalanx import metrics
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.pods import JobRef, build_worker_pod
from phalanx.cache import Slim, Store
from phalanx.controller.admission_state import PriorityValues
from phalanx.k8s import CreationRefused, KubeApi, StatusConflict
from phalanx.kueue import workload_status
from phalanx.kueue.gate import KueueGate, gate_of
from phalanx.kueue.placement import FlavorConflict, FlavorPlacement, PlacementUnavailable, placement_of
from phalanx.kueue.workload import (
    active_patch,
    build_workload,
    finalizer_release,
    holds_finalizer,
    orphaned,
    owner_uid,
    stale_in,
    workload_name,
)
from phalanx.pod_facts import is_owned_by
from phalanx.reconcile.conditions import get_condition
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
# After the API server refused the Workload (Kueue's webhook), or its placement failed: 2, 4, 8 ... s.
REFUSED_RETRY_FIRST_SECONDS: Final = 2.0
REFUSED_RETRY_MAX_SECONDS: Final = 120.0
# How long an assigned ResourceFlavor may be missing (deleted, to be made again) before the job fails.
FLAVOR_MISSING_MAX_SECONDS: Final = 300.0


class KueueWorkloads:
    def __init__(
        self, api: KubeApi, cluster_domain: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.api = api
        self.clock = clock
        self.flavor_missing_since: dict[str, float] = {}  # job key -> when its flavor was first missing
        self.cluster_domain = cluster_domain
        self.priority_values = PriorityValues(lambda: self.api.priority_values())
        self.lock = threading.Lock()  # PriorityValues is read from several reconcile threads
        self.last: dict[str, dict[str, Any]] = {}  # job key -> its Workload as last read or written
        # Jobs (keys) whose deleted or orphaned Workload still holds Kueue's finalizer.
        self.pending_release: set[str] = set()
        self.refusals: dict[str, int] = {}  # job key -> refusals (or failed placements) in a row
        self.gates: dict[str, KueueGate] = {}  # job key -> the last gate read (kept over a refusal)
        self.retry_at: dict[str, float] = {}  # job key -> when its backoff allows the next try (clock)
        self.held_refusal: dict[str, KueueGate] = {}  # job key -> its refused gate, until retry_at
        self.watched = Store(slim_workload)  # fed by the controller's Workload reflector
        self.served = False  # the last sweep found the API server serving Kueue's Workloads

    def gate(self, key: str, job: dict[str, Any], spec: TrainingJobSpec, queue: str) -> KueueGate:
        ref = JobRef.of(job)
        held, now = self.held_refusal.get(key), self.clock()
        if held is not None and now < self.retry_at.get(key, now):  # its backoff runs on time, not calls
            return dataclasses.replace(held, retry_after=self.retry_at[key] - now)
        try:
            gate = self._gate(key, job, spec, queue, ref)
        except CreationRefused as refusal:
            refused = self.held_refusal[key] = self._refused(key, workload_name(ref.name, ref.uid), refusal)
            return refused
        self.held_refusal.pop(key, None)
        self.gates[key] = gate
        if gate.placement_error:
            return dataclasses.replace(gate, retry_after=self._backoff(key))
        self.refusals.pop(key, None)
        self.retry_at.pop(key, None)
        return gate

    def _backoff(self, key: str) -> float:
        """Seconds to the next try; the wait doubles per try made, not per call before it is due."""
        now = self.clock()
        due = self.retry_at.get(key)
        if due is not None and now < due:
            return due - now
        count = self.refusals[key] = self.refusals.get(key, 0) + 1
        delay = float(min(REFUSED_RETRY_FIRST_SECONDS * 2.0 ** (count - 1), REFUSED_RETRY_MAX_SECONDS))
        self.retry_at[key] = now + delay
        return delay

    def _refused(self, key: str, name: str, refusal: CreationRefused) -> KueueGate:
        delay = self._backoff(key)
        log.warning(
            "Workload %s refused (%s): %s; trying again in %.0f s",
            name,
            refusal.status,
            refusal.message,
            delay,
        )
        message = (
            f"waiting for Kueue: the API server refused Workload {name}: {refusal.message}; tried again "
            "with a growing backoff (fix the job's spec, or Kueue's configuration)"
        )
        previous = self.gates.get(key)
        if previous is not None:  # a started gang goes on as Kueue last said (reconcile/rules/kueue.py)
            return dataclasses.replace(previous, refused=True, refusal=message, retry_after=delay)
        return KueueGate(workload=name, admitted=False, evicted=False, message=message, refused=True,
                         refusal=message, retry_after=delay)  # fmt: skip

    def _gate(
        self, key: str, job: dict[str, Any], spec: TrainingJobSpec, queue: str, ref: JobRef
    ) -> KueueGate:
        name = workload_name(ref.name, ref.uid)
        desired = self._desired(job, spec, queue)
        workload = self.api.get_workload(ref.namespace, name)
        stale = stale_in(workload, desired) if workload is not None else ""
        if workload is not None and stale and not (workload.get("status") or {}).get("admission"):
            # No quota reserved: queued again as the job is now (Kueue's own integrations do the same).
            log.info("recreating Workload %s/%s: %s", ref.namespace, name, stale)
            self._delete(workload)
            workload, stale = None, ""
        if workload is None:
            workload = self._create(desired, ref.namespace, name, queue)
            if workload is None:
                return KueueGate(workload=name, admitted=False, evicted=False, message=NO_KUEUE_MESSAGE)
        finished = get_condition((workload.get("status") or {}).get("conditions") or [], "Finished")
        if (
            not holds_finalizer(workload)
            and not workload["metadata"].get("deletionTimestamp")
            and (finished or {}).get("status") != "True"  # finished: released on purpose
        ):
            workload = self._hold(workload)  # made by an operator version that did not set it
        change = active_patch(workload, bool(spec.run_policy.suspend))
        if change is not None:  # suspended or resumed: Kueue evicts it, or queues it again
            workload = self.api.patch_workload(ref.namespace, name, change) or workload
        self.last[key] = workload
        gate = gate_of(workload)
        if gate.admitted:
            gate = self._placed(key, gate)
        return dataclasses.replace(gate, stale=stale) if stale else gate

    def _placed(self, key: str, gate: KueueGate) -> KueueGate:
        """The gate with the placement of its flavors and admission checks, or why there is none: a
        pod started without its flavor's node labels and tolerations would run off the flavor's nodes.
        A conflict never resolves itself, a missing flavor may be made again: waited for a while."""
        flavors = []
        for name in gate.flavors:
            flavor = self.api.get_resource_flavor(name)
            if flavor is None:
                since = self.flavor_missing_since.setdefault(key, self.clock())
                failed = self.clock() - since >= FLAVOR_MISSING_MAX_SECONDS
                return dataclasses.replace(gate, placement_failed=failed, placement_error=(
                    f"ResourceFlavor {name}, which Kueue assigned to Workload {gate.workload}, is not found"
                    + (f" after {FLAVOR_MISSING_MAX_SECONDS:.0f} s" if failed else
                       ": no pod starts without its placement (create it again, or Kueue evicts the Workload)")
                ))  # fmt: skip
            flavors.append(flavor)
        self.flavor_missing_since.pop(key, None)
        try:
            return dataclasses.replace(gate, placement=placement_of(flavors, gate.pod_set_updates))
        except FlavorConflict as conflict:
            return dataclasses.replace(
                gate, placement_failed=True, placement_error=f"{conflict}: no node can have both"
            )

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
        """The node labels, tolerations, labels and annotations of the flavors Kueue assigned and of
        its admission checks (resolved when the gate was read). Raises PlacementUnavailable while
        they could not be resolved: a replacement pod of a started gang would go out without them."""
        if gate.placement_error:
            raise PlacementUnavailable(gate.placement_error)
        return gate.placement

    def report(self, key: str, gate: KueueGate, status: dict[str, Any], pods: list[dict[str, Any]],
               nodes: Mapping[str, Mapping[str, Any]], now: float, node_lost_after: float) -> bool:  # fmt: skip
        """Writes back into the Workload what its owner is to tell Kueue. True: a write is still
        owed (Kueue kept writing meanwhile); the caller comes back soon, as a finished job is not
        resynced otherwise."""
        workload = self.last.get(key)
        if workload is None or gate.refused:  # refused: not what Kueue says now; written once it is read
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
            self._delete(workload)
            self.last.pop(key, None)
            return False
        if meta.get("deletionTimestamp"):  # deleted by someone while the job lives: its quota until stopped
            if stopped:
                self._release(workload)
                self.last.pop(key, None)
            return False  # the rule's recheck (and the pods' events) come back while the gang stops
        if phase in FINISHED_PHASES and not stopped:
            # Finished hands the quota back: not while a failed job's pods still stop (their grace
            # period, a SIGTERM checkpoint), or Kueue admits the next job onto busy devices.
            return True
        for _ in range(WRITE_TRIES):
            patch = self._patch_for(workload, gate, status, stopped, iso(now))
            if patch is None:
                return self._release_finished(workload, phase)
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
                return self._release_finished(stored, phase)
            return False
        return True

    def _release_finished(self, workload: dict[str, Any], phase: Any) -> bool:
        """Finished written and the gang stopped: the finalizer comes off, as Kueue's integrations
        drop it, so that nothing waits on this operator (after an uninstall, garbage collection
        would leave the Workload Terminating for good). True: to be tried again soon."""
        if phase not in FINISHED_PHASES or not holds_finalizer(workload):
            return False
        return not self._release(workload)

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
        self.gates.pop(key, None)
        self.retry_at.pop(key, None)
        self.held_refusal.pop(key, None)
        self.flavor_missing_since.pop(key, None)
        self.refusals.pop(key, None)
        self.pending_release.discard(key)

    def may_hold_quota(self, key: str) -> bool:
        """The job had a Workload this process knows of, or the resync found one left behind."""
        return key in self.last or key in self.pending_release

    def release_orphans(self, key: str, live_uid: str | None, pods: list[dict[str, Any]],
                        nodes: Mapping[str, Mapping[str, Any]], now: float, node_lost_after: float) -> bool:  # fmt: skip
        """Removes Kueue's finalizer from the job's Workloads that nothing runs against any more
        (deleted, or owned by a job that is gone: `live_uid` is the uid of the job of that name
        now, None when there is none) once every pod of their job has stopped. `pods`: the pods
        labelled with the job's name, whoever owns them. True while one still waits for its pods."""
        namespace, name = key.split("/", 1)
        selector = f"{c.LABEL_JOB_NAME}={name},{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
        owed = False
        for workload in self.api.list_workloads(namespace, selector) or []:
            if not holds_finalizer(workload) or not orphaned(workload, live_uid):
                continue
            if live_uid is not None and owner_uid(workload) == live_uid:
                continue  # deleted under its live job: that job's reconcile releases it (`report`)
            uid = owner_uid(workload) or ""
            theirs = [p for p in pods if is_owned_by(p, uid)]
            if not workload_status.gang_stopped(theirs, nodes, now, node_lost_after):
                owed = True  # their grace period (a SIGTERM checkpoint): the devices are still in use
            elif not self._release(workload):
                owed = True
        if owed:
            self.pending_release.add(key)
        else:
            self.pending_release.discard(key)
        return owed

    def orphan_keys(self, namespaces: list[str], live_uid_of: Callable[[str], str | None]) -> list[str]:
        """The jobs (keys) of Workloads that hold Kueue's finalizer with nothing left to run against
        them: a job deleted while no operator ran leaves no pod event to look at it again."""
        keys: list[str] = []
        selector = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
        scopes: list[str | None] = [*namespaces] if namespaces else [None]  # None: every namespace
        for scope in scopes:
            listed = self.api.list_workloads(scope, selector)
            self.served = listed is not None
            for workload in listed or []:
                meta = workload.get("metadata") or {}
                job_name = (meta.get("labels") or {}).get(c.LABEL_JOB_NAME)
                if not job_name or not holds_finalizer(workload):
                    continue
                key = f"{meta.get('namespace')}/{job_name}"
                live_uid = live_uid_of(key)
                if live_uid is not None and owner_uid(workload) == live_uid:
                    continue  # its live job's reconcile releases it (`report`)
                if orphaned(workload, live_uid) and key not in keys:
                    self.pending_release.add(key)
                    keys.append(key)
        return keys

    def _hold(self, workload: dict[str, Any]) -> dict[str, Any]:
        meta = workload["metadata"]
        patch = {"metadata": {"finalizers": [*(meta.get("finalizers") or []), c.KUEUE_RESOURCE_IN_USE_FINALIZER],
                              "resourceVersion": meta.get("resourceVersion")}}  # fmt: skip
        try:
            return self.api.patch_workload(meta["namespace"], meta["name"], patch) or workload
        except StatusConflict:  # changed meanwhile: set on the next pass
            return workload
        except CreationRefused as refusal:  # an older Workload Kueue's webhook will not change: as it is
            log.warning("Workload %s/%s: adding Kueue's finalizer refused: %s", meta["namespace"], meta["name"],
                        refusal.message)  # fmt: skip
            return workload

    def _release(self, workload: dict[str, Any]) -> bool:
        """Removes Kueue's finalizer: Kueue frees the quota once the Workload is gone. False: it
        changed meanwhile (tried again on the next pass)."""
        patch = finalizer_release(workload)
        if patch is None:
            return True
        meta = workload["metadata"]
        try:
            self.api.patch_workload(meta["namespace"], meta["name"], patch)
        except StatusConflict:
            return False
        log.info("released Workload %s/%s: every pod of its job has stopped", meta["namespace"], meta["name"])
        return True

    def _delete(self, workload: dict[str, Any]) -> None:
        """Deletes a Workload nothing runs against (no quota reserved, or the gang stopped) and
        drops its finalizer at once."""
        meta = workload["metadata"]
        self.api.delete_workload(meta["namespace"], meta["name"], meta.get("uid"))
        fresh = self.api.get_workload(meta["namespace"], meta["name"])
        if fresh is not None and fresh["metadata"].get("uid") == meta.get("uid"):
            self._release(fresh)


def slim_workload(workload: Mapping[str, Any]) -> Slim:
    """What tells a change and whose it is: the watch only enqueues the job; a reconcile reads the
    Workload itself."""
    meta = workload.get("metadata") or {}
    keys = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp", "labels")
    return {"metadata": {k: meta[k] for k in keys if meta.get(k) is not None}}


def job_key_of_workload(workload: Mapping[str, Any]) -> str | None:
    """The key of the TrainingJob whose Workload this is (by its job-name label); None: not ours."""
    meta = workload.get("metadata") or {}
    name = (meta.get("labels") or {}).get(c.LABEL_JOB_NAME)
    return f"{meta.get('namespace')}/{name}" if name and meta.get("namespace") else None
