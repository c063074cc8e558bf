"""Restart in place (spec.runPolicy.restartStrategy: InPlace), pure: can a disruption of some pods of
a running gang be recovered by keeping the others, and if not, why not.

Kept pods stay up with their resident launcher (docs/trainer.md, "Restart in place"): the operator
tells each the next restart generation and replaces only the lost pods, under the same names. When
that cannot work the caller falls back to the full gang restart and says why (an InPlaceFallback
Warning event). The reasons, in the order they are checked:

- a second disruption before the in-place attempt trained its first step (two failures in one
  generation: the survivors' state is no better than a checkpoint's);
- the gang was not running whole (nothing warm to keep, or a rank never joined);
- a lost pod is not a preemption or a retryable failure (it succeeded, or still waits);
- no pod is left running;
- worker-0 was lost: it hosts the rendezvous store every rank of the generation meets at;
- a lost pod is on a lost node: it may never go, and its name is taken by it;
- a kept pod runs no resident launcher (it was created before restartStrategy was InPlace).

A running pod on a node being emptied is replaced with the lost ones (policy/node_drain.py): a node
tainted for removal by an autoscaler, or a cordoned node a pod of the gang was preempted from (a
drain). It is evicted next, and keeping it would turn this recovery into a full restart at its
eviction. If that pod is worker-0, or no pod is left, the reasons above apply to it as to a lost one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from phalanx import constants as c
from phalanx.pod_facts import is_deleting, pod_index, restarted_in_place
from phalanx.policy.node_drain import being_removed, is_cordoned
from phalanx.policy.pod_outcome import REASON_NODE_LOST, OutcomeKind, PodOutcome

REASON_IN_PLACE_FALLBACK: Final = "InPlaceFallback"
RETRYABLE_LOSSES: Final = (OutcomeKind.PREEMPTED, OutcomeKind.FAILED_RETRYABLE)
# How the kept ranks stop their workers (status.inPlace.stop, sent with the generation; the
# trainer's restart_policy.StopMode).
STOP_AT_CHECKPOINT: Final = "checkpoint"
STOP_NOW: Final = "now"


@dataclass(frozen=True)
class KeptPod:
    index: int
    name: str
    uid: str
    # Its labels do not say its rank (a warm spare that took one and was never relabelled):
    # status.inPlace.keptPods carries the rank forward, or the next attempt would lose it.
    carry_rank: bool = False


@dataclass(frozen=True)
class InPlaceRestart:
    """Keep these pods, replace the pods of these replica indices."""

    kept: tuple[KeptPod, ...]
    lost: tuple[int, ...]  # every index replaced, the ones below included
    # Running pods replaced because their node is being emptied: index -> why.
    emptied: Mapping[int, str] = field(default_factory=dict)
    # The nodes being emptied: node name -> why (no warm spare there takes a rank).
    emptying_nodes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Fallback:
    """A full gang restart instead, and why (for the InPlaceFallback event)."""

    why: str


def runs_resident_launcher(pod: Mapping[str, Any]) -> bool:
    """The pod was built to outlive its workers (builders/pods.py, restartStrategy InPlace): the
    trainer's resident launcher, or torchrun's elastic agent. Read from its annotation: the pod
    stores keep metadata, not the containers' env (cache.py)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations.get(c.ANNOTATION_RESIDENT_LAUNCHER) in ("true", c.RESIDENT_TORCHRUN)


def takes_generations(pod: Mapping[str, Any]) -> bool:
    """Its resident launcher is told each generation (a torchrun agent re-forms the gang itself)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations.get(c.ANNOTATION_RESIDENT_LAUNCHER) == "true"


def in_place_attempt_unfinished(status: Mapping[str, Any]) -> bool:
    """The current attempt restarted in place and has not trained its first step yet."""
    if not restarted_in_place(status):
        return False
    attempt = int(status.get("attempt") or 0)
    recovery = status.get("lastRecovery") or {}
    first_step_done = "firstStep" in (recovery.get("phasesMilliseconds") or {})
    return not (recovery.get("attempt") == attempt and first_step_done)


def plan_in_place(
    strategy: str,
    status: Mapping[str, Any],
    outcomes: Sequence[PodOutcome],
    current: Mapping[int, Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]] | None = None,
) -> InPlaceRestart | Fallback | None:
    """For a disruption the gang would restart for: keep the running pods, or fall back (why).
    None when the job does not restart in place. `status` is the job's status before this
    decision; `outcomes` one per replica index; `current` the attempt's pods by index; `nodes` the
    nodes by name (to see one being emptied)."""
    if strategy != c.RESTART_STRATEGY_IN_PLACE:
        return None
    attempt = int(status.get("attempt") or 0)
    if in_place_attempt_unfinished(status):
        return Fallback(f"a second disruption before attempt {attempt}, restarted in place, trained its "
                        "first step (two failures in one generation)")  # fmt: skip
    if status.get("phase") != "Running":
        return Fallback(f"the gang was not running whole (phase {status.get('phase') or 'Pending'})")
    lost = [(i, o) for i, o in enumerate(outcomes) if o.kind is not OutcomeKind.RUNNING]
    for _, outcome in lost:
        if outcome.kind not in RETRYABLE_LOSSES:
            return Fallback(f"{outcome.pod} is {outcome.kind.value}, not preempted or failed retryably")
    emptying = _emptying_nodes(lost, current, nodes or {})
    emptied = {
        index: f"node {node_name} is being emptied: {emptying[node_name]}"
        for index, pod in current.items()
        if index < len(outcomes)
        and outcomes[index].kind is OutcomeKind.RUNNING
        and (node_name := _node_of(pod)) in emptying
    }
    lost += [(i, outcomes[i]) for i in sorted(emptied)]
    if len(lost) == len(outcomes):
        return Fallback("no pod of the gang is left running")
    if any(i == 0 for i, _ in lost):
        going = f" ({emptied[0]})" if 0 in emptied else ""
        return Fallback(
            f"{outcomes[0].pod} (rank 0, the host of the generation's rendezvous store) was lost{going}"
        )
    on_lost_node = [o.pod for _, o in lost if o.reason == REASON_NODE_LOST]
    if on_lost_node:
        return Fallback(f"{', '.join(on_lost_node)} on a lost node: it may never go, and holds its name")
    kept: list[KeptPod] = []
    lost_indices = {i for i, _ in lost}
    for index in range(len(outcomes)):
        if index in lost_indices:
            continue
        pod = current[index]
        metadata = pod.get("metadata") or {}
        if is_deleting(pod) or not (pod.get("status") or {}).get("podIP"):
            return Fallback(f"{metadata.get('name')} is going away or has no address")
        if not runs_resident_launcher(pod):
            return Fallback(f"{metadata.get('name')} runs no resident launcher (created before "
                            f"restartStrategy was {c.RESTART_STRATEGY_IN_PLACE})")  # fmt: skip
        kept.append(
            KeptPod(index, str(metadata.get("name")), str(metadata.get("uid")), pod_index(pod) != index)
        )
    return InPlaceRestart(tuple(kept), tuple(sorted(lost_indices)), emptied, emptying)


def _node_of(pod: Mapping[str, Any] | None) -> str:
    return str(((pod or {}).get("spec") or {}).get("nodeName") or "")


def _emptying_nodes(
    lost: Sequence[tuple[int, PodOutcome]],
    current: Mapping[int, Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
) -> dict[str, str]:
    """The gang's nodes being emptied: tainted for removal, or cordoned with a pod preempted from it."""
    emptying: dict[str, str] = {}
    for pod in current.values():
        node_name = _node_of(pod)
        why = being_removed(nodes.get(node_name)) if node_name else None
        if why is not None:
            emptying[node_name] = why
    for index, outcome in lost:
        node_name = _node_of(current.get(index))
        if node_name and node_name not in emptying and outcome.kind is OutcomeKind.PREEMPTED:
            if is_cordoned(nodes.get(node_name)):
                emptying[node_name] = f"it is cordoned, and {outcome.pod} was preempted from it"
    return emptying


def kept_pods_status(restart: InPlaceRestart) -> list[dict[str, Any]]:
    """status.inPlace.keptPods (with the rank of a pod whose labels do not say it)."""
    return [
        {"name": k.name, "uid": k.uid, **({"rank": k.index} if k.carry_rank else {})} for k in restart.kept
    ]
