"""One reconcile of one TrainingJob (I/O side; the decision is reconcile/lifecycle.py): read the
job and its pods from the stores, ask decide(), then record the decision in status and act on it.

Level-triggered: every reconcile reads the job and its pods as they are now, so a lost or repeated
event changes nothing. Decide, record, then act: a deletion is explained in status before it is
made, and only if the job is still the version decided on.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from phalanx import metrics
from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.names import spare_pod_name
from phalanx.builders.podgroups import build_podgroup
from phalanx.builders.pods import JobRef, build_headless_service, build_spare_pod, build_worker_pod
from phalanx.cache import object_key
from phalanx.constants import LABEL_REPLICA_INDEX, LABEL_SPARE
from phalanx.controller import failpoints
from phalanx.controller.admission_at_creation import CreationAdmission
from phalanx.controller.generations import GenerationPublisher
from phalanx.controller.job_writes import JobWriter, status_diff
from phalanx.controller.kueue_workloads import PENDING_WRITE_RETRY_SECONDS, KueueWorkloads
from phalanx.controller.progress import ProgressPoller
from phalanx.controller.queue import WorkQueue
from phalanx.controller.spare_yields import SpareYields
from phalanx.controller.stores import ClusterStores
from phalanx.k8s import CreationRefused, KubeApi, StatusConflict
from phalanx.kueue.gate import KueueGate
from phalanx.kueue.placement import PlacementUnavailable, placed_pod
from phalanx.kueue.workload import managed_here, queue_name
from phalanx.pod_facts import attempt_replicas, attempt_spec, in_current_attempt, is_owned_by
from phalanx.policy import bad_nodes
from phalanx.policy.host_path import REASON_HOST_PATH_NOT_ALLOWED, host_path_refusal
from phalanx.policy.progress_writes import decided_on, settle_progress
from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import FINISHED_PHASES, Event, Plan, iso, merged_events
from phalanx.reconcile.rules.creation import creation_refused, name_conflict, spec_refused
from phalanx.reconcile.rules.elastic import room_needed
from phalanx.reconcile.rules.spares import spares_refused

# Status fields no decision reads: a write that changed only these needs no second look. Not
# lastCheckpoint: an elastic gang's growth reads it (rules/elastic.py).
BOOKKEEPING_FIELDS: Final = ("goodput", "lastRecovery", "progress")
NAME_CONFLICT_RETRY_SECONDS: Final = 10.0
CREATE_REFUSED_RETRY_SECONDS: Final = 5.0
KUEUE_RELEASE_RETRY_SECONDS: Final = 2.0


@dataclass(frozen=True)
class CreateOutcome:
    """What became of one pod creation."""

    pod: str
    taken: bool = False  # another owner's pod holds the name
    refused: str | None = None  # the API server's message when it refused the pod


class Reconciler:
    def __init__(self, api: KubeApi, stores: ClusterStores, writer: JobWriter, work: WorkQueue,
                 creation_admission: CreationAdmission, progress: ProgressPoller,
                 write_pool: ThreadPoolExecutor, forget: Callable[[str, str], None], clock: Callable[[], float],
                 node_lost_after: float, cluster_domain: str,
                 allow_host_path_checkpoints: bool = False,
                 generations: GenerationPublisher | None = None,
                 kueue: KueueWorkloads | None = None, spare_yields: SpareYields | None = None) -> None:  # fmt: skip
        self.spare_yields = spare_yields if spare_yields is not None else SpareYields()
        self.api = api
        self.stores = stores
        self.writer = writer
        self.work = work
        self.creation_admission = creation_admission
        self.progress = progress
        self.write_pool = write_pool
        self.forget = forget  # the controller's: every part drops what it kept for the key
        self.clock = clock
        self.node_lost_after = node_lost_after
        self.cluster_domain = cluster_domain
        self.allow_host_path_checkpoints = allow_host_path_checkpoints  # policy/host_path.py
        self.known_jobs: set[str] = set()  # resynced now and then; finished jobs leave it
        # Tells an in-place attempt's kept pods their restart generation (controller/generations.py).
        self.generations = generations if generations is not None else GenerationPublisher(work)
        # The Workloads of jobs in a Kueue queue (controller/kueue_workloads.py).
        self.kueue = kueue if kueue is not None else KueueWorkloads(api, cluster_domain)

    def reconcile(self, key: str) -> list[float]:
        """One level-triggered pass; returns the delays after which to look at this job again."""
        namespace, name = key.split("/", 1)
        stores, writer = self.stores, self.writer
        followups: list[float] = []
        # The watch-fed copy once listed: our own writes reach it from the API's replies, so it is
        # never older than what this operator wrote (one GET per reconcile saved).
        job = stores.jobs.get(key) if stores.jobs.synced.is_set() else None
        if job is None:  # not listed yet, or kopf's event came before our watch's: ask the API
            job = self.api.get_job(namespace, name)
            if job is not None:
                stores.jobs.upsert(job)
        if job is None or job["metadata"].get("deletionTimestamp") or not managed_here(job):
            # Not managed here: spec.managedBy names another controller (MultiKueue's contract).
            if self._kueue_quota_held(key, None):
                return [KUEUE_RELEASE_RETRY_SECONDS]  # its pods still stop; their events bring it back too
            self.forget(key, str((job or {}).get("metadata", {}).get("uid") or ""))
            self.kueue.forget(key)
            return followups
        if key in self.kueue.pending_release and self._kueue_quota_held(key, job["metadata"]["uid"]):
            followups.append(KUEUE_RELEASE_RETRY_SECONDS)  # a Workload of its predecessor of that name
        self.known_jobs.add(key)
        metrics.observe_job_alive(namespace, name, job["metadata"]["uid"])
        # From the watch-fed store once it is listed (a reconcile per pod event would otherwise list
        # the job's pods each time); pods another controller owns are not ours despite our label.
        listed = (
            stores.pods.indexed(key)
            if stores.pods.synced.is_set()
            else self.api.list_job_pods(namespace, name)
        )
        pods = [p for p in listed if is_owned_by(p, job["metadata"]["uid"])]
        now = self.clock()
        old_status = dict(job.get("status") or {})
        if not old_status:
            metrics.observe_job_created(namespace, name)
        nodes = stores.current_nodes()
        spec = parse(TrainingJobSpec, job["spec"])
        # A job in a Kueue queue is admitted by Kueue, through its Workload; never by the built-in pass.
        queue = queue_name(job)
        gate = self.kueue.gate(key, job, spec, queue) if queue else None
        # Decided on the newest progress the poller held back; written with any other change, or
        # once its interval has passed, together with the goodput booking (policy/progress_writes.py).
        held = self.progress.held_back(key, job["metadata"]["uid"])
        due = self.progress.sample_due(key, job["metadata"]["uid"])
        plan = self._decide({**job, "status": decided_on(old_status, held)}, pods, nodes, now, gate, due)
        settle_progress(old_status, plan.status, held, due)
        ref = JobRef.of(job)
        # As the attempt runs it: an elastic gang's pods are built for the size it was given.
        spec = attempt_spec(parse(TrainingJobSpec, job["spec"]), plan.status)

        # Decide, record, then act: a deletion is explained in status before it is made, and only if
        # the job is still the version decided on. Otherwise a lost write would leave the next pass
        # reading the operator's own deletions as someone else's (a preemption, not the failure it was).
        # An elastic attempt's size is recorded before its first pod is created, for the same reason:
        # a pass that saw neither the size nor the pods would choose again (pods of two sizes).
        recorded = old_status
        grows = plan.grow is not None
        # A spare relabelled as the rank it takes: only once the status that gives it the rank is stored.
        deleting = (
            plan.delete_pods or plan.force_delete_pods or plan.delete_unchanged_pods or plan.relabel_pods
        )
        # A spare created apart from the gang is said (SpareReplaced) before it is made: once made, no
        # later pass would say it again, and the final write may lose to the progress poller's.
        spare_apart = bool(plan.create_spares) and not plan.create_indices
        if deleting or grows or spare_apart or _size_unrecorded(job, old_status, plan):
            try:
                stored = writer.write_status(key, job, old_status, plan.status)
            except StatusConflict:
                self.creation_admission.settle(key)  # nothing was done: decided again on the new version
                return writer.refreshed(key)
            if stored is None:
                self.forget(key, job["metadata"]["uid"])
                return followups
            self._claim_grow(key, job, pods, plan, now)  # only once stored: a conflict decides again
            # Told now: should a deletion below fail, the next pass starts from this status and
            # would see no transition left to report.
            metrics.observe_status(namespace, name, old_status, plan.status)
            for event in plan.events:
                writer.record_event(job, event.type, event.reason, event.message, iso(now))
            failpoints.after_decision_write(old_status, plan.status)
            job, recorded, plan.events = stored, copy.deepcopy(plan.status), []

        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
        grace = spec.run_policy.termination_grace_period_seconds
        for pod_name in plan.force_delete_pods:
            self.api.delete_pod(namespace, pod_name, uids.get(pod_name), 0)
        for pod_name in plan.delete_pods:
            if pod_name not in plan.force_delete_pods:
                self.api.delete_pod(namespace, pod_name, uids.get(pod_name), grace)
        versions = {p["metadata"]["name"]: p["metadata"].get("resourceVersion") for p in pods}
        for pod_name in plan.delete_unchanged_pods:
            self.api.delete_pod(namespace, pod_name, uids.get(pod_name), 0, versions.get(pod_name))
        self._relabel(namespace, pods, plan)
        creates = plan.create_indices or plan.create_spares
        refusal = host_path_refusal(spec, self.allow_host_path_checkpoints) if creates else None
        if refusal is not None:  # nothing is created; a restart with the flag, or a new job, moves on
            plan.create_indices, plan.create_spares, plan.events = [], [], []
            self.creation_admission.settle(key)
            self._record(job, spec_refused(job, plan.status, REASON_HOST_PATH_NOT_ALLOWED, refusal, now), now)
        if plan.create_indices or plan.create_spares:
            outcomes = self._create_gang(key, job, ref, spec, plan, now, gate)
            taken = [o.pod for o in outcomes if o.taken]
            spare_names = {spare_pod_name(ref.name, n) for n in plan.create_spares}
            # A refused spare (a quota sized for the workers) is said in status.spares and retried
            # after a backoff; it never says the workers' pods are refused (PodsCreated).
            spare_refusals = [
                str(o.refused) for o in outcomes if o.refused is not None and o.pod in spare_names
            ]
            if spare_refusals:
                self._record(
                    job, spares_refused(job.get("status") or {}, plan.status, spare_refusals, now), now
                )
            refused = [o for o in outcomes if o.refused is not None and o.pod not in spare_names]
            # Said in the status about to be written (reconcile/rules/creation.py), and once in an Event.
            if taken:
                self._record(job, name_conflict(job, plan.status, taken, now), now)
                followups.append(NAME_CONFLICT_RETRY_SECONDS)
            elif refused:
                refusals = [str(o.refused) for o in refused]
                self._record(job, creation_refused(job, plan.status, refusals, spec.replicas, now), now)
                followups.append(CREATE_REFUSED_RETRY_SECONDS)
            elif stores.pods.synced.is_set():
                # The pods exist now (the store holds the API's replies): decide once more on them,
                # so one status write says what this reconcile and the next would have written
                # (all pods created; admitted, when admitted at creation).
                pods = [p for p in stores.pods.indexed(key) if is_owned_by(p, job["metadata"]["uid"])]
                then = self._decide({**job, "status": plan.status}, pods, nodes, now, gate)
                if not (then.create_indices or then.create_spares or then.delete_pods or then.force_delete_pods
                        or then.delete_unchanged_pods or then.relabel_pods or then.delete_job):  # fmt: skip
                    then.events = merged_events([*plan.events, *then.events])
                    plan = then
            if not taken and not refused and not spare_refusals:
                followups.append(0.5)

        hang_timeout = ((job.get("spec") or {}).get("runPolicy") or {}).get("hangTimeoutSeconds")
        self.progress.track(key, job["metadata"]["uid"], pods, plan.status, hang_timeout)
        if plan.status.get("phase") in FINISHED_PHASES:
            self.known_jobs.discard(key)  # nothing left to resync; TTL rides on recheck_after
        try:
            writer.write_status(key, job, recorded, plan.status)
        except StatusConflict:
            return writer.refreshed(key)  # what was done is read back from the pods next time
        self.progress.written_with_status(key, job["metadata"]["uid"], plan.status.get("progress"))
        if status_diff(_decided_on(old_status), _decided_on(plan.status)):
            # Decide once more on what was just written (a finished job's TTL, say, is timed from
            # the completionTime this write set): the job's own status events no longer enqueue it.
            followups.append(0.0)
        if gate is not None:  # what Kueue expects from the Workload's owner: PodsReady, Finished, quota back
            if self.kueue.report(key, gate, plan.status, pods, nodes, now, self.node_lost_after):
                followups.append(PENDING_WRITE_RETRY_SECONDS)
        # Only once the status that keeps them is stored: a launcher never starts a generation the
        # job's status does not know.
        self.generations.publish(key, job["metadata"]["uid"], pods, plan.status)
        metrics.observe_status(namespace, name, recorded, plan.status)
        for event in plan.events:
            writer.record_event(job, event.type, event.reason, event.message, iso(now))
        if plan.delete_job:
            self.api.delete_job(namespace, name, job["metadata"]["uid"])
            self.forget(key, job["metadata"]["uid"])
            return followups
        if plan.recheck_after is not None:
            followups.append(plan.recheck_after)
        if plan.delete_pods or plan.force_delete_pods or plan.delete_unchanged_pods:
            followups.append(1.0)
        return followups

    def _kueue_quota_held(self, key: str, live_uid: str | None) -> bool:
        """A Workload nothing runs against any more still holds Kueue's finalizer, as pods of its
        job still stop (controller/kueue_workloads.py release_orphans)."""
        if not self.kueue.may_hold_quota(key):
            return False
        namespace, name = key.split("/", 1)
        pods = (
            self.stores.pods.indexed(key)
            if self.stores.pods.synced.is_set()
            else self.api.list_job_pods(namespace, name)
        )
        return self.kueue.release_orphans(
            key, live_uid, pods, self.stores.current_nodes(), self.clock(), self.node_lost_after
        )

    def _decide(
        self,
        job: dict[str, Any],
        pods: list[dict[str, Any]],
        nodes: dict[str, dict[str, Any]],
        now: float,
        gate: KueueGate | None = None,
        status_write_due: bool = False,
    ) -> Plan:
        """decide(), with what rank 0 of this very job (its uid) last reported in /progress."""
        key = object_key(job)
        reported = self.progress.trainer_reports.get(key)
        uid = job["metadata"].get("uid")
        report = reported[1] if reported is not None and reported[0] == uid else None
        attempt = int((job.get("status") or {}).get("attempt") or 0)
        refusals = self.generations.refusals(key, str(uid), attempt)
        probe = self._room_probe(job, pods, now)
        # Held for this decision (hold=True): a decision for another gang meanwhile cannot be given
        # the same room (admission_at_creation.py, claims).
        room = (
            None
            if probe is None
            else self.creation_admission.room_for(key, probe, probe_most(job, pods), now, hold=True)
        )
        plan = decide(job, pods, nodes, now, self.node_lost_after, trainer_report=report,
                      launcher_refusals=refusals, room=room, kueue_gate=gate,
                      status_write_due=status_write_due, yielding_spares=self.spare_yields.of(key))  # fmt: skip
        phase = plan.status.get("phase")
        self.creation_admission.end_grow(
            key, int(plan.status.get("attempt") or 0), phase not in (*FINISHED_PHASES, "Suspended")
        )
        if probe is not None and plan.grow is None and not plan.create_indices:
            # Decided without taking the room (a grow claims it once its status is stored, _claim_grow;
            # _create_gang claims the new attempt's)
            self.creation_admission.settle(key)
        return plan

    def _claim_grow(
        self, key: str, job: dict[str, Any], pods: list[dict[str, Any]], plan: Plan, now: float
    ) -> None:
        """The grow decided on is stored: its room is the gang's until its new attempt's pods are
        created; its old pods still on their nodes hold those (counted as used), not the claim."""
        if plan.grow is None:
            return
        namespace = key.split("/", 1)[0]
        holding = [
            f"{namespace}/{p['metadata']['name']}" for p in pods if (p.get("spec") or {}).get("nodeName")
        ]
        self.creation_admission.claim(key, self._probe_spec(job, now), plan.grow[0], plan.grow[1], (), now,
                                      grown_attempt=int(plan.status["attempt"]), holding=holding)  # fmt: skip

    def _room_probe(
        self, job: dict[str, Any], pods: list[dict[str, Any]], now: float
    ) -> dict[str, Any] | None:
        """spec.elastic, and a decision that needs the room (sizing a new attempt, a grow check;
        rules/elastic.room_needed): the pod spec to measure it by. None: the room is not read."""
        if not room_needed(job, pods):
            return None
        return self._probe_spec(job, now)

    def _probe_spec(self, job: dict[str, Any], now: float) -> dict[str, Any]:
        """The pod spec of one pod of the job's attempt, as the room is measured by."""
        written = parse(TrainingJobSpec, job["spec"])
        status = job.get("status") or {}
        probe = build_worker_pod(
            JobRef.of(job), written, 0, int(status.get("attempt") or 0), job["spec"].get("template") or {},
            cluster_domain=self.cluster_domain, avoid_nodes=bad_nodes.avoided(status.get("badNodes"), now),
        )  # fmt: skip
        spec: dict[str, Any] = probe["spec"]
        return spec

    def _create_gang(
        self,
        key: str,
        job: dict[str, Any],
        ref: JobRef,
        spec: TrainingJobSpec,
        plan: Plan,
        now: float,
        gate: KueueGate | None = None,
    ) -> list[CreateOutcome]:
        """Creates the Service, the PodGroup (external schedulers) and the missing pods of the
        attempt; says, per pod, whether another owner's pod holds its name or the API refused it."""
        try:  # admitted by Kueue: on its flavors' nodes; none goes out while they cannot be resolved
            placement = self.kueue.placement(gate) if gate is not None else None
        except PlacementUnavailable as why:
            return [CreateOutcome("worker pods", refused=f"not created: {why}")]
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
                control_token=secrets.token_urlsafe(32),
            )
            for index in plan.create_indices
        ]
        workers = len(pods_to_create)
        # Warm spares (spec.spares), with the workers: admitted with them at creation or by the pass.
        pods_to_create += [
            build_spare_pod(
                ref,
                spec,
                number,
                attempt,
                template,
                cluster_domain=self.cluster_domain,
                attempt_in_name=plan.attempt_in_names,
                avoid_nodes=plan.avoid_nodes,
                control_token=secrets.token_urlsafe(32),
            )
            for number in plan.create_spares
        ]
        if spec.elastic is not None and pods_to_create:  # the room it was sized into, until its pods hold it
            self.creation_admission.claim(key, pods_to_create[0]["spec"], len(pods_to_create), len(pods_to_create),
                                          [f"{ref.namespace}/{p['metadata']['name']}" for p in pods_to_create], now)  # fmt: skip
        if placement is not None:  # admitted by Kueue: ungated, the scheduler places them
            pods_to_create = [placed_pod(pod, placement) for pod in pods_to_create]
        elif workers == spec.replicas:
            pods_to_create = self.creation_admission.admit(key, spec, pods_to_create, now)
        try:
            outcomes = self._create_pods(pods_to_create, ref.uid)
        finally:
            self.creation_admission.release(ref.namespace, pods_to_create)
        not_created = [o.pod.removeprefix("pod ") for o in outcomes if o.taken or o.refused is not None]
        if not_created:  # no room is kept for pods that will not come
            self.creation_admission.unclaim(key, [f"{ref.namespace}/{n}" for n in not_created])
        self.work.admission_dirty_threadsafe()
        return outcomes

    def _relabel(self, namespace: str, pods: list[dict[str, Any]], plan: Plan) -> None:
        """Spares told to take a rank become that rank's worker by their labels (the status that gives
        it them is stored): everything that indexes pods by rank finds them there."""
        by_name = {p["metadata"]["name"]: p for p in pods}
        for name, rank in plan.relabel_pods.items():
            pod = by_name.get(name)
            if pod is None:
                continue
            labels = pod["metadata"].get("labels") or {}
            remove = (LABEL_SPARE,) if LABEL_SPARE in labels else ()
            relabelled = self.api.relabel_pod(
                namespace, name, str(pod["metadata"].get("uid")), {LABEL_REPLICA_INDEX: str(rank)}, remove
            )
            if relabelled is not None:
                self.stores.pods.upsert(relabelled)

    def _create_pods(self, pods: list[dict[str, Any]], owner_uid: str) -> list[CreateOutcome]:
        """Creates the pods a few at a time (a 32-pod gang one by one waits on 32 round trips)."""

        def create(pod: dict[str, Any]) -> CreateOutcome:
            meta = pod["metadata"]
            try:
                created = self.api.create_if_absent(pod)
            except CreationRefused as refusal:
                return CreateOutcome(meta["name"], refused=refusal.message)
            if created is not None:
                self.stores.pods.upsert(created)
                metrics.observe_pods_created()
                failpoints.after_pod_create()
                return CreateOutcome(meta["name"])
            held = self.api.read_like(pod)  # None: gone meanwhile, created on the next pass
            return CreateOutcome(
                f"pod {meta['name']}", taken=held is not None and not is_owned_by(held, owner_uid)
            )

        if failpoints.counts_pod_creations() or len(pods) < 2:
            return [create(pod) for pod in pods]  # one by one: the failpoint counts them in order
        return list(self.write_pool.map(create, pods))

    def _record(self, job: dict[str, Any], event: Event | None, now: float) -> None:
        if event is not None:
            self.writer.record_event(job, event.type, event.reason, event.message, iso(now))


def probe_most(job: dict[str, Any], pods: list[dict[str, Any]]) -> int:
    """The most pods an elastic gang's room is measured up to: maxReplicas less the pods of its
    attempt (the room counts pods beyond those it holds; a new attempt to size has none)."""
    written = parse(TrainingJobSpec, job["spec"])
    status = job.get("status") or {}
    if not any(in_current_attempt(p, status) for p in pods):
        return written.replicas
    return max(0, written.replicas - attempt_replicas(written, status, pods))


def _size_unrecorded(job: dict[str, Any], old_status: dict[str, Any], plan: Plan) -> bool:
    """The plan creates pods of an elastic attempt whose size the stored status does not hold yet."""
    if not plan.create_indices or not (job.get("spec") or {}).get("elastic"):
        return False
    return any(plan.status.get(f) != old_status.get(f) for f in ("currentReplicas", "sizedAttempt"))


def _decided_on(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k not in BOOKKEEPING_FIELDS}
