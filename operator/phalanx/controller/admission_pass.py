"""The admission pass (I/O side; the plan is gang/admission.py): every waiting builtin gang in
order, placed on the nodes as the stores see them; lifts the gates of the admitted, says on the
others why they wait, and asks the preemptor to make room for the head of the queue."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from phalanx import metrics
from phalanx.builders.pods import admitted_pod
from phalanx.cache import object_key
from phalanx.controller import failpoints
from phalanx.controller.admission_messages import AdmissionMessages
from phalanx.controller.admission_state import AdmissionState, PriorityValues
from phalanx.controller.job_writes import JobWriter
from phalanx.controller.preemption import Preemptor
from phalanx.controller.queue import WorkQueue
from phalanx.controller.stores import ClusterStores
from phalanx.gang.admission import AdmissionPlan, GangRequest, admission_order, plan_admission
from phalanx.gang.backfill import PodOnNode, node_free_at, stated_end
from phalanx.gang.capacity import add_into
from phalanx.gang.early_start import (
    EarlyStart,
    end_for_early_start,
    node_handovers,
)
from phalanx.gang.preemption import head_of_line_blocked
from phalanx.gang.requests import waiting_gang
from phalanx.k8s import KubeApi, short_error
from phalanx.kueue.workload import managed_here, queue_name
from phalanx.pod_facts import is_gated
from phalanx.policy.admission_pacing import IDLE_PASS_SECONDS, MAX_PASS_CPU_SECONDS, pause_after
from phalanx.providers import provider_of_raw
from phalanx.reconcile.plan import FINISHED_PHASES, parse_iso
from phalanx.reconcile.rules.creation import NEVER_FITS

log = logging.getLogger("phalanx.controller")


def lowest_running_priority(jobs: list[dict[str, Any]], priorities: Mapping[str, int]) -> int | None:
    """The priority a blocked head must exceed to preempt (None: nothing it could stop), from the
    PriorityClass values the pass read, over the jobs the preemptor looks at (controller/
    preemption.py): running or admitted, managed here, not Kueue's. A job with warm spares counts one
    lower: a head of its very priority may take a spare's room (gang/preemption.py)."""
    lowest: int | None = None
    for job in jobs:
        phase = (job.get("status") or {}).get("phase")
        spec = job.get("spec") or {}
        spares = isinstance(spec.get("spares"), int) and spec["spares"] > 0
        if queue_name(job) or not managed_here(job):
            continue
        if phase not in ("Running", "Admitted") and not (spares and phase == "Restarting"):
            continue
        value = priorities.get((spec.get("scheduling") or {}).get("priorityClassName") or "", 0) - int(spares)
        lowest = value if lowest is None else min(lowest, value)
    return lowest


def is_admission_candidate(job: dict[str, Any]) -> bool:
    """A job the admission pass looks at: builtin provider, not suspended, not finished, whatever
    its phase (Running and Admitted included). Which of them wait is the pass's to find: it skips a
    job with no gated pod of its current attempt, and finishes one whose admission a stopped
    operator left half done."""
    status = job.get("status") or {}
    spec = job.get("spec") or {}
    if not provider_of_raw(spec).admits_gangs:
        return False
    if queue_name(job) or not managed_here(job):
        return False  # Kueue admits it (reconcile/rules/kueue.py), or another controller runs it
    if (spec.get("runPolicy") or {}).get("suspend"):
        return False
    # Not waiting for status.createdAttempt: the pass itself admits a gang only once every pod of the
    # current attempt exists, and the reconcile that records createdAttempt can sit behind many
    # others in the queue during a burst, delaying admission for nothing.
    return status.get("phase") not in (*FINISHED_PHASES, "Suspended")


def used_after(used: dict[str, dict[str, int]], plan: AdmissionPlan) -> dict[str, dict[str, int]]:
    """`used` with what the plan just admitted: the preemptor must not count that room as free."""
    after = {node: dict(amounts) for node, amounts in used.items()}
    for node, requests in plan.placed.items():
        add_into(after.setdefault(node, {}), requests.items())
    return after


class _OnFirstRead(Mapping[str, float]):
    """A mapping computed when first read, then kept: what a plan may never ask for costs nothing."""

    def __init__(self, compute: Callable[[], dict[str, float]]) -> None:
        self._compute = compute
        self._value: dict[str, float] | None = None

    def _read(self) -> dict[str, float]:
        if self._value is None:
            self._value = self._compute()
        return self._value

    def __getitem__(self, key: str) -> float:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


class AdmissionPass:
    def __init__(self, api: KubeApi, stores: ClusterStores, state: AdmissionState, writer: JobWriter,
                 preemptor: Preemptor, work: WorkQueue, write_pool: ThreadPoolExecutor,
                 clock: Callable[[], float]) -> None:  # fmt: skip
        self.api = api
        self.stores = stores
        self.state = state
        self.writer = writer
        self.preemptor = preemptor
        self.work = work
        self.write_pool = write_pool
        self.clock = clock
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="admission")
        # Why each gang waits: written off this thread, so a pass never waits on them.
        self.messages = AdmissionMessages(
            stores, writer, work.enqueue_threadsafe if work else lambda key: None
        )
        # (job key, uid) -> the newest progress read and when a poll first read it (read_progress).
        self.read_progress: Callable[[str, str], tuple[dict[str, Any], float] | None] = lambda key, uid: None
        self.recheck_at: float | None = None  # the last plan's: when to look again to start a head early
        self.priority_values = PriorityValues(
            lambda: self.api.priority_values(), watched=stores.priority_classes
        )

    async def run(self) -> None:
        """Runs a pass soon after something changed (work.admission_dirty), else every few seconds;
        after each, a pause sized by what it cost (policy/admission_pacing.py)."""
        loop = asyncio.get_running_loop()
        dirty = self.work.admission_dirty
        while True:
            wait = IDLE_PASS_SECONDS
            if self.recheck_at is not None:  # a head to start early, before the next idle pass
                wait = min(wait, max(0.0, self.recheck_at - self.clock()))
            try:
                await asyncio.wait_for(dirty.wait(), timeout=wait)
            except TimeoutError:
                pass
            dirty.clear()
            try:
                cpu_seconds = await loop.run_in_executor(self.pool, self._timed_pass)
            except Exception as exc:
                log.warning("admission pass failed, retrying: %s", short_error(exc))
                cpu_seconds = MAX_PASS_CPU_SECONDS  # unknown: the longest pause
            await asyncio.sleep(pause_after(cpu_seconds))

    def _timed_pass(self) -> float:
        """Runs a pass; returns the CPU time it took on its thread (its waits on the API are free)."""
        began = time.thread_time()
        self.admission_pass()
        return time.thread_time() - began

    def admission_pass(self) -> None:
        stores, state = self.stores, self.state
        self.recheck_at = None
        if not stores.synced():
            return  # a pass over half a cluster would hand out room that is taken
        if not stores.usage.anyone_gated():
            # Nothing at the gate, so no gang to admit or preempt for: most passes once gangs run,
            # where looking at every job and its pods cost a tenth of the operator's steady CPU.
            if state.reservations and not any(is_admission_candidate(j) for j in stores.jobs.items()):
                state.reservations.clear()
            return
        every_job = stores.jobs.items()
        jobs = [j for j in every_job if is_admission_candidate(j)]
        if not jobs:
            state.reservations.clear()
            return
        named = {
            n for j in jobs if (n := ((j.get("spec") or {}).get("scheduling") or {}).get("priorityClassName"))
        }
        priorities = self.priority_values.current(named)  # before the lock: it may ask the API
        # Under the lock that admission at creation takes: one plan at a time.
        with state.lock:
            # Admitted but not bound yet; and admitted at creation, the create's reply still on its way.
            used = state.used_with_assumed(stores.usage)
            state.priorities = priorities
            requests: list[GangRequest] = []
            gated_pods: dict[str, dict[str, dict[str, Any]]] = {}
            finishing: set[str] = set()  # gangs whose interrupted admission is being completed
            spares_only: set[str] = set()  # warm spares only: best effort, they neither preempt nor wait
            now = self.clock()
            for job in jobs:
                key = object_key(job)
                own = stores.own_pods(job)
                if not any(is_gated(p) for p in own):
                    continue  # nothing at the gate (most jobs, running): waiting_gang's None, its spec unparsed
                created = parse_iso(job["metadata"].get("creationTimestamp")) or now
                waiting = waiting_gang(key, job, own, state.priority_of, created)
                if waiting is None:
                    continue  # still being created (or torn down), or nothing at the gate
                if waiting.finishing:
                    finishing.add(key)
                if waiting.spares_only:
                    spares_only.add(key)
                gated_pods[key] = waiting.gated
                requests.append(waiting.request)
            if not requests:
                return
            nodes = state.node_infos.node_set(stores.current_nodes().values())
            # Read only if the plan asks (a blocked head, a gang with an estimate): it reads every pod.
            free_at = _OnFirstRead(lambda: self._free_at(set(used), state, now))
            # A copy: forget() drops a deleted job's reservation from a reconcile thread.
            plan = plan_admission(requests, nodes, used, now, reservations=dict(state.reservations),
                                  free_at=free_at, early=self._early_start(state, now),
                                  lowest_running_priority=lowest_running_priority(every_job, state.priorities))  # fmt: skip
            state.reservations = dict(plan.reservations)
            self.recheck_at = plan.recheck_at
        jobs_by_key = {object_key(j): j for j in jobs}
        patches = []
        for admission in plan.admitted:
            namespace = admission.key.split("/", 1)[0]
            for pod_name, node in admission.placements:
                admitted = admitted_pod(gated_pods[admission.key][pod_name], node)
                patches.append((namespace, pod_name, admitted["spec"]))
        for admission in plan.admitted:  # before the gates go: a reason on its way is no longer true
            self.messages.drop(admission.key)
        self.admit_pods(patches)
        for admission in plan.admitted:
            namespace = admission.key.split("/", 1)[0]
            created = min(parse_iso(p["metadata"].get("creationTimestamp")) or now
                          for p in gated_pods[admission.key].values())  # fmt: skip
            metrics.observe_gang_admitted(namespace, admission.key.split("/", 1)[1], max(0.0, now - created))
            self.work.enqueue_threadsafe(admission.key)
        head = head_of_line_blocked(plan.waiting, admission_order(requests))
        # A finishing gang's lifted priority must not preempt, nor may spares on their own.
        if head is not None and head.key not in finishing and head.key not in spares_only:
            self.preemptor.preempt_for(head, every_job, nodes, used_after(used, plan))
        for key, reason in [
            *plan.waiting.items(),
            *((k, f"{NEVER_FITS}: {r}") for k, r in plan.never_fits.items()),
        ]:
            if key in spares_only:
                continue  # the job runs; its spares wait for room unannounced (status.spares.ready)
            job = jobs_by_key[key]
            uid = str(job["metadata"]["uid"])
            pending = self.messages.pending(key)
            # Asked when the job shows another reason, or another is on its way to it (it would
            # otherwise land after this pass found the shown one true again).
            if (job.get("status") or {}).get("admissionMessage") != reason or pending not in (
                None,
                (uid, reason),
            ):
                namespace, name = key.split("/", 1)
                waiting_since = parse_iso(job["metadata"].get("creationTimestamp")) or now
                metrics.observe_admission_wait_started(namespace, name, waiting_since)
                self.messages.ask(key, uid, reason, job["metadata"].get("resourceVersion"))

    def _free_at(self, nodes: set[str], state: AdmissionState, now: float) -> dict[str, float]:
        """When the work on these nodes (those holding room) ends, for the ETA-aware backfill and
        the head's reservation (gang/backfill.py)."""
        return node_free_at(*self._work_on(nodes, state), now)

    def _early_start(self, state: AdmissionState, now: float) -> Callable[[Sequence[str]], EarlyStart]:
        """What early start knows of some nodes (gang/early_start.py), read when a plan asks: only
        for the nodes a blocked head holds, so a pass with no blocked head reads no pod."""

        def outlook(nodes: Sequence[str]) -> EarlyStart:
            return EarlyStart(node_handovers(*self._work_on(set(nodes), state), now))

        return outlook

    def _work_on(self, nodes: set[str], state: AdmissionState) -> tuple[list[PodOnNode], dict[str, float]]:
        """Every pod holding room on these nodes (bound, or admitted and pinned, and the creates whose
        reply is on its way: state.assumed, under the plan caller's lock), read once per pod change
        by the usage index; and when each job with a pod there ends."""
        pods = self.stores.usage.pods_on(nodes, state.assumed)
        ends = {}
        for key in {p.job for p in pods if p.job is not None}:
            job = self.stores.jobs.get(key)
            if job is not None:
                ends[key] = self._work_end(job)
        return pods, ends

    def _work_end(self, job: dict[str, Any]) -> float:
        """When the job's work ends, as early start and the backfill trust it: the ETA of the newest
        progress a poll read (from when it was first read; status.progress carries no time, so an ETA
        read only there may be minutes old and would never run out), else, in a first attempt that
        never restarted (startTime stays from the first), spec.scheduling.expectedRunSeconds after
        status.startTime."""
        key, uid = object_key(job), str(job["metadata"].get("uid") or "")
        status = job.get("status") or {}
        stated = stated_end(job, parse_iso(status.get("startTime")))
        read = self.read_progress(key, uid)
        if read is None:
            return end_for_early_start(status, None, stated)
        return end_for_early_start({**status, "progress": read[0]}, read[1], stated)

    def admit_pods(self, patches: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Lifts the gates, several requests at a time: one request per pod, so a big burst of gangs
        would otherwise wait on round trips one by one. A crash half-way is finished by the next pass."""
        if not patches:
            return
        started = time.monotonic()

        def admit(patch: tuple[str, str, dict[str, Any]]) -> None:
            admitted = self.api.admit_pod(*patch)
            if admitted is not None:
                self.stores.pods.upsert(admitted)  # counted on its node by the very next pass
            failpoints.after_admit()

        if failpoints.counts_admits():
            for patch in patches:  # one by one: the failpoint counts them in order
                admit(patch)
        else:
            list(self.write_pool.map(admit, patches))
        log.info("admitted %d pod(s) in %.2fs", len(patches), time.monotonic() - started)
