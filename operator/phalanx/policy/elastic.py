"""Elastic gangs (spec.elastic): what size each attempt runs at, and when a running gang grows (pure).

The size is chosen once per attempt, when none of its pods exists yet, recorded in
status.currentReplicas before the first is created, and carried by every pod of the attempt (label
phalanx.dev/gang-size; the pods' label wins over the status, pod_facts.attempt_replicas): each pod is
built for it (WORLD_SIZE, ranks), so it cannot change while they run. A new attempt takes the
largest size up to spec.replicas (maxReplicas unless set) that fits the free room, at least
minReplicas; the smallest gang is what waits when even that does not fit. That one rule covers both the start (one pod fits: start on one) and the shrink after
a lost node (the room it held is gone: the next attempt is smaller instead of waiting for it). With
spec.elastic.replicasMultipleOf every size is rounded down to a multiple of it: the trainer exits for
good at a world size its global batch or tp x pp does not divide.

Growing takes a restart, and a restart throws away the steps since the last checkpoint, so a gang
grows only once a checkpoint newer than its admission exists, and only into room that is free now
and that no blocked gang holds reserved: the rule backfilling follows (gang/admission.py), so an
elastic gang never preempts, nor delays the head of the queue, to grow. docs/elastic.md.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from phalanx import constants as c
from phalanx.api.v1alpha1 import TrainingJobSpec

REASON_RESIZE: Final = "Resize"  # the Restarting condition of a restart to grow
REASON_RESIZED: Final = "Resized"  # the Event of every size change, from -> to
# How often a gang below its size looks for room again: node and pod events of other jobs do not
# enqueue it, and a checkpoint report alone does not either.
GROW_RECHECK_SECONDS: Final = 5.0
# How soon a new attempt not sized yet, for want of a listed cluster, is looked at again.
UNSIZED_RECHECK_SECONDS: Final = 1.0


# How long the sizes of new attempts stay below one torn down for not starting, and growth waits.
CAP_COOL_DOWN_SECONDS: Final = 600.0


@dataclass(frozen=True)
class Cap:
    """status.elasticCap: new attempts take at most `replicas` pods, and the gang does not grow, until
    `until` (epoch seconds)."""

    replicas: int
    until: float

    def active(self, now: float) -> bool:
        return now < self.until


def cap_after_teardown(
    spec: TrainingJobSpec, failed_size: int, previous: Cap | None, now: float
) -> Cap | None:
    """The cap after an attempt of `failed_size` pods was torn down for not starting (GangTimeout,
    CreateRefused): sizing the next attempt from the same room would loop. One usable size below it
    (lower than a cap still active), never below minReplicas, for CAP_COOL_DOWN_SECONDS."""
    if spec.elastic is None:
        return None
    below = max(spec.elastic.min_replicas, usable(spec, failed_size - 1))
    if previous is not None and previous.active(now):
        below = min(below, previous.replicas)
    return Cap(below, now + CAP_COOL_DOWN_SECONDS)


@dataclass(frozen=True)
class Room:
    """The cluster as the admission pass sees it, for one job's pod shape."""

    pods: int  # more pods of this shape that fit now: free room, outside other gangs' reservations


def start_size(
    spec: TrainingJobSpec, room: Room | None, cap: Cap | None = None, unusable: Collection[int] = ()
) -> int:
    """The size of a new attempt, chosen before its first pod is created; at most cap.replicas, never
    a size the trainer found unusable (at least the smallest usable one, which may wait for room).

    room None (the cluster not listed yet): the smallest; rules/creation.py waits for the room instead.
    """
    if spec.elastic is None:
        return spec.replicas
    smallest = smallest_usable(spec, unusable) or spec.elastic.min_replicas
    largest = max(smallest, usable(spec, spec.replicas, unusable))
    if cap is not None:
        largest = max(smallest, usable(spec, min(largest, cap.replicas), unusable))
    if room is None:
        return smallest
    return max(smallest, usable(spec, min(largest, room.pods), unusable))


def usable(spec: TrainingJobSpec, pods: int, unusable: Collection[int] = ()) -> int:
    """pods rounded down to a size the trainer can use (spec.elastic.replicasMultipleOf; the CRD makes
    minReplicas one, so a size at least minReplicas stays at least it), past the sizes its trainer
    found unusable (status.elasticUnusableSizes); 0 when none is left."""
    step = (spec.elastic.replicas_multiple_of if spec.elastic is not None else None) or 1
    size = pods - pods % step
    while size > 0 and size in unusable:
        size -= step
    return max(size, 0)


def smallest_usable(spec: TrainingJobSpec, unusable: Collection[int]) -> int | None:
    """The smallest size from minReplicas to maxReplicas the trainer has not found unusable; None:
    none is left (the job fails: rules/elastic.unusable_size)."""
    if spec.elastic is None:
        return None if spec.replicas in unusable else spec.replicas
    step = spec.elastic.replicas_multiple_of or 1
    return next((n for n in range(spec.elastic.min_replicas, spec.replicas + 1)
                 if n % step == 0 and n not in unusable), None)  # fmt: skip


def unusable_sizes(status: Mapping[str, Any]) -> frozenset[int]:
    """status.elasticUnusableSizes: the sizes whose world the trainer could not split (exit 78)."""
    return frozenset(n for n in status.get("elasticUnusableSizes") or () if isinstance(n, int))


def with_unusable(status: Mapping[str, Any], sizes: Iterable[int]) -> list[int]:
    """status.elasticUnusableSizes with `sizes` added: sorted, the largest constants.MAX_UNUSABLE_SIZES kept."""
    return sorted(unusable_sizes(status) | set(sizes))[-c.MAX_UNUSABLE_SIZES :]


def checkpointed_since_admission(status: Mapping[str, Any]) -> bool:
    """The trainer reported a checkpoint committed after the current attempt was admitted: a restart
    now loses only the steps since then. Judged by when the operator first saw it
    (lastCheckpoint.observedTime, controller/progress.py), against admittedTime: both the operator's
    clock, whole seconds, UTC "Z". The trainer's own timestamp is another machine's clock."""
    observed = (status.get("lastCheckpoint") or {}).get("observedTime")
    admitted = status.get("admittedTime")
    if not observed or not admitted:
        return False
    return str(observed)[:19] >= str(admitted)[:19]


def grow_size(
    spec: TrainingJobSpec, current: int, room: Room | None, status: Mapping[str, Any], cap: Cap | None = None
) -> int | None:
    # status.elasticUnusableSizes are skipped: growth goes to the next usable size the room allows.
    """The size to restart a running elastic gang at to grow, or None to keep running as it is (also
    while a cap after a teardown is active: the room that failed it may look free again).

    room.pods counts pods that fit besides the ones the gang holds (those stay counted as used).
    """
    if spec.elastic is None or current >= spec.replicas or room is None or cap is not None:
        return None
    if room.pods < 1 or not checkpointed_since_admission(status):
        return None
    size = usable(spec, min(spec.replicas, current + room.pods), unusable_sizes(status))
    return size if size > current else None  # by whole multiples only


def resize_message(old: int, new: int, cause: str) -> str:
    """The Event of a size change: from -> to, and why."""
    verb = "grows" if new > old else "shrinks"
    return f"gang {verb} from {old} to {new} pod(s): {cause}"


def size_cause(
    restart_reason: str, room: Room | None, cap: Cap | None = None, unusable: Collection[int] = ()
) -> str:
    """Why a new attempt got the size it did (for the Event of a change), from what limited it: the
    room, a cap after an attempt that did not start, the sizes the trainer cannot use."""
    if room is None:
        return f"after {restart_reason}; the cluster is not listed yet, starting at the smallest usable size"
    capped = f", capped at {cap.replicas} after an attempt that did not start" if cap is not None else ""
    skipped = (
        f", skipping the size(s) the trainer cannot use ({', '.join(map(str, sorted(unusable)))})"
        if unusable
        else ""
    )
    return f"after {restart_reason}; room for {room.pods} pod(s) now{capped}{skipped}"
