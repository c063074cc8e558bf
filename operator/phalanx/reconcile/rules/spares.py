"""Warm spares (spec.spares; policy/spares.py), pure, after every decision: the spares standing by
are kept at spec.spares while the job is active, in status.spares, and removed once it is not.

- Created with the gang's workers (in the same creation, so that admission takes them together: a
  gang needs replicas + spares to fit, gang/requests.py), and later whenever fewer stand by: after
  one took a lost rank (rules/in_place.py), or was lost itself while idle (evicted, preempted,
  failed, or already gone). A lost idle spare disturbs nobody: a new one is created, with no
  restart and no counter; every spare created apart from the gang gets a Normal SpareReplaced event.
- A spare told to take a rank is relabelled as that rank's worker once the status that says so is
  stored (plan.relabel_pods, written before any act).
- A finished, suspended or Kueue-queued job has none (Kueue admits the Workload's pod set, which
  holds the workers only), nor one backing off after a gang timeout (its room is for others).
"""

from __future__ import annotations

from phalanx.pod_facts import is_deleting, is_spare, kept_pod_uids, pod_index, spare_ranks
from phalanx.policy.spares import (
    REASON_SPARE_REPLACED,
    REASON_SPARES_REMOVED,
    new_spare_numbers,
    spares_status,
    spares_to_create,
    surplus_spares,
)
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import FINISHED_PHASES, Event, PlanBuilder, parse_iso


def apply(b: PlanBuilder, seen: Observed) -> bool:
    _relabel(b, seen)
    desired = seen.as_written.spares
    count = seen.spares
    if not desired and not count.alive and not count.ended:
        b.status.pop("spares", None)
        return False
    plan = b.plan
    going = set(plan.delete_pods) | set(plan.force_delete_pods)
    requeue = parse_iso(b.status.get("requeueAfter"))
    active = (
        b.status.get("phase") not in (*FINISHED_PHASES, "Suspended")
        and not seen.spec.run_policy.suspend
        and seen.kueue is None
        and not plan.delete_job
        # Torn down after a gang timeout and backing off: its spares would hold room for nothing;
        # they come back with the gang's next creation.
        and (requeue is None or b.now >= requeue)
    )
    if not active:
        plan.delete_pods.extend(n for n in (*count.alive, *count.ended) if n not in going)
        b.status["spares"] = spares_status(desired, count) | {"ready": 0, "summary": f"0/{desired}"}
        return False
    plan.delete_pods.extend(n for n in count.ended if n not in going)
    surplus = surplus_spares(desired, count)
    if surplus:
        plan.delete_pods.extend(n for n in surplus if n not in going)
        plan.events.append(Event("Normal", REASON_SPARES_REMOVED,
                                 f"spec.spares is {desired}: removing spare(s) {', '.join(surplus)}"))  # fmt: skip
    b.status["spares"] = spares_status(desired, count)
    missing = spares_to_create(desired, count)
    # With the workers: created with them (admitted together), or once they exist.
    if missing and (plan.create_indices or seen.current):
        plan.create_spares = new_spare_numbers(
            seen.spec_name, (str(p["metadata"]["name"]) for p in seen.pods), missing
        )
        if not plan.create_indices:  # not with the gang: one took a rank, or was lost (maybe gone already)
            # Alone: a Normal event of the same pass (the phase's, say) would otherwise take its reason.
            message = _replaced(b, seen, desired, plan.create_spares)
            plan.events.append(Event("Normal", REASON_SPARE_REPLACED, message, alone=True))
    return False


def _replaced(b: PlanBuilder, seen: Observed, desired: int, numbers: list[int]) -> str:
    count = seen.spares
    why = [f"{', '.join(count.lost)} lost while standing by"] if count.lost else []
    why += [f"{name} took rank {rank}" for name, rank in sorted(spare_ranks(b.status).items())]
    if not why:
        why = [f"{len(count.alive)} of spec.spares={desired} standing by"]
    names = ", ".join(f"{seen.spec_name}-spare-{n}" for n in numbers)
    return f"creating spare(s) {names} ({'; '.join(why)}); training goes on undisturbed"


def _relabel(b: PlanBuilder, seen: Observed) -> None:
    """Spares the current attempt has take a rank, still labelled as spares (or as another rank)."""
    kept = kept_pod_uids(b.status)
    for pod in seen.pods:
        name = str(pod["metadata"]["name"])
        rank = spare_ranks(b.status).get(name)
        if rank is None or kept.get(name) != pod["metadata"].get("uid") or is_deleting(pod):
            continue
        if is_spare(pod) or pod_index(pod) != rank:
            b.plan.relabel_pods[name] = rank
