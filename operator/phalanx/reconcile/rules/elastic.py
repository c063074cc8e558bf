"""An elastic gang running below its size grows at a checkpoint when room appears: the gang
restarts (reason Resize, its own counter, never a failure or a preemption) and the next attempt is
created at the size the room allows (policy/elastic.py, rules/creation.py) (pure)."""

from __future__ import annotations

from phalanx.policy import elastic
from phalanx.policy.pod_outcome import VerdictKind
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder
from phalanx.reconcile.rules.transitions import restart


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
    size = elastic.grow_size(written, current, seen.room, b.status)
    if size is None:
        b.recheck(elastic.GROW_RECHECK_SECONDS)  # room and checkpoints come without an event for it
        return False
    restarts = b.status["restarts"]
    restarts["resizes"] = int(restarts.get("resizes", 0)) + 1
    restart(b, seen.current, elastic.REASON_RESIZE,
            f"room for {size - current} more pod(s) and a checkpoint at step "
            f"{(b.status.get('lastCheckpoint') or {}).get('step')}: growing from {current} towards {size} pod(s)")  # fmt: skip
    return True
