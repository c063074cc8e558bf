"""The Controller: builds the parts of the work loop, wires them together, and starts and stops
their loops. It decides nothing itself; each part is one module of this package:

- stores.py: the watch-fed copies of jobs, pods and nodes (cache.py, reflector.py)
- watch.py: what a changed pod, node or job enqueues
- queue.py: the de-duplicating work queue, its workers, and the thread-safe hand-off to the loop
- reconciler.py: one reconcile of one job (decide, record, act); job_writes.py: status and events
- admission_at_creation.py, admission_pass.py, preemption.py: gang admission (provider builtin)
- progress.py: the HTTP client that copies the trainer's /progress into status
- generations.py: the HTTP client that tells kept pods their restart generation (restart in place)
- failpoints.py: the crash hooks the integration tests set
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from phalanx import metrics
from phalanx.controller.admission_at_creation import CreationAdmission
from phalanx.controller.admission_pass import AdmissionPass
from phalanx.controller.admission_state import AdmissionState
from phalanx.controller.generations import GenerationPublisher
from phalanx.controller.job_writes import JobWriter
from phalanx.controller.kueue_workloads import job_key_of_workload
from phalanx.controller.preemption import Preemptor
from phalanx.controller.progress import ProgressPoller
from phalanx.controller.queue import WorkQueue
from phalanx.controller.reconciler import Reconciler
from phalanx.controller.spare_yields import SpareYields
from phalanx.controller.stores import ClusterStores
from phalanx.controller.watch import WatchCallbacks
from phalanx.k8s import KubeApi
from phalanx.leader import LeaderElector
from phalanx.policy.resync import RESYNC_SECONDS, due_for_resync, resync_period
from phalanx.reflector import Reflector, per_namespace
from phalanx.settings import Clock, OperatorSettings

log = logging.getLogger("phalanx.controller")

RESYNC_TICK_SECONDS: Final = 1.0  # the resync's share of jobs is enqueued once a tick
# On shutdown, how long running reconciles and admission writes may take to finish (well within the
# pod's 30 s grace period); the lease is released only if they did.
DRAIN_SECONDS: Final = 10.0
# How often the Workloads left holding Kueue's finalizer are looked for (a job deleted while no
# operator ran: controller/kueue_workloads.py orphan_keys).
KUEUE_ORPHAN_SWEEP_SECONDS: Final = 60.0
WRITE_CONCURRENCY: Final = 8  # pod creations and gate lifts in flight at once


class Controller:
    def __init__(self, api: KubeApi, settings: OperatorSettings, workers: int = 8, clock: Clock = time.time,
                 leader: LeaderElector | None = None) -> None:  # fmt: skip
        self.api = api
        self.settings = settings
        self.leader = leader  # None: this process alone writes (leader election off)
        self.clock = clock  # every decision's "now": injectable for tests
        self.namespaces = list(settings.namespaces)
        self.workers = workers
        self.stores = ClusterStores()
        self.work = WorkQueue(retry_max_seconds=settings.retry_max_seconds)
        # Own threads per kind of work: asyncio's default pool (cores + 4) would let slow progress
        # polls of unreachable pods hold up reconciles and the admission pass.
        self.reconcile_pool = ThreadPoolExecutor(workers, thread_name_prefix="reconcile")
        self.write_pool = ThreadPoolExecutor(WRITE_CONCURRENCY, thread_name_prefix="writes")
        self.writer = JobWriter(api, self.stores, self.write_pool)
        self.progress = ProgressPoller(
            self.writer, self.work, settings.progress_status_seconds, settings.progress_url_template
        )
        self.generations = GenerationPublisher(self.work, cluster_domain=settings.cluster_domain)
        admission = AdmissionState()
        self.spare_yields = SpareYields()  # the admission pass asks, the spare's job's reconcile acts
        self.reconciler = Reconciler(
            api, self.stores, self.writer, self.work,
            CreationAdmission(self.stores, admission, enabled=settings.admit_on_creation), self.progress,
            self.write_pool, self.forget, clock, settings.node_lost_after_seconds, settings.cluster_domain,
            settings.allow_host_path_checkpoints, generations=self.generations, spare_yields=self.spare_yields,
        )  # fmt: skip
        preemptor = Preemptor(api, self.stores, admission, self.writer, self.work, clock, self.spare_yields)
        self.admission = AdmissionPass(
            api, self.stores, admission, self.writer, preemptor, self.work, self.write_pool, clock
        )
        # The ETA-aware backfill reads the newest ETA, not the one the write interval let through.
        self.admission.read_progress = self.progress.read_progress
        self.watch = WatchCallbacks(self.stores, self.work)
        self.reflectors: list[Reflector] = []
        self.workload_reflectors: list[Reflector] = []  # started once Kueue's API is served
        self.tasks: list[asyncio.Task[None]] = []

    # The event loop the queue hands off to; set before start() (handlers.configure).
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.work.loop

    @loop.setter
    def loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self.work.loop = loop

    @property
    def admission_dirty(self) -> asyncio.Event:
        return self.work.admission_dirty

    def stores_synced(self) -> bool:
        """Jobs, pods and nodes have each been listed once (readiness; a standby keeps them warm)."""
        return self.stores.synced()

    def job_event(self, key: str, body: Mapping[str, Any]) -> None:
        """kopf's event for a job (on the loop): reconcile unless only its status changed."""
        self.work.job_event(key, body)

    def reconcile(self, key: str) -> list[float]:
        return self.reconciler.reconcile(key)

    def forget(self, key: str, uid: str = "") -> None:
        """The job (of this uid; "" when not known) is gone: every part drops what it kept for it.
        Not when the store already holds another job under the name: a predecessor's delete event
        that came after its successor's (kopf's worker waits a moment, our watch does not) would
        otherwise drop the successor's timers, poll target, reservation and series."""
        current = self.stores.jobs.get(key) if uid else None
        if current is not None and current["metadata"].get("uid") not in (None, uid):
            return
        self.reconciler.known_jobs.discard(key)
        self.work.forget(key)
        self.progress.forget(key)
        self.generations.forget(key)
        self.admission.state.reservations.pop(key, None)
        self.reconciler.creation_admission.settle(key, forget=True)
        self.admission.preemptor.preempting.pop(key, None)
        self.spare_yields.forget(key)
        namespace, name = key.split("/", 1)
        metrics.forget_job(namespace, name, uid)

    async def start(self) -> None:
        stores, watch = self.stores, self.watch
        self.reflectors = [
            Reflector("pods", self.api.pods_request, stores.pods, watch.on_pod_change).start(),
            Reflector("nodes", self.api.nodes_request, stores.nodes, watch.on_node_change).start(),
            Reflector(
                "priorityclasses",
                self.api.priority_classes_request,
                stores.priority_classes,
                lambda *_: self.work.admission_dirty_threadsafe(),
            ).start(),  # a new class may let a job in
            *(
                reflector.start()
                for reflector in per_namespace(
                    "trainingjobs",
                    self.api.jobs_request,
                    stores.jobs,
                    [*self.namespaces],
                    watch.on_job_change,
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
        self.tasks.append(asyncio.create_task(self.admission.run(), name="admission"))
        self.tasks.append(asyncio.create_task(self._resync_loop(), name="resync"))
        self.tasks.append(asyncio.create_task(self._kueue_orphan_loop(), name="kueue-orphans"))
        self.tasks.append(asyncio.create_task(self.progress.run(), name="progress"))

    async def _worker(self) -> None:
        # Through self.reconcile, looked up per call: a test may stand in for it.
        await self.work.run_worker(lambda key: self.reconcile(key), self.reconcile_pool)

    async def _resync_loop(self) -> None:
        """Every job once per period (RESYNC_SECONDS, longer at thousands of jobs), a share of them
        each tick (policy/resync.py)."""
        tick = 0
        period = RESYNC_SECONDS
        while True:
            await asyncio.sleep(RESYNC_TICK_SECONDS)
            keys = list(self.reconciler.known_jobs)
            wanted = resync_period(len(keys), period)
            if wanted != period:
                period = wanted
                log.info("resync period %.0f s for %d jobs", period, len(keys))
            slots = round(period / RESYNC_TICK_SECONDS)
            tick += 1
            stored = self.stores.jobs.as_dict()  # one lock a tick, not one per job (4,000 a second)
            jobs = [(key, _uid(stored.get(key), key)) for key in keys]
            for key in due_for_resync(jobs, tick, slots):
                self.work.enqueue(key, resync=True)

    async def _kueue_orphan_loop(self) -> None:
        """At start, then every KUEUE_ORPHAN_SWEEP_SECONDS: the jobs of Workloads whose quota is
        still held for pods long gone are reconciled, which drops Kueue's finalizer."""
        loop = asyncio.get_running_loop()
        while True:
            if self.stores.jobs.synced.is_set():
                try:
                    keys = await loop.run_in_executor(
                        self.reconcile_pool,
                        self.reconciler.kueue.orphan_keys,
                        self.namespaces,
                        self._live_uid,
                    )
                except Exception:  # the next sweep tries again; nothing else depends on it
                    log.exception("looking for Workloads left holding Kueue's finalizer")
                    keys = []
                for key in keys:
                    self.work.enqueue(key)
                if self.reconciler.kueue.served and not self.workload_reflectors:
                    self._watch_workloads()
                await asyncio.sleep(KUEUE_ORPHAN_SWEEP_SECONDS)
            else:
                await asyncio.sleep(1.0)

    def _watch_workloads(self) -> None:
        """Kueue's Workloads are served (Kueue may be installed after the operator): watch ours, so
        that an admission or an eviction reaches its job's reconcile at once."""
        self.workload_reflectors = [
            reflector.start()
            for reflector in per_namespace(
                "workloads", self.api.workloads_request, self.reconciler.kueue.watched, [*self.namespaces],
                self._on_workload_change,
            )
        ]  # fmt: skip
        self.reflectors.extend(self.workload_reflectors)
        log.info("watching Kueue Workloads")

    def _on_workload_change(
        self, key: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        job = job_key_of_workload(new or old or {})
        if job is not None:
            self.work.enqueue_threadsafe(job)

    def _live_uid(self, key: str) -> str | None:
        job = self.stores.jobs.get(key)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return None
        return str(job["metadata"].get("uid") or "") or None

    async def stop(self, drain_seconds: float = DRAIN_SECONDS) -> bool:
        """Stops the loops and waits up to `drain_seconds` for the writer threads to finish what they
        run; True once none is left (so no write of this process can still reach the API server)."""
        for reflector in self.reflectors:
            reflector.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        pools = (self.write_pool, self.reconcile_pool, self.progress.pool, self.admission.pool,
                 self.admission.messages.pool, self.generations.pool)  # fmt: skip

        def drain() -> None:
            for pool in pools:
                pool.shutdown(wait=True, cancel_futures=True)

        drainer = threading.Thread(target=drain, name="drain", daemon=True)
        drainer.start()
        await asyncio.to_thread(drainer.join, drain_seconds)
        return not drainer.is_alive()


def _uid(job: Mapping[str, Any] | None, key: str) -> str:
    """The job's uid (its resync slot's seed), or its key while the store does not hold it yet."""
    return str((job or {}).get("metadata", {}).get("uid") or key)
