"""An elastic gang running below its size grows at a checkpoint when room appears: the gang
restarts (reason Resize, its own counter, never a failure or a preemption) and the next attempt is
created at the size the room allows (policy/elastic.py, rules/creation.py) (pure)."""

from __future__ import annotations

from typing import Any, Final

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.pod_facts import attempt_replicas, attempt_sizes, in_current_attempt
from phalanx.policy import elastic
from phalanx.policy.pod_outcome import REASON_WORLD_SIZE_TOO_SMALL, REASON_WORLD_SIZE_UNUSABLE, VerdictKind
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder, iso, parse_iso
from phalanx.reconcile.rules.transitions import restart

# The Restarting reason when an attempt's pods were built for different sizes: never counted.
REASON_MIXED_SIZES: Final = "MixedGangSizes"
WORLD_SIZE_REASONS: Final = (REASON_WORLD_SIZE_UNUSABLE, REASON_WORLD_SIZE_TOO_SMALL)


def active_cap(b: PlanBuilder) -> elastic.Cap | None:
    """status.elasticCap while its cool-down lasts; dropped from the status once it has passed."""
    raw = b.status.get("elasticCap") or {}
    until = parse_iso(raw.get("until"))
    if not isinstance(raw.get("replicas"), int) or until is None or not elastic.Cap(0, until).active(b.now):
        b.status.pop("elasticCap", None)
        return None
    b.recheck(until - b.now)  # the cap lifts without an event for it
    return elastic.Cap(int(raw["replicas"]), until)


def cap_after_teardown(b: PlanBuilder, seen: Observed) -> None:
    """An elastic attempt torn down for not starting (rules/gang_timeout.py): cap the next ones below
    its size for a cool-down (policy/elastic.py)."""
    cap = elastic.cap_after_teardown(seen.as_written, seen.spec.replicas, active_cap(b), b.now)
    if cap is not None:
        b.status["elasticCap"] = {"replicas": cap.replicas, "until": iso(cap.until)}


def unusable_size(b: PlanBuilder, seen: Observed) -> bool:
    """The trainer cannot split the attempt's world size (exit 78, its global batch or tp x pp): the
    size is kept in status.elasticUnusableSizes, skipped from then on by sizing and growth (a size above
    it may well divide), and the gang restarts, counted nowhere: the size failed, not the job. Without
    elastic, or with no usable size left from minReplicas to maxReplicas, failure.apply fails the job,
    its message naming the fix."""
    written = seen.as_written
    reason = seen.verdict.reason
    if seen.verdict.kind is not VerdictKind.FAILED or reason not in WORLD_SIZE_REASONS:
        return False
    size = seen.spec.replicas
    if written.elastic is None:
        return False
    # Too small for tp x pp: every smaller world is too, so the gang never steps down to one.
    failed = range(1, size + 1) if reason == REASON_WORLD_SIZE_TOO_SMALL else (size,)
    unusable = elastic.with_unusable(b.status, failed)
    if elastic.smallest_usable(written, unusable) is None:
        return False
    b.status["elasticUnusableSizes"] = unusable
    world = seen.spec.world_size
    pods = f"{size} pod(s) x {seen.spec.effective_procs_per_replica}"
    why = (
        f"world size {world} ({pods}) is smaller than tp x pp; not sized at {size} pod(s) or fewer again"
        if reason == REASON_WORLD_SIZE_TOO_SMALL
        else f"data.global_batch_size over the data-parallel ranks, or tp x pp, does not divide world size "
        f"{world} ({pods}); not sized at {size} pod(s) again"
    )
    restart(b, seen.current, REASON_WORLD_SIZE_UNUSABLE,
            f"the trainer cannot use this world size: {why}, retrying at another size. Set "
            "spec.elastic.replicasMultipleOf (and minReplicas) to the sizes the trainer divides")  # fmt: skip
    return True


def adopt_pod_size(b: PlanBuilder, written: TrainingJobSpec, pods: list[dict[str, Any]]) -> None:
    """An elastic attempt whose pods agree on their size (their label) runs at it: the status is
    corrected to it, whatever a lost or stale write left there (pod_facts.attempt_replicas)."""
    if written.elastic is None or len(attempt_sizes(pods, b.status)) != 1:
        return
    b.status["currentReplicas"] = attempt_replicas(written, b.status, pods)
    b.status["sizedAttempt"] = b.status["attempt"]


def mixed_sizes(b: PlanBuilder, seen: Observed) -> bool:
    """The attempt's pods were built for different sizes (two passes sized it from different views):
    their WORLD_SIZEs disagree and the gang could never form. A restart, counted nowhere: no pod
    failed."""
    sizes = attempt_sizes(seen.current.values(), b.status)
    if len(sizes) < 2:
        return False
    restart(b, seen.current, REASON_MIXED_SIZES,
            f"the attempt's pods were built for different gang sizes ({', '.join(map(str, sorted(sizes)))})")  # fmt: skip
    return True


def grow(b: PlanBuilder, seen: Observed) -> bool:
    written = seen.as_written
    if written.elastic is None or b.old.get("phase") != "Running":
        return False
    # Every rank still training: one that exited 0 means the job is finishing (rank 0 may be in
    # its final save), and a restart would throw that away.
    if seen.verdict.kind is not VerdictKind.RUNNING or seen.verdict.succeeded:
        return False
    current = seen.spec.replicas
    if current >= written.replicas or seen.running < current:
        return False
    size = elastic.grow_size(written, current, seen.room, b.status, active_cap(b))
    if size is None:
        b.recheck(elastic.GROW_RECHECK_SECONDS)  # room and checkpoints come without an event for it
        return False
    b.plan.grow = (size, size - current)
    restarts = b.status["restarts"]
    restarts["resizes"] = int(restarts.get("resizes", 0)) + 1
    restart(b, seen.current, elastic.REASON_RESIZE,
            f"room for {size - current} more pod(s) and a checkpoint at step "
            f"{(b.status.get('lastCheckpoint') or {}).get('step')}: growing from {current} towards {size} pod(s)")  # fmt: skip
    return True


def room_needed(job: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    """Whether this pass's decision may read the room (the I/O layer computes it only then: placing
    a probe gang costs a plan over every node): a new elastic attempt to size (rules/creation.py),
    or a gang that could grow now, running below its size with a checkpoint since its admission and
    no cap (grow above). Any other pass decides without it."""
    spec = job.get("spec") or {}
    if not spec.get("elastic"):
        return False
    status = job.get("status") or {}
    attempt = int(status.get("attempt") or 0)
    if status.get("createdAttempt") != attempt and status.get("sizedAttempt") != attempt:
        return not any(in_current_attempt(p, status) for p in pods)
    if status.get("phase") != "Running" or not elastic.checkpointed_since_admission(status):
        return False
    if (status.get("elasticCap") or {}).get("until"):
        return False  # active or not, grow() drops it first and looks for room 5 s later
    written = parse(TrainingJobSpec, spec)
    return attempt_replicas(written, status, pods) < written.replicas
