"""Early start: a blocked head's gates are lifted shortly before its room frees (pure; read by
gang/admission.plan_admission).

At a turnover the GPUs of the gangs that finish idle until the operator sees them finish, plans,
and lifts the next gang's gates one write per pod, and only then can the scheduler bind. When the
jobs' own estimates say that the work on every node a blocked head holds ends within
EARLY_START_SECONDS, the head is admitted at once, pinned to those nodes: its pods wait in the
scheduler, which binds each the moment the last pod on its node finishes.

What may end: the bound pods of a Running TrainingJob whose end is known (end_for_early_start: its
trainer's ETA as read by a poll at a known time, or, in a first attempt, its
spec.scheduling.expectedRunSeconds counted from status.startTime) and not overdue by more than the
lead (startTime has whole seconds; an estimate is one). Everything else on a node stays: pods of other owners, of jobs without an estimate
or past it, and pods admitted but not bound yet. The head starts early only where it fits beside
what stays.

No pod on those nodes, bound or about to be, may have a lower priority than the head's pods: the
scheduler would otherwise preempt it to bind the waiting pod early, killing a job moments before
it ends.

An estimate that turns out short leaves the head's pods pinned and waiting until the work ends; a
head that then does not run whole within its gang timeout is torn down and requeued
(reconcile/rules/gang_timeout.py), as any admitted gang. Should the node stop taking pods for good meanwhile
(lost, deleted, being removed), the head is queued again at once (reconcile/rules/stranded.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from phalanx.gang.backfill import PodOnNode, job_end, pod_end
from phalanx.gang.capacity import add_into

EARLY_START_SECONDS: Final = 2.0


def end_for_early_start(
    status: Mapping[str, Any], eta_read_at: float | None, hinted_end: float | None
) -> float:
    """When a running job's work ends, as far as early start trusts it (inf: unknown). Its trainer's
    ETA only as read by a poll at a known time (`eta_read_at`): status.progress carries no time, so
    an ETA there may be minutes old and would never run out. Else `hinted_end`, which the caller
    gives only for a first attempt that never restarted (status.startTime is not reset by one)."""
    if status.get("phase") != "Running":
        return math.inf
    if eta_read_at is not None:
        end = job_end(status, eta_read_at, eta_read_at)  # the backfill's reading of the same ETA
        if math.isfinite(end):
            return end
    return math.inf if hinted_end is None else hinted_end


@dataclass
class NodeHandover:
    ends_at: float = -math.inf  # when the work on it that will end has ended
    stays: dict[str, int] = field(default_factory=dict)  # requests of the pods that do not end
    lowest_priority: int | None = None


def node_handovers(
    pods: Iterable[PodOnNode],
    job_ends: Mapping[str, float],
    now: float,
) -> dict[str, NodeHandover]:
    """Per node holding pods: when its ending work ends, what stays, and the lowest priority there
    (of every pod holding room: one admitted and not bound yet binds within moments)."""
    handovers: dict[str, NodeHandover] = {}
    for pod in pods:
        handover = handovers.setdefault(pod.node, NodeHandover())
        end = pod_end(pod, job_ends, now)
        if end < math.inf:
            handover.ends_at = max(handover.ends_at, end)
        else:  # no end known, long overdue, or not bound yet: it stays
            add_into(handover.stays, pod.requests.items())
        lowest = handover.lowest_priority
        handover.lowest_priority = pod.priority if lowest is None else min(lowest, pod.priority)
    return handovers


@dataclass(frozen=True)
class EarlyStart:
    handovers: Mapping[str, NodeHandover]
    lead_seconds: float = EARLY_START_SECONDS

    def start(self, nodes: Sequence[str], now: float) -> float:
        """When the ending work on all these nodes has ended (now if none runs there)."""
        return max([now, *(self.handovers[n].ends_at for n in nodes if n in self.handovers)])

    def room(
        self,
        nodes: Sequence[str],
        allocatable: Mapping[str, Mapping[str, int]],
        placed: Mapping[str, tuple[Mapping[str, int], int]],
        priority: int,
        now: float,
    ) -> dict[str, dict[str, int]] | None:
        """The room on these nodes once their ending work has ended, beside what stays and what
        this pass placed there (`placed`: requests and the lowest priority of those pods); None
        unless that is within the lead and no pod there has a lower priority than `priority`."""
        if self.start(nodes, now) > now + self.lead_seconds:
            return None
        room: dict[str, dict[str, int]] = {}
        for node in nodes:
            handover = self.handovers.get(node, NodeHandover())
            placed_requests, placed_lowest = placed.get(node, ({}, priority))
            lowest = min(
                priority if handover.lowest_priority is None else handover.lowest_priority, placed_lowest
            )
            if lowest < priority:
                return None
            free = dict(allocatable[node])
            add_into(free, handover.stays.items(), times=-1)
            add_into(free, placed_requests.items(), times=-1)
            room[node] = free
        return room

    def recheck_at(self, nodes: Sequence[str], now: float) -> float | None:
        """When a pass should look again to start the head early (None: no estimate to wait for)."""
        start = self.start(nodes, now)
        if not math.isfinite(start) or start <= now + self.lead_seconds:
            return None
        return start - self.lead_seconds
