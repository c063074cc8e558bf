"""Priority preemption (I/O side; the choice is gang/preemption.py): mark the victims Preempted,
then evict their pods with their grace period."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.cache import object_key
from phalanx.controller.admission_state import AdmissionState
from phalanx.controller.job_writes import JobWriter
from phalanx.controller.queue import WorkQueue
from phalanx.controller.spare_yields import SpareYields
from phalanx.controller.stores import ClusterStores
from phalanx.gang.admission import GangRequest
from phalanx.gang.capacity import NodeInfo
from phalanx.gang.preemption import choose_victims, preemption_message
from phalanx.gang.requests import idle_spares, running_gang
from phalanx.k8s import KubeApi, StatusConflict
from phalanx.kueue.workload import managed_here, queue_name
from phalanx.reconcile.conditions import set_condition
from phalanx.reconcile.plan import REASON_PREEMPTED_BY_PRIORITY, iso, parse_iso

log = logging.getLogger("phalanx.controller")

PREEMPTION_COOLDOWN_SECONDS: Final = 15.0
# A chosen victim had moved on (gone, restarted, finished) before it was stopped: the stores catch up
# before the next choice, instead of the next pass (50 ms later, policy/admission_pacing.py)
# choosing it again from the same stale view and writing and reading it once more.
CHOOSE_AGAIN_SECONDS: Final = 1.0
VICTIM_WRITE_ATTEMPTS: Final = 3


class Preemptor:
    def __init__(self, api: KubeApi, stores: ClusterStores, state: AdmissionState, writer: JobWriter,
                 work: WorkQueue, clock: Callable[[], float], yields: SpareYields | None = None) -> None:  # fmt: skip
        self.yields = yields if yields is not None else SpareYields()
        self.api = api
        self.stores = stores
        self.state = state
        self.writer = writer
        self.work = work
        self.clock = clock
        self.preempting: dict[str, float] = {}  # victim key -> when (monotonic) it was stopped
        self.choose_again_at = 0.0  # monotonic: no choice before (CHOOSE_AGAIN_SECONDS)

    def preempt_for(
        self,
        head: GangRequest,
        jobs: list[dict[str, Any]],
        nodes: Sequence[NodeInfo],
        used: dict[str, dict[str, int]],
    ) -> None:
        """Priority preemption through admission: stop the fewest lower-priority gangs the head needs.

        The victims' pods get their grace period (SIGTERM: the trainer checkpoints); the victim job
        sees its pods deleted by someone else, restarts as a preemption, and waits for capacity.
        """
        now = time.monotonic()
        # A new dict, not edited in place: forget() drops a deleted job from another thread. Victims
        # past the cooldown leave it (a victim that runs again is never forgotten).
        self.preempting = {
            k: at for k, at in list(self.preempting.items()) if now - at < PREEMPTION_COOLDOWN_SECONDS
        }
        if self.preempting:
            return  # let the last victims finish terminating before choosing again
        if now < self.choose_again_at:
            return
        running = []
        spare_uids: dict[tuple[str, str], str] = {}  # (job key, pod name) -> uid
        for job in jobs:
            key = object_key(job)
            if key == head.key or queue_name(job) or not managed_here(job):
                continue  # Kueue's jobs hold Kueue's quota: only Kueue preempts them
            started = parse_iso((job.get("status") or {}).get("admittedTime")) or 0.0
            own = self.stores.own_pods(job)
            gang = running_gang(key, job, own, self.state.priority_of, started)
            if gang is not None:
                running.append(gang)
            # Asked already and not deleted yet: still candidates, so the same ones are chosen again
            # rather than a gang in their place.
            spares = idle_spares(key, job, own, self.state.priority_of, started)
            running.extend(spares)
            if spares:
                spare_uids.update(
                    {(key, str(p["metadata"]["name"])): str(p["metadata"].get("uid")) for p in own}
                )
        # One victim per need: the room the last victims' terminating pods will free counts as free.
        choice = choose_victims(head, running, nodes, used, freeing=self.stores.usage.freeing())
        if choice is None:
            return
        if choice.spares:
            # Their own jobs' reconciles delete them (never one a takeover gave a rank meanwhile);
            # gangs, if the head needs more, on a later pass, with the spares' room counted as freed.
            why = f"gave its room to {head.key} (priority {head.priority}), waiting for it"
            for key, pod_name in choice.spares:
                if self.yields.ask(key, spare_uids[(key, pod_name)], why):
                    log.info("asking %s's idle spare %s to give its room to %s", key, pod_name, head.key)
                self.work.enqueue_threadsafe(key)
            return
        for victim in choice.victims:
            log.info("preempting %s for higher-priority %s", victim, head.key)
            job = next(j for j in jobs if object_key(j) == victim)
            if self.stop_victim(job, preemption_message(head.key, head.priority)):
                self.preempting[victim] = now  # the cooldown starts once its pods are told to stop
            else:  # from now: stop_victim may have spent a while reading the job again
                self.choose_again_at = time.monotonic() + CHOOSE_AGAIN_SECONDS
            self.work.enqueue_threadsafe(victim)

    def stop_victim(self, job: dict[str, Any], message: str) -> bool:
        """Says on the victim who preempted it (a Preempted condition, then an event), then evicts its
        pods with their grace period: the pods carry DisruptionTarget, the trainer checkpoints on
        SIGTERM, and the victim's reconcile restarts it as a preemption. False when the victim is no
        longer the job the pass chose (gone, re-created, restarted or finished meanwhile)."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        key = object_key(job)
        now_iso = iso(self.clock())
        for _ in range(VICTIM_WRITE_ATTEMPTS):
            conditions = set_condition((job.get("status") or {}).get("conditions") or [], "Preempted", "True",
                                       REASON_PREEMPTED_BY_PRIORITY, message, now_iso, job["metadata"].get("generation"))  # fmt: skip
            try:
                if self.writer.write_status(key, job, {}, {"conditions": conditions}) is None:
                    return False  # gone
                break
            except StatusConflict:
                # A running job's status is written on its own (a progress sample with the goodput
                # booking about every 40 s, a new checkpoint at once): a version that moved on is no
                # reason to give up, as long as it is still the same attempt of the same job, running.
                fresh = self.api.get_job(namespace, name)
                if fresh is None:
                    return False
                self.stores.jobs.upsert(fresh)
                if not _same_running_attempt(job, fresh):
                    return False  # the next pass decides again on what the job is now
                job = fresh
        else:
            return False
        self.writer.record_event(job, "Warning", REASON_PREEMPTED_BY_PRIORITY, message, now_iso)
        grace = parse(TrainingJobSpec, job["spec"]).run_policy.termination_grace_period_seconds
        for pod in self.stores.own_pods(job):
            if not self.api.evict_pod(namespace, pod["metadata"]["name"], pod["metadata"]["uid"], grace):
                log.warning(
                    "eviction of %s/%s refused by a PodDisruptionBudget", namespace, pod["metadata"]["name"]
                )
        return True


def _same_running_attempt(chosen: dict[str, Any], fresh: dict[str, Any]) -> bool:
    before, now = chosen.get("status") or {}, fresh.get("status") or {}
    return (
        fresh["metadata"].get("uid") == chosen["metadata"].get("uid")
        and now.get("attempt") == before.get("attempt")
        and now.get("phase") in ("Running", "Admitted")
    )
