"""The TrainingJob state machine (pure): given the job, its pods and the nodes, what to do next.

One decision per call; the I/O layer (controller/reconciler.py) applies it and calls again on the
next event. Every step is idempotent: pod names are deterministic, and an attempt's pods are only
created while none of an older attempt remain (they share names).

Phases: Pending (waiting for admission or backoff) -> Admitted (pods ungated, not all running) ->
Running -> Succeeded | Failed; Restarting between attempts; Suspended while spec.runPolicy.suspend.

decide() is the list of rules below, one module each under reconcile/rules/, applied in order until
one completes the decision. The order is the policy: a finished job is never suspended, a deadline
beats a restart, nothing is created while the previous attempt's pods stop, and a verdict on the
pods (success, failure, preemption) comes before admission and gang timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.kueue.gate import KueueGate
from phalanx.pod_facts import attempt_spec
from phalanx.policy.elastic import Room
from phalanx.policy.node_loss import DEFAULT_NODE_LOST_AFTER_SECONDS
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import Plan, PlanBuilder, parse_iso
from phalanx.reconcile.rules import (
    admission,
    backoff,
    bad_nodes,
    creation,
    deadline,
    elastic,
    failure,
    gang_timeout,
    goodput,
    hang,
    housekeeping,
    in_place,
    kueue,
    node_loss,
    preemption,
    recovery,
    restart,
    resume,
    running,
    spares,
    straggler,
    stranded,
    success,
    suspend,
    ttl,
)

Rule = Callable[[PlanBuilder, Observed], bool]

STEPS: Final[tuple[Rule, ...]] = (
    housekeeping.apply,  # always: older attempts' pods go, pods on vanished nodes go at once, counters
    ttl.apply,  # finished: stop a failed job's pods; delete the job once its TTL is up
    suspend.apply,  # spec.runPolicy.suspend: delete the attempt's pods, keep the status
    resume.apply,  # no longer suspended: a fresh attempt, the deadline's clock reset
    kueue.apply,  # in a Kueue queue: no pods until its Workload is admitted; evicted: stop, count a preemption
    deadline.apply,  # activeDeadlineSeconds passed since startTime: fail
    backoff.apply,  # after a gang timeout: wait in Pending until requeueAfter
    in_place.fallback,  # restarting in place and a launcher refused, or no replacement ran in time: full restart
    restart.apply,  # between attempts: wait for the previous attempt's pods to stop
    elastic.mixed_sizes,  # the attempt's pods were built for different sizes: restart, uncounted
    creation.avoidance_lifted,  # gated pods built to avoid a node that needs no avoiding now: rebuilt
    creation.apply,  # create the missing pods (tear down a gang the API refused in part too long)
    node_loss.apply,  # a node going silent: look again the moment it counts as lost
    success.apply,  # every worker exited 0: Succeeded
    in_place.apply,  # restartStrategy InPlace: keep the running pods, replace the lost (or say why not)
    elastic.unusable_size,  # spec.elastic: the trainer cannot split this size (exit 78): skipped, restart
    failure.apply,  # a worker failed: Failed, or a restart while backoffLimit allows
    preemption.apply,  # a worker was preempted: restart, the failure budget untouched
    stranded.apply,  # admitted onto a node that is lost, gone, cordoned or going: tear down, queue again
    hang.apply,  # every worker runs, yet rank 0 reports no new step within the bound: restart (Hang)
    elastic.grow,  # spec.elastic, running below its size, a checkpoint since admission, room: restart (Resize)
    admission.apply,  # a pod still gated: wait for admission; otherwise Admitted
    running.apply,  # every replica runs: Running
    gang_timeout.after_admission,  # admitted, not running whole within the timeout: tear down, requeue
    admission.starting,  # still starting: say how many run, and what the scheduler says
)

# Then, whichever rule decided, the bookkeeping every decision gets:
AFTER_EVERY_DECISION: Final[tuple[Rule, ...]] = (
    spares.apply,  # status.spares: spec.spares kept standing by while active (created with the gang), none after
    bad_nodes.apply,  # status.badNodes: a restart the infrastructure caused, booked against its node
    recovery.apply,  # status.lastRecovery: this pass's and the trainer's times; Recovered once complete
    goodput.apply,  # status.goodput: book the time since the last pass (after recovery: it reads it)
    straggler.apply,  # status.stragglers and the Straggler condition, from rank 0's report
    success.progress_done,  # a succeeded job's progress reads 100%
)


def decide(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    nodes: dict[str, dict[str, Any]],
    now: float,
    node_lost_after: float = DEFAULT_NODE_LOST_AFTER_SECONDS,
    trainer_report: Mapping[str, Any] | None = None,
    launcher_refusals: Mapping[str, str] | None = None,
    kueue_gate: KueueGate | None = None,
    room: Room | None = None,
    status_write_due: bool = False,
    yielding_spares: Mapping[str, str] | None = None,
) -> Plan:
    """node_lost_after: seconds a node may be not Ready before its pods count as lost;
    trainer_report: what rank 0 of this job (this uid) last reported in /progress, if anything;
    launcher_refusals: kept pods of the current in-place attempt whose launcher refused its
    generation or could not be reached (pod name -> why); room: for an elastic job, the free room
    for more of its pods and whether other gangs wait (policy/elastic.py; None: not known);
    kueue_gate: what Kueue says of the job's Workload, for a job in a Kueue queue (kueue/gate.py);
    status_write_due: the status is written now anyway (the progress sample is due), so the goodput
    booking goes with it; yielding_spares: its spares asked to give their room to a waiting gang
    (pod name -> why, controller/spare_yields.py)."""
    b = PlanBuilder(job, now)
    written = parse(TrainingJobSpec, job.get("spec"))
    elastic.adopt_pod_size(b, written, pods)
    seen = Observed(
        spec=attempt_spec(written, b.status, pods),
        written_spec=written,
        room=room,
        attempt=b.status["attempt"],
        pods=pods,
        nodes=nodes,
        now=now,
        node_lost_after=node_lost_after,
        pod_template=(job.get("spec") or {}).get("template", {}).get("spec") or {},
        created=parse_iso((job.get("metadata") or {}).get("creationTimestamp")),
        trainer_report=trainer_report,
        in_place=b.status.get("inPlace"),
        launcher_refusals=launcher_refusals or {},
        kueue=kueue_gate,
        status_write_due=status_write_due,
        spec_name=str((job.get("metadata") or {}).get("name") or ""),
        yielding_spares=yielding_spares or {},
    )
    for rule in STEPS:
        if rule(b, seen):
            break
    for bookkeeping in AFTER_EVERY_DECISION:
        bookkeeping(b, seen)
    return b.plan
