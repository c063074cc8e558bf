"""Warm spares (spec.spares; policy/spares.py), pure, after every decision: the spares standing by
are kept at spec.spares while the gang holds its room, in status.spares, and removed otherwise.

- Created once the workers are admitted (best effort, gang/requests.py: the workers never wait for
  them), and later whenever fewer stand by: after one took a lost rank (rules/in_place.py), or was
  lost itself while idle (evicted, preempted, failed). A lost idle spare disturbs nobody: a new one
  is created (a Normal SpareReplaced event), with no restart and no counter, but with a backoff
  (status.spares.nextCreateTime) so that a spare crashing at start is not recreated in a hot loop.
- None while the workers hold no room (not created or not admitted yet, a full restart's gang in
  the queue, a gang timeout's backoff): they would keep GPUs for a gang that has none. An in-place
  attempt keeps them: its kept pods hold their room.
- A spare told to take a rank is relabelled as that rank's worker once the status that says so is
  stored (plan.relabel_pods, written before any act).
- A finished or suspended job has none; nor has a Kueue-admitted one (Kueue admits the Workload's
  pod set, which holds the workers only): status.spares.message and one Warning say so.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from phalanx.pod_facts import (
    in_current_attempt,
    is_deleting,
    is_gated,
    is_spare,
    kept_pod_uids,
    pod_index,
    replica_index,
    restarted_in_place,
    spare_ranks,
)
from phalanx.policy.spares import (
    REASON_SPARE_PREEMPTED,
    REASON_SPARE_REPLACED,
    REASON_SPARES_REMOVED,
    count_spares,
    new_spare_numbers,
    replacement_backoff,
    spares_status,
    spares_to_create,
    surplus_spares,
)
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import FINISHED_PHASES, Event, PlanBuilder, iso, parse_iso
from phalanx.reconcile.rules import stranded
from phalanx.reconcile.rules.creation import avoided_now

REASON_SPARES_IGNORED: Final = "SparesIgnored"
REASON_SPARE_STRANDED: Final = "SpareStranded"
REASON_SPARES_REFUSED: Final = "SparesRefused"
KUEUE_IGNORED: Final = "spec.spares is ignored for a job Kueue admits"
WAITING_FOR_WORKERS: Final = "no spare until the workers are admitted"
YIELDED_SPARE_DELAY_SECONDS: Final = 60.0  # a spare that gave its room to a waiting gang: replaced after this


def apply(b: PlanBuilder, seen: Observed) -> bool:
    _relabel(b, seen)
    desired = seen.as_written.spares
    # From the status this pass writes: a takeover decided just now has its spare taking a rank.
    count = count_spares(seen.pods, b.status, seen.nodes, seen.lost_nodes)
    before: dict[str, Any] = dict(b.status.get("spares") or {})
    if not desired and not count.alive and not count.ended:
        b.status.pop("spares", None)
        return False
    plan = b.plan
    going = set(plan.delete_pods) | set(plan.force_delete_pods)
    active = (
        b.status.get("phase") not in (*FINISHED_PHASES, "Suspended")
        and not seen.spec.run_policy.suspend
        and seen.kueue is None
        and not plan.delete_job
    )
    admitted = active and _workers_admitted(b, seen)
    # An in-place attempt keeps its spares while a replacement worker waits: its kept pods hold room.
    holds_room = admitted or (active and restarted_in_place(b.status))
    if not holds_room:
        plan.delete_pods.extend(n for n in (*count.alive, *count.ended) if n not in going)
        status = spares_status(desired, count) | {"ready": 0, "summary": f"0/{desired}", "pods": []}
        if seen.kueue is not None and desired:
            status["message"] = KUEUE_IGNORED
            if before.get("message") != KUEUE_IGNORED:
                plan.events.append(Event("Warning", REASON_SPARES_IGNORED, f"{KUEUE_IGNORED}: Kueue admits the "
                                         "workers' pod set only; remove spec.spares or the queue label"))  # fmt: skip
        elif active and desired:
            status["message"] = WAITING_FOR_WORKERS
        b.status["spares"] = status
        return False
    plan.delete_pods.extend(n for n in count.ended if n not in going)
    # Asked to give their room to a waiting gang (the admission pass; idle ones only: one taking a
    # rank is not in count.alive): deleted here, in the job's own serialised reconcile.
    yielding = [n for n in count.alive if n not in going and seen.asked_to_yield(n) is not None]
    for name in yielding:
        plan.delete_pods.append(name)
        plan.events.append(Event("Normal", REASON_SPARE_PREEMPTED,
                                 f"spare {name} {seen.asked_to_yield(name)}; training goes on undisturbed"))  # fmt: skip
    going |= set(yielding)
    # Admitted onto a node that will not take it (rules/stranded.py): it would stand there for good.
    for name in count.alive:
        found = None if name in going else stranded.why_unusable(seen.spare_pods.get(name, {}), seen, b.now)
        if isinstance(found, float):
            b.recheck(found)  # decide again the moment its node counts as lost
        elif found is not None:
            plan.delete_pods.append(name)
            going.add(name)
            plan.events.append(Event("Normal", REASON_SPARE_STRANDED,
                                     f"spare {name} was admitted onto node {found[0]}, which is {found[1]}: "
                                     "deleted, another is made"))  # fmt: skip
    # Over those that stay: a spare this pass deletes (yielding, stranded) is no surplus to remove.
    staying = dataclasses.replace(count, alive=tuple(n for n in count.alive if n not in going),
                                  ready=tuple(n for n in count.ready if n not in going))  # fmt: skip
    surplus = surplus_spares(desired, staying)
    if surplus:
        plan.delete_pods.extend(n for n in surplus if n not in going)
        plan.events.append(Event("Normal", REASON_SPARES_REMOVED,
                                 f"spec.spares is {desired}: removing spare(s) {', '.join(surplus)}"))  # fmt: skip
    status = spares_status(desired, count) | _backoff_fields(before)
    if "message" in before and before["message"] not in (KUEUE_IGNORED, WAITING_FOR_WORKERS):
        status["message"] = before["message"]  # a refusal, until a spare is created again
    if len(count.ready) >= desired and not count.lost:
        status = {k: v for k, v in status.items() if k not in ("failures", "nextCreateTime", "message")}
    if yielding:
        # Replaced, but not at once: the head that asked may still wait (for a victim's grace period,
        # say), and a new spare admitted on room it does not use would only be asked to yield again.
        # Set in the pass that deletes, never pushed later; a longer failure backoff stands.
        delayed = max(parse_iso(status.get("nextCreateTime")) or 0.0, b.now + YIELDED_SPARE_DELAY_SECONDS)
        status["nextCreateTime"] = iso(delayed)
    b.status["spares"] = status
    missing = spares_to_create(desired, count)
    if not missing or not admitted or plan.create_indices:
        return False
    yielded = [n for n in count.lost if seen.asked_to_yield(n) is not None]
    not_before = parse_iso(status.get("nextCreateTime"))
    if not_before is not None and b.now < not_before:
        b.recheck(not_before - b.now)
        return False
    plan.create_spares = new_spare_numbers(
        seen.spec_name, (str(p["metadata"]["name"]) for p in seen.pods), missing
    )
    # Off the nodes a worker created now would avoid: lingering lost nodes, bad nodes.
    plan.avoid_nodes = sorted(avoided_now(b, seen))
    status.pop("message", None)
    if len(yielded) < len(count.lost):  # a spare that yielded failed nothing
        failures = int(status.get("failures") or 0) + 1
        status["failures"] = failures
        status["nextCreateTime"] = iso(b.now + replacement_backoff(failures))
    # Every spare made in place of another (lost, gone before a pass saw it, or now a worker) is said;
    # alone: a Normal event of the same pass (the phase's, say) would otherwise take its reason.
    alive = set(count.alive)
    gone_unseen = [n for n in before.get("pods") or () if n not in alive]
    if count.lost or gone_unseen or spare_ranks(b.status):
        message = _replaced(b, seen, desired, plan.create_spares)
        plan.events.append(Event("Normal", REASON_SPARE_REPLACED, message, alone=True))
    return False


def _replaced(b: PlanBuilder, seen: Observed, desired: int, numbers: list[int]) -> str:
    count = seen.spares
    yielded = [n for n in count.lost if seen.asked_to_yield(n) is not None]
    lost = [n for n in count.lost if n not in yielded]
    why = [f"{', '.join(lost)} lost while standing by"] if lost else []
    why += [f"{', '.join(yielded)} gave its room to a waiting gang"] if yielded else []
    why += [f"{name} took rank {rank}" for name, rank in sorted(spare_ranks(b.status).items())]
    if not why:
        why = [f"{len(count.alive)} of spec.spares={desired} standing by"]
    names = ", ".join(f"{seen.spec_name}-spare-{n}" for n in numbers)
    return f"creating spare(s) {names} ({'; '.join(why)}); training goes on undisturbed"


def spares_refused(
    old: dict[str, Any], status: dict[str, Any], refusals: list[str], now: float
) -> Event | None:
    """The API server refused spares (a quota sized for the workers, say; `refusals` are its
    messages): said in status.spares, never in PodsCreated (the workers are created), and retried
    after the backoff. Returns the Warning event to record when the message is new."""
    spares = status.setdefault("spares", {})
    failures = int(spares.get("failures") or 0) + 1
    message = f"{len(refusals)} spare(s) refused by the API server: {refusals[0]}"
    spares.update(failures=failures, nextCreateTime=iso(now + replacement_backoff(failures)), message=message)
    if (old.get("spares") or {}).get("message") != message:
        return Event("Warning", REASON_SPARES_REFUSED, message)
    return None


def _workers_admitted(b: PlanBuilder, seen: Observed) -> bool:
    """Every rank of the current attempt (as this pass writes it) has a pod past the gate. One being
    deleted still counts: its loss is the restart's to decide, and a spare may take its rank."""
    current = [p for p in seen.pods if in_current_attempt(p, b.status)]
    ranks = {replica_index(p, b.status) for p in current}
    return all(r in ranks for r in range(seen.spec.replicas)) and not any(is_gated(p) for p in current)


def _backoff_fields(before: dict[str, Any]) -> dict[str, Any]:
    return {k: before[k] for k in ("failures", "nextCreateTime") if k in before}


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
