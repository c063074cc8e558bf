"""What a decision reads, worked out once (pure): the job's spec, its pods split by attempt, and
the nodes that count as lost. Every rule reads this; none reads the raw job again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.kueue.gate import KueueGate
from phalanx.pod_facts import in_current_attempt, is_spare, is_terminal, replica_index
from phalanx.policy.elastic import Room
from phalanx.policy.node_loss import lost_node_names, not_ready_since, on_lost_node
from phalanx.policy.pod_outcome import (
    REASON_NODE_LOST,
    GangVerdict,
    OutcomeKind,
    PodOutcome,
    classify_pod,
    gang_verdict,
    missing_pod_outcome,
)
from phalanx.policy.spares import SpareCount, count_spares, idle_spares
from phalanx.reconcile.plan import iso


def on_vanished_node(pod: dict[str, Any], nodes: dict[str, Any]) -> bool:
    """Bound to a Node object that no longer exists (an empty node list is "not known yet")."""
    node_name = pod.get("spec", {}).get("nodeName")
    return bool(node_name) and bool(nodes) and node_name not in nodes


@dataclass
class Observed:
    spec: TrainingJobSpec
    attempt: int
    pods: list[dict[str, Any]]
    nodes: dict[str, dict[str, Any]]
    now: float
    node_lost_after: float
    # The job's pod template spec (spec.template.spec), and when the job was created (None: unknown).
    pod_template: dict[str, Any] = field(default_factory=dict)
    created: float | None = None
    # What rank 0 of this job (this uid) last reported in /progress: attempt, start-up times, stalls.
    trainer_report: Mapping[str, Any] | None = None
    # status.inPlace: the pods an in-place attempt keeps from the one before (pod_facts.py).
    in_place: Mapping[str, Any] | None = None
    # Launchers of the in-place attempt's kept pods that refused or could not be reached when
    # told its generation (controller/generations.py): pod name -> why.
    launcher_refusals: Mapping[str, str] = field(default_factory=dict)
    # What Kueue says of the job's Workload (kueue/gate.py); None: not in a Kueue queue.
    kueue: KueueGate | None = None
    # The spec as written; `spec` above is the one the current attempt runs (an elastic gang's
    # replicas are its status.currentReplicas, policy/elastic.py). None: the same as `spec`.
    written_spec: TrainingJobSpec | None = None
    # Elastic jobs: the free room for more of the job's pods, and whether others wait (None: unknown).
    room: Room | None = None
    # The status is written now whatever is decided: the progress sample is due (policy/progress_writes.py).
    status_write_due: bool = False
    # The job's name (metadata.name): what its pods' names start with.
    spec_name: str = ""
    # Its warm spares the admission pass asked to give their room to a waiting gang (pod uid -> why;
    # controller/spare_yields.py): deleted while they stand by, never given a lost rank.
    yielding_spares: Mapping[str, str] = field(default_factory=dict)

    @property
    def as_written(self) -> TrainingJobSpec:
        return self.written_spec if self.written_spec is not None else self.spec

    @cached_property
    def _status(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "inPlace": self.in_place}

    @cached_property
    def current(self) -> dict[int, dict[str, Any]]:
        """The current attempt's pods by replica index (the pods it keeps in place included)."""
        return {replica_index(p, self._status): p for p in self.pods if in_current_attempt(p, self._status)}

    @cached_property
    def stale(self) -> list[dict[str, Any]]:
        """Pods of older attempts (not kept in place); warm spares standing by are no attempt's."""
        return [p for p in self.pods if not in_current_attempt(p, self._status) and not is_spare(p)]

    @cached_property
    def spares(self) -> SpareCount:
        """The warm spares standing by (policy/spares.py)."""
        return count_spares(self.pods, self._status, self.nodes, self.lost_nodes)

    @cached_property
    def spare_pods(self) -> dict[str, dict[str, Any]]:
        """The warm spares standing by, by name."""
        return {str(p["metadata"]["name"]): p for p in idle_spares(self.pods, self._status)}

    def asked_to_yield(self, spare: str) -> str | None:
        """Why the spare of this name (this very pod: its uid) was asked to give its room, or None."""
        pod = self.spare_pods.get(spare)
        return None if pod is None else self.yielding_spares.get(str(pod["metadata"].get("uid")))

    @cached_property
    def lost_nodes(self) -> frozenset[str]:
        """The lost nodes among those the job's pods are bound to: every rule asks only about those,
        and judging each node of the cluster (1,000 in the steady-state bench) was a seventh of a
        reconcile's CPU."""
        bound = {n for p in self.pods if (n := (p.get("spec") or {}).get("nodeName")) and n in self.nodes}
        return lost_node_names({n: self.nodes[n] for n in bound}, self.now, self.node_lost_after)

    @cached_property
    def left_behind(self) -> list[str]:
        """Older pods on a lost node: they may never go (nobody confirms their deletion), so the next
        attempt does not wait for them, and takes other names."""
        return [p["metadata"]["name"] for p in self.stale if on_lost_node(p, self.nodes, self.lost_nodes)]

    @cached_property
    def waited_for(self) -> list[dict[str, Any]]:
        """Older pods that are waited for: they are saving the SIGTERM checkpoint the next attempt
        resumes from."""
        return [p for p in self.stale if p["metadata"]["name"] not in self.left_behind]

    @cached_property
    def outcomes(self) -> list[PodOutcome]:
        """One outcome per replica of the current attempt (policy/pod_outcome.py)."""
        retryable = frozenset(self.spec.run_policy.retryable_exit_codes or ())
        outcomes = []
        for index in range(self.spec.replicas):
            pod = self.current.get(index)
            if pod is None:
                outcomes.append(missing_pod_outcome(f"worker-{index}"))
                continue
            node_name = pod.get("spec", {}).get("nodeName")
            node = self.nodes.get(node_name) if node_name else None
            if on_vanished_node(pod, self.nodes) and not is_terminal(pod):
                message = f"node {node_name} no longer exists"
                outcomes.append(
                    PodOutcome(pod["metadata"]["name"], OutcomeKind.PREEMPTED, REASON_NODE_LOST, message)
                )
                continue
            if node is not None and node_name in self.lost_nodes and not is_terminal(pod):
                # The pod may still say Running: nobody is left to update it. Its rank is gone all the same.
                since = not_ready_since(node)
                message = f"node {node_name} not Ready since {iso(since) if since is not None else 'a while'}"
                outcomes.append(
                    PodOutcome(
                        pod["metadata"]["name"], OutcomeKind.PREEMPTED, REASON_NODE_LOST, message, at=since
                    )
                )
                continue
            outcomes.append(classify_pod(pod, retryable_exit_codes=retryable, node=node))
        return outcomes

    @cached_property
    def verdict(self) -> GangVerdict:
        return gang_verdict(self.outcomes)

    @cached_property
    def running(self) -> int:
        """Replicas running or done."""
        return sum(o.kind in (OutcomeKind.RUNNING, OutcomeKind.SUCCEEDED) for o in self.outcomes)
