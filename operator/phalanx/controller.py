"""The work loop: a de-duplicating queue of TrainingJob keys, reconcile workers, and the gang
admission pass. kopf's handlers (handlers.py) only enqueue keys here.

Level-triggered: every reconcile reads the job and its pods as they are now and asks the pure state
machine (reconcile/lifecycle.py) what to do, so a lost or repeated event changes nothing. Reconciles
and admission read watch-fed stores (cache.py, reflector.py) that the operator's own writes update
from the API's replies; a reconcile asks the API for a job the store does not have yet.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from phalanx import constants as c
from phalanx import metrics
from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.podgroups import build_podgroup
from phalanx.builders.pods import JobRef, admitted_pod, build_headless_service, build_worker_pod
from phalanx.cache import (
    Slim,
    Store,
    frees_or_changes_capacity,
    node_changed_for_admission,
    object_key,
    slim_job,
    slim_node,
    slim_pod,
)
from phalanx.gang.admission import GangRequest, admission_order, plan_admission
from phalanx.gang.capacity import NodeInfo, NodeInfoCache, PodDemand, Resources
from phalanx.gang.on_creation import plan_on_creation
from phalanx.gang.preemption import RunningGang, choose_victims, head_of_line_blocked, preemption_message
from phalanx.gang.usage import UsageIndex
from phalanx.k8s import CreationRefused, KubeApi, StatusConflict, short_error
from phalanx.leader import LeaderElector
from phalanx.pod_facts import is_gated, is_owned_by, job_of_pod, pod_attempt
from phalanx.policy.job_events import event_marker
from phalanx.policy.node_loss import DEFAULT_NODE_LOST_AFTER_SECONDS
from phalanx.policy.pod_outcome import node_is_ready
from phalanx.reconcile.conditions import get_condition, set_condition
from phalanx.reconcile.lifecycle import (
    FINISHED_PHASES,
    REASON_CREATE_REFUSED,
    REASON_PREEMPTED_BY_PRIORITY,
    Plan,
    decide,
    iso,
    merged_events,
    parse_iso,
)
from phalanx.reflector import Reflector, per_namespace

log = logging.getLogger("phalanx.controller")

RESYNC_SECONDS = 20.0
PROGRESS_MAX_BACKOFF_SECONDS = 30.0
PROGRESS_CONCURRENCY = 8
PROGRESS_PATIENT_ATTEMPTS = 60
ADMISSION_INTERVAL_SECONDS = 1.0
PROGRESS_TIMEOUT_SECONDS = 2.0  # a trainer busy on every core answers slowly
PROGRESS_POLL_SECONDS = 1.0
PREEMPTION_COOLDOWN_SECONDS = 15.0
NAME_CONFLICT_RETRY_SECONDS = 10.0
CREATE_REFUSED_RETRY_SECONDS = 5.0
RETRY_BASE_SECONDS = 2.0
# On shutdown, how long running reconciles and admission writes may take to finish (well within the
# pod's 30 s grace period); the lease is released only if they did.
DRAIN_SECONDS = 10.0
RETRY_MAX_SECONDS = 60.0
# Order value for a gang whose admission was interrupted: ahead of every PriorityClass (max 1e9).
FINISH_ADMISSION_PRIORITY = 2**40
WRITE_CONCURRENCY = 8  # pod creations and gate lifts in flight at once
# Pod events of one job come in bursts (a gang is created, admitted, bound and started together):
# one reconcile per burst, not one per event.
POD_EVENT_BATCH_SECONDS = 1.0


def status_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch that turns `old` into `new` (None removes a key); only what changed."""
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


class Controller:
    def __init__(self, api: KubeApi, namespaces: list[str], cluster_domain: str = "cluster.local",
                 workers: int = 8, clock: Callable[[], float] = time.time,
                 node_lost_after: float | None = None, leader: LeaderElector | None = None) -> None:  # fmt: skip
        self.api = api
        self.leader = leader  # None: this process alone writes (leader election off)
        self.clock = clock  # wall clock (API timestamps are wall time); injectable for tests
        # Seconds a node may be not Ready before the gangs with pods there restart (policy/node_loss.py).
        self.node_lost_after = node_lost_after if node_lost_after is not None else node_lost_after_from_env()
        self.namespaces = namespaces
        self.cluster_domain = cluster_domain
        self.workers = workers
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.queued: set[str] = set()
        self.active: set[str] = set()
        self.again: set[str] = set()
        self.job_markers: dict[str, tuple[Any, ...]] = {}  # the last kopf event's marker per job
        self.batching: set[str] = set()
        # Pod events arrive on the reflector's thread many per second; they are handed to the loop in
        # bunches (one wake-up per bunch instead of one per event).
        self.from_watch_lock = threading.Lock()
        self.from_watch_jobs: set[str] = set()
        self.from_watch_admission = False
        self.admission_lock = threading.Lock()
        # PHALANX_ADMIT_ON_CREATION=false: every pod is created gated, even when nothing waits.
        self.admit_on_creation = os.environ.get("PHALANX_ADMIT_ON_CREATION", "true").lower() != "false"
        self.priorities: dict[str, int] = {}  # PriorityClass name -> value, read by each admission pass
        self.assumed: dict[str, tuple[str, Resources]] = {}  # admitted at creation, create in flight
        self.node_infos = NodeInfoCache()  # read under admission_lock only
        # Own threads per kind of work: asyncio's default pool (cores + 4) would let slow progress
        # polls of unreachable pods hold up reconciles and the admission pass.
        self.reconcile_pool = ThreadPoolExecutor(workers, thread_name_prefix="reconcile")
        self.progress_pool = ThreadPoolExecutor(PROGRESS_CONCURRENCY, thread_name_prefix="progress")
        self.admission_pool = ThreadPoolExecutor(1, thread_name_prefix="admission")
        self.failures: dict[str, int] = {}
        self.write_pool = ThreadPoolExecutor(WRITE_CONCURRENCY, thread_name_prefix="writes")
        # Watch-fed copies of the cluster (cache.py).
        self.usage = UsageIndex()  # room held per node, fed by the pod store
        self.pods = Store(slim_pod, index=job_of_pod, observer=self.usage)
        self.nodes = Store(slim_node)
        self.jobs = Store(slim_job)
        self.reflectors: list[Reflector] = []
        self.reservations: dict[str, tuple[str, ...]] = {}
        self.admission_dirty = asyncio.Event()
        self.known_jobs: set[str] = set()
        self.progress_targets: dict[str, str] = {}
        self.progress_next_poll: dict[str, float] = {}
        self.progress_failures: dict[str, int] = {}
        self.last_progress: dict[str, dict[str, Any]] = {}
        self.preempting: dict[str, float] = {}
        self.tasks: list[asyncio.Task[None]] = []

    # -- queue ----------------------------------------------------------------------------------
    def enqueue(self, key: str, delay: float = 0.0) -> None:
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self.enqueue, key)
            return
        if key in self.active:
            self.again.add(key)  # reconcile once more after the running one finishes
            return
        if key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    def job_event(self, key: str, body: Mapping[str, Any]) -> None:
        """kopf's event for a job (on the loop): reconcile unless only its status changed."""
        marker = event_marker(body)
        if self.job_markers.get(key) == marker:
            return  # a status write (ours, mostly): nothing the reconcile decides on changed
        self.job_markers[key] = marker
        self.enqueue(key)

    def enqueue_batched(self, key: str) -> None:
        """Reconcile once POD_EVENT_BATCH_SECONDS from the first of a burst of events."""
        if key in self.batching or key in self.queued:
            return
        self.batching.add(key)

        def due() -> None:
            self.batching.discard(key)
            self.enqueue(key)

        asyncio.get_running_loop().call_later(POD_EVENT_BATCH_SECONDS, due)

    def forget(self, key: str) -> None:
        self.known_jobs.discard(key)
        self.job_markers.pop(key, None)
        for table in (
            self.progress_targets,
            self.progress_next_poll,
            self.progress_failures,
            self.last_progress,
        ):
            table.pop(key, None)
        self.reservations.pop(key, None)
        self.failures.pop(key, None)
        namespace, name = key.split("/", 1)
        metrics.forget_job(namespace, name)

    async def start(self) -> None:
        self.reflectors = [
            Reflector("pods", self.api.pods_request, self.pods, self._on_pod_change).start(),
            Reflector("nodes", self.api.nodes_request, self.nodes, self._on_node_change).start(),
            *(
                reflector.start()
                for reflector in per_namespace(
                    "trainingjobs", self.api.jobs_request, self.jobs, [*self.namespaces], self._on_job_change
                )
            ),
        ]
        # The stores fill from here on whether or not this process leads: a standby takes over warm.
        self.tasks.append(asyncio.create_task(self._run_when_leading(), name="leading"))

    async def _run_when_leading(self) -> None:
        if self.leader is not None:
            while not self.leader.leading.is_set():
                await asyncio.sleep(0.2)
            log.info("leading: reconciles, admission and progress polls start")
        for i in range(self.workers):
            self.tasks.append(asyncio.create_task(self._worker(), name=f"reconcile-{i}"))
        self.tasks.append(asyncio.create_task(self._admission_loop(), name="admission"))
        self.tasks.append(asyncio.create_task(self._resync_loop(), name="resync"))
        self.tasks.append(asyncio.create_task(self._progress_loop(), name="progress"))

    async def stop(self, drain_seconds: float = DRAIN_SECONDS) -> bool:
        """Stops the loops and waits up to `drain_seconds` for the writer threads to finish what they
        run; True once none is left (so no write of this process can still reach the API server)."""
        for reflector in self.reflectors:
            reflector.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        pools = (self.write_pool, self.reconcile_pool, self.progress_pool, self.admission_pool)

        def drain() -> None:
            for pool in pools:
                pool.shutdown(wait=True, cancel_futures=True)

        drainer = threading.Thread(target=drain, name="drain", daemon=True)
        drainer.start()
        await asyncio.to_thread(drainer.join, drain_seconds)
        return not drainer.is_alive()

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            key = await self.queue.get()
            self.queued.discard(key)
            if key in self.active:  # never two reconciles of one key at once
                self.again.add(key)
                continue
            self.active.add(key)
            try:
                with metrics.reconcile_timer("trainingjob"):
                    followups = await loop.run_in_executor(self.reconcile_pool, self.reconcile, key)
                self.failures.pop(key, None)
                for delay in followups:
                    self.enqueue(key, delay=delay)
            except Exception as exc:  # a failed reconcile is retried, never fatal
                # Backing off: a job in a namespace being deleted is refused (403) until it is gone.
                failures = self.failures[key] = self.failures.get(key, 0) + 1
                delay = min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** (failures - 1))
                log.warning("reconcile of %s failed (%d in a row), retrying in %.0fs: %s",
                            key, failures, delay, short_error(exc))  # fmt: skip
                self.enqueue(key, delay=delay)
            finally:
                self.active.discard(key)
                if key in self.again:
                    self.again.discard(key)
                    self.enqueue(key)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(RESYNC_SECONDS)
            for key in list(self.known_jobs):
                self.enqueue(key)

    # -- watch events (reflector threads) ---------------------------------------------------------
    def _on_pod_change(self, key: str, old: Slim | None, new: Slim | None) -> None:
        job = job_of_pod(new or old or {})
        dirty = frees_or_changes_capacity(old, new)
        if job is None and not dirty:
            return
        with self.from_watch_lock:
            wake = not self.from_watch_jobs and not self.from_watch_admission
            if job is not None:
                self.from_watch_jobs.add(job)
            self.from_watch_admission |= dirty
        if wake:
            self.loop.call_soon_threadsafe(self._take_watch_events)

    def _take_watch_events(self) -> None:
        with self.from_watch_lock:
            jobs, self.from_watch_jobs = self.from_watch_jobs, set()
            dirty, self.from_watch_admission = self.from_watch_admission, False
        for job in jobs:
            self.enqueue_batched(job)
        if dirty:
            self.admission_dirty.set()

    def _on_job_change(self, key: str, old: Slim | None, new: Slim | None) -> None:
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
            self._enqueue_threadsafe(key)

    def _on_node_change(self, key: str, old: Slim | None, new: Slim | None) -> None:
        if node_changed_for_admission(old, new):
            self._admission_dirty_threadsafe()
        if new is None or (old is not None and node_is_ready(old) and not node_is_ready(new)):
            # Gone or no longer Ready: the jobs with pods there decide now, not at the next resync.
            for pod in self.pods.items():
                job = job_of_pod(pod)
                if job is not None and (pod.get("spec") or {}).get("nodeName") == key:
                    self._enqueue_threadsafe(job)

    def _admission_dirty_threadsafe(self) -> None:
        self.loop.call_soon_threadsafe(self.admission_dirty.set)

    # -- reconcile --------------------------------------------------------------------------------
    def current_nodes(self) -> dict[str, dict[str, Any]]:
        """Nodes by name; empty until the first list, which decide() reads as "not known yet"."""
        return self.nodes.as_dict() if self.nodes.synced.is_set() else {}

    def reconcile(self, key: str) -> list[float]:
        """One level-triggered pass; returns the delays after which to look at this job again."""
        namespace, name = key.split("/", 1)
        followups: list[float] = []
        # The watch-fed copy once listed: our own writes reach it from the API's replies, so it is
        # never older than what this operator wrote (one GET per reconcile saved).
        job = self.jobs.get(key) if self.jobs.synced.is_set() else None
        if job is None:  # not listed yet, or kopf's event came before our watch's: ask the API
            job = self.api.get_job(namespace, name)
            if job is not None:
                self.jobs.upsert(job)
        if job is None or job["metadata"].get("deletionTimestamp"):
            self.forget(key)
            return followups
        self.known_jobs.add(key)
        # From the watch-fed store once it is listed (a reconcile per pod event would otherwise list
        # the job's pods each time); pods another controller owns are not ours despite our label.
        listed = (
            self.pods.indexed(key) if self.pods.synced.is_set() else self.api.list_job_pods(namespace, name)
        )
        pods = [p for p in listed if is_owned_by(p, job["metadata"]["uid"])]
        now = self.clock()
        old_status = dict(job.get("status") or {})
        if not old_status:
            metrics.observe_job_created(namespace, name)
        nodes = self.current_nodes()
        plan = decide(job, pods, nodes, now, self.node_lost_after)
        spec = parse(TrainingJobSpec, job["spec"])
        ref = JobRef.of(job)

        # Decide, record, then act: a deletion is explained in status before it is made, and only if
        # the job is still the version decided on. Otherwise a lost write would leave the next pass
        # reading the operator's own deletions as someone else's (a preemption, not the failure it was).
        recorded = old_status
        if plan.delete_pods or plan.force_delete_pods:
            try:
                stored = self._write_status(key, job, old_status, plan.status)
            except StatusConflict:
                return self._refreshed(key)
            if stored is None:
                self.forget(key)
                return followups
            # Told now: should a deletion below fail, the next pass starts from this status and
            # would see no transition left to report.
            self._observe(namespace, name, old_status, plan.status)
            for event in plan.events:
                self._record_event(job, event.type, event.reason, event.message, iso(now))
            job, recorded, plan.events = stored, copy.deepcopy(plan.status), []

        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
        grace = spec.run_policy.termination_grace_period_seconds
        for pod_name in plan.force_delete_pods:
            self.api.delete_pod(namespace, pod_name, uids.get(pod_name), 0)
        for pod_name in plan.delete_pods:
            if pod_name not in plan.force_delete_pods:
                self.api.delete_pod(namespace, pod_name, uids.get(pod_name), grace)
        if plan.create_indices:
            outcomes = self._create_gang(key, job, ref, spec, plan, now)
            taken = [o.pod for o in outcomes if o.taken]
            refused = [o for o in outcomes if o.refused is not None]
            if taken:
                self._report_name_conflict(job, plan.status, taken, now)
                followups.append(NAME_CONFLICT_RETRY_SECONDS)
            elif refused:
                self._report_refused_creation(job, plan.status, refused, spec.replicas, now)
                followups.append(CREATE_REFUSED_RETRY_SECONDS)
            elif self.pods.synced.is_set():
                # The pods exist now (the store holds the API's replies): decide once more on them,
                # so one status write says what this reconcile and the next would have written
                # (all pods created; admitted, when admitted at creation).
                pods = [p for p in self.pods.indexed(key) if is_owned_by(p, job["metadata"]["uid"])]
                then = decide({**job, "status": plan.status}, pods, nodes, now, self.node_lost_after)
                if not (then.create_indices or then.delete_pods or then.force_delete_pods or then.delete_job):
                    then.events = merged_events([*plan.events, *then.events])
                    plan = then
            if not taken and not refused:
                followups.append(0.5)

        self._track_progress_target(key, pods, plan.status)
        if plan.status.get("phase") == "Succeeded" and plan.status.get("progress", {}).get("totalSteps"):
            done = dict(plan.status["progress"])
            plan.status["progress"] = {**done, "step": done["totalSteps"], "percent": 100, "etaSeconds": 0}
        if plan.status.get("phase") in FINISHED_PHASES:
            self.known_jobs.discard(key)  # nothing left to resync; TTL rides on recheck_after
        try:
            self._write_status(key, job, recorded, plan.status)
        except StatusConflict:
            return self._refreshed(key)  # what was done is read back from the pods next time
        if status_diff(old_status, plan.status):
            # Decide once more on what was just written (a finished job's TTL, say, is timed from
            # the completionTime this write set): the job's own status events no longer enqueue it.
            followups.append(0.0)
        self._observe(namespace, name, recorded, plan.status)
        for event in plan.events:
            self._record_event(job, event.type, event.reason, event.message, iso(now))
        if plan.delete_job:
            self.api.delete_job(namespace, name)
            self.forget(key)
            return followups
        if plan.recheck_after is not None:
            followups.append(plan.recheck_after)
        if plan.delete_pods or plan.force_delete_pods:
            followups.append(1.0)
        return followups

    def _write_status(
        self, key: str, job: dict[str, Any], old: dict[str, Any], new: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Writes what changed from `old` to `new`, on condition that the job is still the version
        read; returns the job as stored (unchanged when there was nothing to write), None when gone."""
        patch = status_diff(old, new)
        if not patch:
            return job
        _failpoint_lose_status_write(key, patch)
        meta = job["metadata"]
        stored = self.api.patch_job_status(
            meta["namespace"], meta["name"], patch, meta.get("resourceVersion")
        )
        if stored is not None:
            self.jobs.upsert(stored)
        return stored

    def _refreshed(self, key: str) -> list[float]:
        """Someone wrote the job after it was read: read it again and decide once more, at once."""
        namespace, name = key.split("/", 1)
        fresh = self.api.get_job(namespace, name)
        if fresh is not None:
            self.jobs.upsert(fresh)
        log.info("%s changed while it was being reconciled; deciding again", key)
        return [0.0]

    def _create_gang(
        self, key: str, job: dict[str, Any], ref: JobRef, spec: TrainingJobSpec, plan: Plan, now: float
    ) -> list[CreateOutcome]:
        """Creates the Service, the PodGroup (external schedulers) and the missing pods of the
        attempt; says, per pod, whether another owner's pod holds its name or the API refused it."""
        for manifest in (build_headless_service(ref, spec), build_podgroup(ref, spec)):
            if manifest is None:
                continue
            try:
                if self.api.create_if_absent(manifest) is not None:
                    continue
            except CreationRefused as refusal:  # reported as a refused pod is: nothing runs without it
                return [CreateOutcome(f"{manifest['kind'].lower()} {manifest['metadata']['name']}",
                                      refused=refusal.message)]  # fmt: skip
            held = self.api.read_like(manifest)  # it existed: ours, or someone else's (pod_facts.py)
            if held is not None and not is_owned_by(held, ref.uid):
                return [
                    CreateOutcome(f"{manifest['kind'].lower()} {manifest['metadata']['name']}", taken=True)
                ]
        attempt = int(plan.status["attempt"])
        template = job["spec"].get("template") or {}
        pods_to_create = [
            build_worker_pod(
                ref,
                spec,
                index,
                attempt,
                template,
                cluster_domain=self.cluster_domain,
                attempt_in_name=plan.attempt_in_names,
                avoid_nodes=plan.avoid_nodes,
            )
            for index in plan.create_indices
        ]
        if len(pods_to_create) == spec.replicas:
            pods_to_create = self._admit_on_creation(key, spec, pods_to_create, now)
        try:
            outcomes = self._create_pods(pods_to_create, ref.uid)
        finally:
            with self.admission_lock:
                for pod in pods_to_create:
                    self.assumed.pop(f"{ref.namespace}/{pod['metadata']['name']}", None)
        self._admission_dirty_threadsafe()
        return outcomes

    def _admit_on_creation(
        self, key: str, spec: TrainingJobSpec, pods: list[dict[str, Any]], now: float
    ) -> list[dict[str, Any]]:
        """Admits a new gang as its pods are created when nothing waits and the whole gang fits now.

        The pods are then created pinned and without the gate, saving one write per pod; the plan is
        the one the admission pass would make a moment later. With any gang waiting (a gated pod
        exists), every pod is created gated and the pass decides in order, so no one jumps the queue.
        """
        if spec.scheduling.provider != "builtin" or not self.admit_on_creation:
            return pods
        with self.admission_lock:
            if not self._stores_synced():
                return pods  # not listed yet: the admission pass decides
            request = GangRequest(
                key=key,
                priority=self.priority_of(spec),
                created=now,
                pods=tuple((p["metadata"]["name"], PodDemand.from_pod_spec(p["spec"])) for p in pods),
                min_available=spec.min_available,
            )
            nodes = self.node_infos.infos(self.nodes.items())
            queued = bool(self.reservations) or self.usage.anyone_waits()
            placements = plan_on_creation(request, nodes, self._used_with_assumed(), queued, now)
            if placements is None:
                return pods
            namespace = key.split("/", 1)[0]
            demands = dict(request.pods)
            for name, node in placements.items():
                self.assumed[f"{namespace}/{name}"] = (node, demands[name].requests)
        metrics.observe_gang_admitted(namespace, key.split("/", 1)[1], 0.0)
        return [
            admitted_pod(p, placements[p["metadata"]["name"]]) if p["metadata"]["name"] in placements else p
            for p in pods
        ]

    def _used_with_assumed(self) -> dict[str, dict[str, int]]:
        """Room held per node by bound and admitted pods, and by creates whose reply is on its way
        (the caller holds admission_lock, which guards self.assumed)."""
        return self.usage.used(self.assumed)

    def _create_pods(self, pods: list[dict[str, Any]], owner_uid: str) -> list[CreateOutcome]:
        """Creates the pods a few at a time (a 32-pod gang one by one waits on 32 round trips)."""

        def create(pod: dict[str, Any]) -> CreateOutcome:
            meta = pod["metadata"]
            try:
                created = self.api.create_if_absent(pod)
            except CreationRefused as refusal:
                return CreateOutcome(meta["name"], refused=refusal.message)
            if created is not None:
                self.pods.upsert(created)
                metrics.observe_pods_created()
                _failpoint_after_pod_create()
                return CreateOutcome(meta["name"])
            held = self.api.read_like(pod)  # None: gone meanwhile, created on the next pass
            return CreateOutcome(
                f"pod {meta['name']}", taken=held is not None and not is_owned_by(held, owner_uid)
            )

        if os.environ.get("PHALANX_FAILPOINT_EXIT_AFTER_PODS") or len(pods) < 2:
            return [create(pod) for pod in pods]  # one by one: the failpoint counts them in order
        return list(self.write_pool.map(create, pods))

    def _record_event(self, job: dict[str, Any], type_: str, reason: str, message: str, now_iso: str) -> None:
        """Events are for people reading `kubectl describe`; a reconcile does not wait for them."""

        def record() -> None:
            try:
                self.api.create_event(job, type_, reason, message, now_iso)
            except Exception as exc:  # noqa: BLE001 - a lost event must not fail anything
                log.warning(
                    "event %s for %s not recorded: %s", reason, job["metadata"]["name"], short_error(exc)
                )

        self.write_pool.submit(record)

    def _report_name_conflict(
        self, job: dict[str, Any], status: dict[str, Any], taken: list[str], now: float
    ) -> None:
        """An object this job does not control holds a name it needs (a worker pod's, its Service's,
        its PodGroup's; pod_facts.py): say so in the status about to be written and, the first
        time, in an Event; then wait for it to go."""
        message = (
            f"{', '.join(taken)} hold(s) a name this TrainingJob needs but belong(s) to someone else; "
            "delete or rename it and the job continues"
        )
        first_time = (job.get("status") or {}).get("message") != message
        status["message"] = message
        status["conditions"] = set_condition(
            status.get("conditions") or [], "PodsCreated", "False", "NameConflict", message, iso(now),
            job["metadata"].get("generation"),
        )  # fmt: skip
        if first_time:
            self._record_event(job, "Warning", "NameConflict", message, iso(now))

    def _report_refused_creation(
        self,
        job: dict[str, Any],
        status: dict[str, Any],
        refused: list[CreateOutcome],
        replicas: int,
        now: float,
    ) -> None:
        """The API server refused pods (quota, admission policy, an invalid template): say so with its
        words in the status about to be written and, the first time, in a Warning event. Creation is
        retried; a gang left half-created is torn down after its gang timeout (lifecycle.py)."""
        first = refused[0]
        message = f"{len(refused)}/{replicas} pod(s) refused by the API server: {first.refused}"
        previous = get_condition((job.get("status") or {}).get("conditions") or [], "PodsCreated")
        status["message"] = message
        status["conditions"] = set_condition(
            status.get("conditions") or [], "PodsCreated", "False", REASON_CREATE_REFUSED, message, iso(now),
            job["metadata"].get("generation"),
        )  # fmt: skip
        if previous is None or previous.get("message") != message:
            self._record_event(job, "Warning", REASON_CREATE_REFUSED, message, iso(now))

    def _observe(self, namespace: str, name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        if old.get("phase") != new.get("phase") and new.get("phase"):
            metrics.observe_phase_change(namespace, name, old.get("phase"), new["phase"])
        old_restarts, new_restarts = old.get("restarts") or {}, new.get("restarts") or {}
        for field, reason in (("failures", "failure"), ("preemptions", "preemption")):
            if new_restarts.get(field, 0) > old_restarts.get(field, 0):
                metrics.observe_restart(namespace, name, reason)  # type: ignore[arg-type]
        if (new.get("gangTimeouts") or 0) > (old.get("gangTimeouts") or 0):
            metrics.observe_gang_timeout(namespace, name)

    def _track_progress_target(self, key: str, pods: list[dict[str, Any]], status: dict[str, Any]) -> None:
        """Remembers where global rank 0 serves /progress while the job runs (the progress loop polls it)."""
        if status.get("phase") != "Running":
            self.progress_targets.pop(key, None)
            return
        attempt = status.get("attempt")
        rank0 = next(
            (p for p in pods if pod_attempt(p) == attempt
             and p["metadata"]["labels"].get(c.LABEL_REPLICA_INDEX) == "0"), None,
        )  # fmt: skip
        ip = (rank0 or {}).get("status", {}).get("podIP")
        if ip and self.progress_targets.get(key) != ip:
            self.progress_targets[key] = ip
            self.progress_next_poll.pop(key, None)
            self.progress_failures.pop(key, None)

    async def _progress_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PROGRESS_POLL_SECONDS)
            now = time.monotonic()
            due = [k for k in list(self.progress_targets) if self.progress_next_poll.get(k, 0.0) <= now]
            for start in range(0, len(due), PROGRESS_CONCURRENCY):
                batch = due[start : start + PROGRESS_CONCURRENCY]
                results = await asyncio.gather(
                    *(loop.run_in_executor(self.progress_pool, self._poll_progress, k) for k in batch),
                    return_exceptions=True,
                )
                for key, result in zip(batch, results, strict=True):
                    if isinstance(result, Exception):
                        log.warning("progress of %s not recorded: %s", key, short_error(result))

    def _poll_progress(self, key: str) -> None:
        """Copies the trainer's /progress into status.progress and status.lastCheckpoint when they change."""
        ip = self.progress_targets.get(key)
        if ip is None:
            return
        try:
            url = f"http://{ip}:{c.DEFAULT_METRICS_PORT}{c.PROGRESS_PATH}"
            with urllib.request.urlopen(url, timeout=PROGRESS_TIMEOUT_SECONDS) as response:
                report = json.loads(response.read())
        except (OSError, ValueError):
            # Simulated pods serve nothing and a trainer may still be starting: back off, quietly.
            failures = self.progress_failures.get(key, 0) + 1
            self.progress_failures[key] = failures
            # A trainer takes a while to import torch and rendezvous: keep the normal pace for the
            # first attempts, then back off (kwok's simulated pods never answer).
            slow = max(0, failures - PROGRESS_PATIENT_ATTEMPTS)
            delay = min(PROGRESS_MAX_BACKOFF_SECONDS, PROGRESS_POLL_SECONDS * 2**slow)
            self.progress_next_poll[key] = time.monotonic() + delay
            return
        self.progress_failures.pop(key, None)
        namespace, name = key.split("/", 1)
        patch: dict[str, Any] = {"progress": progress_status(report)}
        checkpoint = report.get("last_checkpoint") or None
        if checkpoint and checkpoint.get("step") is not None:
            patch["lastCheckpoint"] = {"step": int(checkpoint["step"]), "time": checkpoint.get("time")}
            saved = parse_iso(checkpoint.get("time"))
            if saved is not None:
                metrics.observe_checkpoint(namespace, name, saved)
        total, step = report.get("total_steps"), report.get("step")
        if isinstance(total, int) and isinstance(step, int) and total > 0:
            metrics.observe_progress(namespace, name, step, total)
        if self.last_progress.get(key) != patch:
            self._patch_job_status(namespace, name, patch)
            self.last_progress[key] = patch

    # -- gang admission (provider: builtin) ------------------------------------------------------
    async def _admission_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await asyncio.wait_for(self.admission_dirty.wait(), timeout=ADMISSION_INTERVAL_SECONDS * 3)
            except TimeoutError:
                pass
            self.admission_dirty.clear()
            try:
                await loop.run_in_executor(self.admission_pool, self.admission_pass)
            except Exception as exc:
                log.warning("admission pass failed, retrying: %s", short_error(exc))
            await asyncio.sleep(ADMISSION_INTERVAL_SECONDS)

    def priority_of(self, spec: TrainingJobSpec) -> int:
        """The value of the job's PriorityClass as the last admission pass read it."""
        return self.priorities.get(spec.scheduling.priority_class_name or "", 0)

    def own_pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The job's pods in the store: labelled for it and controlled by it (pod_facts.py)."""
        uid = job["metadata"].get("uid", "")
        return [p for p in self.pods.indexed(object_key(job)) if is_owned_by(p, uid)]

    def _stores_synced(self) -> bool:
        return all(store.synced.is_set() for store in (self.jobs, self.pods, self.nodes))

    def _patch_job_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        stored = self.api.patch_job_status(namespace, name, patch)
        if stored is not None:
            self.jobs.upsert(stored)  # the next admission pass must not read an older status

    def admission_pass(self) -> None:
        if not self._stores_synced():
            return  # a pass over half a cluster would hand out room that is taken
        every_job = self.jobs.items()
        jobs = [j for j in every_job if _is_admission_candidate(j)]
        if not jobs:
            self.reservations.clear()
            return
        # Under the lock that admission at creation (_admit_on_creation) takes: one plan at a time.
        with self.admission_lock:
            # Admitted but not bound yet; and admitted at creation, the create's reply still on its way.
            used = self._used_with_assumed()
            self.priorities = self.api.priority_values()
            requests = []
            gated_pods: dict[str, dict[str, dict[str, Any]]] = {}
            finishing: set[str] = set()  # gangs whose interrupted admission is being completed
            now = time.time()
            for job in jobs:
                key = object_key(job)
                spec = parse(TrainingJobSpec, job["spec"])
                attempt = (job.get("status") or {}).get("attempt", 0)
                current = [p for p in self.own_pods(job) if pod_attempt(p) == attempt]
                pods = [p for p in current if is_gated(p)]
                if len(current) < spec.replicas or not pods:
                    continue  # still being created (or torn down): never admit half a gang
                priority = self.priority_of(spec)
                min_available = spec.min_available
                ungated = len(current) - len(pods)
                if ungated:
                    # Some gates are already lifted: an operator stopped in the middle of admitting this
                    # gang, or pods beyond minAvailable wait for room. Place the rest; a gang below its
                    # minimum goes first, since its admitted pods already hold their nodes.
                    min_available = max(spec.min_available - ungated, 1)
                    if ungated < spec.min_available:
                        priority = FINISH_ADMISSION_PRIORITY
                        finishing.add(key)
                gated_pods[key] = {p["metadata"]["name"]: p for p in pods}
                created = parse_iso(job["metadata"].get("creationTimestamp")) or now
                requests.append(GangRequest(
                    key=key,
                    priority=priority,
                    created=created,
                    pods=tuple((p["metadata"]["name"], PodDemand.from_pod_spec(p["spec"])) for p in pods),
                    min_available=min_available,
                ))  # fmt: skip
            if not requests:
                return
            nodes = self.node_infos.infos(self.current_nodes().values())
            plan = plan_admission(requests, nodes, used, now, reservations=self.reservations)
            self.reservations = dict(plan.reservations)
        jobs_by_key = {object_key(j): j for j in jobs}
        patches = []
        for admission in plan.admitted:
            namespace = admission.key.split("/", 1)[0]
            for pod_name, node in admission.placements:
                admitted = admitted_pod(gated_pods[admission.key][pod_name], node)
                patches.append((namespace, pod_name, admitted["spec"]))
        self._admit_pods(patches)
        for admission in plan.admitted:
            namespace = admission.key.split("/", 1)[0]
            created = min(parse_iso(p["metadata"].get("creationTimestamp")) or now
                          for p in gated_pods[admission.key].values())  # fmt: skip
            metrics.observe_gang_admitted(namespace, admission.key.split("/", 1)[1], max(0.0, now - created))
            self._enqueue_threadsafe(admission.key)
        head = head_of_line_blocked(plan.waiting, admission_order(requests))
        if head is not None and head.key not in finishing:  # its lifted priority must not preempt
            self._preempt_for(head, every_job, nodes, used)
        for key, reason in [
            *plan.waiting.items(),
            *((k, f"can never fit: {r}") for k, r in plan.never_fits.items()),
        ]:
            job = jobs_by_key[key]
            if (job.get("status") or {}).get("admissionMessage") != reason:
                namespace, name = key.split("/", 1)
                waiting_since = parse_iso(job["metadata"].get("creationTimestamp")) or now
                metrics.observe_admission_wait_started(namespace, name, waiting_since)
                self._patch_job_status(namespace, name, {"admissionMessage": reason})
                self._enqueue_threadsafe(key)

    def _admit_pods(self, patches: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Lifts the gates, several requests at a time: one request per pod, so a big burst of gangs
        would otherwise wait on round trips one by one. A crash half-way is finished by the next pass."""
        if not patches:
            return
        started = time.monotonic()

        def admit(patch: tuple[str, str, dict[str, Any]]) -> None:
            admitted = self.api.admit_pod(*patch)
            if admitted is not None:
                self.pods.upsert(admitted)  # counted on its node by the very next pass
            _failpoint_after_admit()

        if os.environ.get("PHALANX_FAILPOINT_EXIT_AFTER_ADMITS"):
            for patch in patches:  # one by one: the failpoint counts them in order
                admit(patch)
        else:
            list(self.write_pool.map(admit, patches))
        log.info("admitted %d pod(s) in %.2fs", len(patches), time.monotonic() - started)

    def _preempt_for(
        self,
        head: GangRequest,
        jobs: list[dict[str, Any]],
        nodes: list[NodeInfo],
        used: dict[str, dict[str, int]],
    ) -> None:
        """Priority preemption through admission: stop the fewest lower-priority gangs the head needs.

        The victims' pods get their grace period (SIGTERM: the trainer checkpoints); the victim job
        sees its pods deleted by someone else, restarts as a preemption, and waits for capacity.
        """
        now = time.monotonic()
        if any(now - at < PREEMPTION_COOLDOWN_SECONDS for at in self.preempting.values()):
            return  # let the last victims finish terminating before choosing again
        running = []
        for job in jobs:
            key = object_key(job)
            status = job.get("status") or {}
            if key == head.key or status.get("phase") not in ("Running", "Admitted"):
                continue
            spec = parse(TrainingJobSpec, job["spec"])
            # Pods already being deleted count in `freeing` below, not as room a victim would free.
            bound = [
                (p["metadata"]["name"], p["spec"]["nodeName"], PodDemand.from_pod_spec(p["spec"]))
                for p in self.own_pods(job)
                if pod_attempt(p) == status.get("attempt", 0)
                and p.get("spec", {}).get("nodeName")
                and not p["metadata"].get("deletionTimestamp")
            ]
            if bound:
                started = parse_iso(status.get("admittedTime")) or 0.0
                priority = self.priority_of(spec)
                running.append(RunningGang(key, priority, started, tuple(bound)))
        # One victim per need: the room the last victims' terminating pods will free counts as free.
        choice = choose_victims(head, running, nodes, used, freeing=self.usage.freeing())
        if choice is None:
            return
        for victim in choice.victims:
            log.info("preempting %s for higher-priority %s", victim, head.key)
            self.preempting[victim] = now
            job = next(j for j in jobs if object_key(j) == victim)
            self._stop_victim(job, preemption_message(head.key, head.priority))
            self._enqueue_threadsafe(victim)

    def _stop_victim(self, job: dict[str, Any], message: str) -> None:
        """Says on the victim who preempted it (a Preempted condition, then an event), then evicts its
        pods with their grace period: the pods carry DisruptionTarget, the trainer checkpoints on
        SIGTERM, and the victim's reconcile restarts it as a preemption."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        key = object_key(job)
        now_iso = iso(time.time())
        conditions = set_condition((job.get("status") or {}).get("conditions") or [], "Preempted", "True",
                                   REASON_PREEMPTED_BY_PRIORITY, message, now_iso, job["metadata"].get("generation"))  # fmt: skip
        try:
            self._write_status(key, job, {}, {"conditions": conditions})
        except StatusConflict:
            fresh = self.api.get_job(namespace, name)
            if fresh is None:
                return
            self.jobs.upsert(fresh)
            return  # the next pass decides again on what the job is now
        self._record_event(job, "Warning", REASON_PREEMPTED_BY_PRIORITY, message, now_iso)
        grace = parse(TrainingJobSpec, job["spec"]).run_policy.termination_grace_period_seconds
        for pod in self.own_pods(job):
            if not self.api.evict_pod(namespace, pod["metadata"]["name"], pod["metadata"]["uid"], grace):
                log.warning(
                    "eviction of %s/%s refused by a PodDisruptionBudget", namespace, pod["metadata"]["name"]
                )

    def _enqueue_threadsafe(self, key: str) -> None:
        loop = self.loop
        loop.call_soon_threadsafe(self.enqueue, key)

    loop: asyncio.AbstractEventLoop


_pods_created_here = 0


@dataclass(frozen=True)
class CreateOutcome:
    """What became of one pod creation."""

    pod: str
    taken: bool = False  # another owner's pod holds the name
    refused: str | None = None  # the API server's message when it refused the pod


def _failpoint_after_pod_create() -> None:
    """Test hook: PHALANX_FAILPOINT_EXIT_AFTER_PODS=N kills the process after its N-th pod creation,
    the way a crash between two API calls would (tests/integration/test_reconcile.py)."""
    global _pods_created_here
    limit = os.environ.get("PHALANX_FAILPOINT_EXIT_AFTER_PODS")
    _pods_created_here += 1
    if limit and _pods_created_here >= int(limit):
        log.error("failpoint: exiting after %d pod creations", _pods_created_here)
        os._exit(3)


_pods_admitted_here = 0


def _failpoint_after_admit() -> None:
    """Test hook: PHALANX_FAILPOINT_EXIT_AFTER_ADMITS=N kills the process after it lifted N gates,
    in the middle of admitting a gang (tests/integration/test_gang.py)."""
    global _pods_admitted_here
    limit = os.environ.get("PHALANX_FAILPOINT_EXIT_AFTER_ADMITS")
    _pods_admitted_here += 1
    if limit and _pods_admitted_here >= int(limit):
        log.error("failpoint: exiting after lifting %d gates", _pods_admitted_here)
        os._exit(3)


def node_lost_after_from_env() -> float:
    """PHALANX_NODE_LOST_AFTER_SECONDS (docs/reliability.md), else the policy's default."""
    raw = os.environ.get(c.ENV_NODE_LOST_AFTER, "")
    if not raw:
        return DEFAULT_NODE_LOST_AFTER_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"{c.ENV_NODE_LOST_AFTER}={raw!r}: give a number of seconds >= 0, for example 20")
    return value


_status_writes_lost: set[tuple[str, str]] = set()


def _failpoint_lose_status_write(key: str, patch: dict[str, Any]) -> None:
    """Test hook: PHALANX_FAILPOINT_LOSE_STATUS_WRITE=Failed,Restarting makes the first reconcile
    status write per job that moves it to one of those phases fail before it reaches the API server,
    as a dropped connection would (tests/integration/test_reliability.py)."""
    phases = os.environ.get("PHALANX_FAILPOINT_LOSE_STATUS_WRITE")
    phase = patch.get("phase")
    if not phases or phase not in phases.split(",") or (key, phase) in _status_writes_lost:
        return
    _status_writes_lost.add((key, phase))
    log.error("failpoint: status write of %s to %s lost", key, phase)
    raise ConnectionResetError(f"failpoint: status write of {key} to {phase} lost")


def _is_admission_candidate(job: dict[str, Any]) -> bool:
    """A job the admission pass looks at: builtin provider, not suspended, not finished. Running and
    Admitted jobs too: pods beyond minAvailable, or those of a pass stopped half-way, may still wait
    at the gate. The pass itself skips a job with no gated pod of its current attempt."""
    status = job.get("status") or {}
    spec = job.get("spec") or {}
    if (spec.get("scheduling") or {}).get("provider", "builtin") != "builtin":
        return False
    if (spec.get("runPolicy") or {}).get("suspend"):
        return False
    # Not waiting for status.createdAttempt: the pass itself admits a gang only once every pod of the
    # current attempt exists, and the reconcile that records createdAttempt can sit behind many
    # others in the queue during a burst, delaying admission for nothing.
    return status.get("phase") not in (*FINISHED_PHASES, "Suspended")


def progress_status(report: dict[str, Any]) -> dict[str, Any]:
    """status.progress from the trainer's /progress JSON (docs/environment.md)."""
    out: dict[str, Any] = {}
    step, total = report.get("step"), report.get("total_steps")
    if isinstance(step, int):
        out["step"] = step
    if isinstance(total, int) and total > 0:
        out["totalSteps"] = total
        if isinstance(step, int):
            out["percent"] = min(100, int(100 * step / total))
    eta = report.get("eta_seconds")
    if isinstance(eta, (int, float)):
        out["etaSeconds"] = int(eta)
    if isinstance(report.get("loss"), (int, float)):
        out["loss"] = f"{report['loss']:.4f}"
    if isinstance(report.get("tokens_per_second"), (int, float)):
        out["tokensPerSecond"] = f"{report['tokens_per_second']:.0f}"
    return out
