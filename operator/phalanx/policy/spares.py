"""Warm spares (spec.spares), pure: which spares stand by, which are lost, which new ones to create,
and which takes a lost rank in an in-place restart.

A spare is a worker pod in all but its rank (builders/pods.build_spare_pod, label phalanx.dev/spare):
its resident launcher has done its imports and runs no worker. It belongs to no attempt
(pod_facts.in_current_attempt), so a full restart never waits for it; spares are kept only while the
workers hold their room (reconcile/rules/spares.py), and created again once they do.

- Standing by ("idle"): labelled spare and not told to take a rank (status.inPlace.keptPods).
- Ready: idle, Ready (its readiness probe asks its launcher, which answers once its imports are
  done), with an address, not being deleted, and its launcher takes generations.
- Lost: idle and being deleted (evicted, preempted), on a lost or vanished node, or ended (Failed,
  Succeeded). An ended one is deleted; a new spare is created for each lost one (at once the first
  time, then after replacement_backoff), under a new name (names are never reused while a pod holds
  one), and nobody else is disturbed: no restart, no counter.
- Taking a rank (rules/in_place.py): the lost ranks in order, each to the ready spare first by name.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from phalanx import constants as c
from phalanx.pod_facts import is_deleting, is_ready, is_spare, is_terminal, spare_ranks
from phalanx.policy.in_place import takes_generations
from phalanx.policy.node_loss import on_lost_node

REASON_SPARE_REPLACED: Final = "SpareReplaced"
REASON_SPARES_REMOVED: Final = "SparesRemoved"
REASON_SPARE_PREEMPTED: Final = "SparePreempted"  # an idle spare gave its room to a waiting gang
_SPARE_NUMBER = re.compile(r"-spare-(\d+)$")


@dataclass(frozen=True)
class SpareCount:
    """What the job's spares are now: the standing-by pods, by state."""

    alive: tuple[str, ...]  # idle and not going: ready or still starting
    ready: tuple[str, ...]
    lost: tuple[str, ...]  # idle and going (being deleted) or ended
    ended: tuple[str, ...]  # lost and terminal: to delete


def idle_spares(pods: Iterable[dict[str, Any]], status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The job's spares standing by: labelled spare and not taking a rank in the current attempt."""
    taking = spare_ranks(status)
    return [p for p in pods if is_spare(p) and str(p["metadata"]["name"]) not in taking]


def is_ready_spare(pod: Mapping[str, Any]) -> bool:
    """Can take a rank now: Ready (its readiness probe: the launcher answers, imports done),
    reachable, staying, and its launcher takes generations."""
    state = pod.get("status") or {}
    return is_ready(pod) and bool(state.get("podIP")) and not is_deleting(pod) and takes_generations(pod)


def count_spares(
    pods: Iterable[dict[str, Any]],
    status: Mapping[str, Any],
    nodes: Mapping[str, Any] | None = None,
    lost_nodes: Collection[str] = (),
) -> SpareCount:
    """`nodes` (name -> Node) and `lost_nodes` (policy/node_loss.py): a spare on a lost node, or on
    a node that no longer exists, may still say Running, but nobody can reach it."""
    idle = sorted(idle_spares(pods, status), key=lambda p: spare_number(str(p["metadata"]["name"])))
    names = [str(p["metadata"]["name"]) for p in idle]
    lost_set = frozenset(lost_nodes)

    def gone(pod: Mapping[str, Any]) -> bool:
        return is_deleting(pod) or is_terminal(pod) or on_lost_node(pod, nodes or {}, lost_set)

    lost = [n for n, p in zip(names, idle, strict=True) if gone(p)]
    ended = [n for n, p in zip(names, idle, strict=True) if is_terminal(p) and not is_deleting(p)]
    return SpareCount(
        alive=tuple(n for n in names if n not in lost),
        ready=tuple(n for n, p in zip(names, idle, strict=True) if is_ready_spare(p) and n not in lost),
        lost=tuple(lost),
        ended=tuple(ended),
    )


def spare_number(name: str) -> int:
    """The number in `<job>-spare-<number>`; -1 for any other name."""
    match = _SPARE_NUMBER.search(name)
    return int(match.group(1)) if match else -1


def new_spare_numbers(job_name: str, pod_names: Iterable[str], count: int) -> list[int]:
    """`count` spare numbers no pod of the job holds (a spare that took a rank keeps its name, and a
    lost one holds it while it goes), lowest first."""
    prefix = f"{job_name}-spare-"
    held = {spare_number(n) for n in pod_names if n.startswith(prefix)}
    numbers: list[int] = []
    candidate = 0
    while len(numbers) < count:
        if candidate not in held:
            numbers.append(candidate)
        candidate += 1
    return numbers


def spares_to_create(desired: int, count: SpareCount) -> int:
    return max(0, desired - len(count.alive))


def surplus_spares(desired: int, count: SpareCount) -> list[str]:
    """Spares beyond spec.spares (it was lowered): the newest go, those still starting first."""
    extra = len(count.alive) - desired
    if extra <= 0:
        return []
    order = sorted(count.alive, key=lambda n: (n in count.ready, -spare_number(n)))
    return order[:extra]


def assign_spares(lost: Sequence[int], ready: Sequence[str]) -> dict[int, str]:
    """Lost rank -> the ready spare that takes it: the lowest ranks first, each to the next spare
    in name order; ranks beyond the spares are replaced by new pods as without spares."""
    return dict(zip(sorted(lost), ready, strict=False))


def replacement_backoff(failures: int) -> float:
    """How long after the `failures`-th spare in a row lost (or refused) the next one may be created:
    exponential from SPARE_BACKOFF_SECONDS, capped; a spare crashing at start is not recreated in a
    hot loop."""
    return float(min(c.SPARE_BACKOFF_SECONDS * 2 ** max(failures - 1, 0), c.SPARE_BACKOFF_MAX_SECONDS))


def spares_status(desired: int, count: SpareCount) -> dict[str, Any]:
    """status.spares (its pods: at most `desired`, the lowest numbers, as the schema's maxItems asks)."""
    return {
        "desired": desired,
        "ready": len(count.ready),
        "summary": f"{len(count.ready)}/{desired}",
        "pods": list(count.alive[:desired]),
    }
