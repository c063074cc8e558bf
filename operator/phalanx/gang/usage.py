"""Room held per node, kept up to date pod change by pod change.

Admission at creation decides once per new gang, and the admission pass once per round; summing
the requests of every pod in the cluster for each decision cost ~70 ms on 5,000 pods, under the lock
that serializes those decisions. This index follows the pod store instead (Store's observer): each
change moves one pod's requests, and a decision copies a few hundred per-node totals.

It answers exactly what summing usage_by_node over the same pods answers, with each admitted pod
on its planned node (tests/unit/test_gang_usage.py checks them side by side).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Collection, Mapping
from typing import Any

from phalanx.cache import Slim
from phalanx.gang.backfill import UNKNOWN_PRIORITY, PodOnNode
from phalanx.gang.capacity import Resources, add_into, as_resources, effective_requests, node_held
from phalanx.gang.on_creation import Assumed, add_in_flight, waits_for_admission
from phalanx.pod_facts import is_gated, is_node_agent, job_of_pod, planned_node


def _held(pod: Mapping[str, Any]) -> PodOnNode | None:
    node = node_held(pod, planned_node(pod))
    return (
        None
        if node is None
        else holding_pod(pod, node, as_resources(effective_requests(pod.get("spec") or {})))
    )


def holding_pod(pod: Mapping[str, Any], node: str, requests: Resources) -> PodOnNode:
    """A pod holding room on `node`: its requests, and what the backfill and early start read of it
    (gang/backfill.py), taken once as the pod changes: a pass reading every node's pods at 5,000
    nodes then costs a look-up per pod, not a parse. Shared by every pass: read, never changed."""
    spec = pod.get("spec") or {}
    priority = spec.get("priority")
    job = job_of_pod(pod)
    return PodOnNode(node, None if job is None else sys.intern(job), bool(spec.get("nodeName")), dict(requests),
                     priority if isinstance(priority, int) else UNKNOWN_PRIORITY, agent=is_node_agent(pod))  # fmt: skip


def _terminating(pod: Mapping[str, Any] | None) -> bool:
    return bool(pod is not None and (pod.get("metadata") or {}).get("deletionTimestamp"))


class UsageIndex:
    """Requests held per node by bound and admitted pods, and which gated pods wait; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, PodOnNode] = {}  # pod key -> its node, requests, what the backfill reads
        self._on_node: dict[str, set[str]] = {}  # node -> keys of the pods holding room there
        self._present: set[str] = set()  # every pod key the store holds
        self._used: dict[str, dict[str, int]] = {}
        # The part of _used held by pods being deleted (a grace period may last minutes).
        self._terminating: set[str] = set()
        self._freeing: dict[str, dict[str, int]] = {}
        self._waiting: set[str] = set()
        self._gated: set[str] = set()  # at the gang gate, warm spares and finished pods included

    # -- the Store observer -------------------------------------------------------------------
    def changed(self, key: str, new: Slim | None) -> None:
        """The pod under key is now `new` (None: deleted)."""
        held = _held(new) if new is not None else None
        with self._lock:
            self._move(key, held, _terminating(new))
            if new is None:
                self._present.discard(key)
            else:
                self._present.add(key)
            if new is not None and waits_for_admission(new):
                self._waiting.add(key)
            else:
                self._waiting.discard(key)
            if new is not None and is_gated(new):
                self._gated.add(key)
            else:
                self._gated.discard(key)

    def reset(self, pods: Mapping[str, Slim]) -> None:
        """The store was replaced by a fresh list."""
        with self._lock:
            self._held, self._used, self._waiting, self._gated = {}, {}, set(), set()
            self._on_node = {}
            self._terminating, self._freeing = set(), {}
            self._present = set(pods)
            for key, pod in pods.items():
                held = _held(pod)
                if held is not None:
                    self._move(key, held, _terminating(pod))
                if waits_for_admission(pod):
                    self._waiting.add(key)
                if is_gated(pod):
                    self._gated.add(key)

    def _move(self, key: str, held: PodOnNode | None, terminating: bool = False) -> None:
        before = self._held.pop(key, None)
        if before is not None:
            _subtract(self._used, before.node, before.requests)
            keys = self._on_node.get(before.node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._on_node[before.node]
            if key in self._terminating:
                self._terminating.discard(key)
                _subtract(self._freeing, before.node, before.requests)
        if held is not None:
            self._held[key] = held
            self._on_node.setdefault(held.node, set()).add(key)
            add_into(self._used.setdefault(held.node, {}), held.requests.items())
            if terminating:
                self._terminating.add(key)
                add_into(self._freeing.setdefault(held.node, {}), held.requests.items())

    # -- reads --------------------------------------------------------------------------------
    def used(self, in_flight: Assumed | None = None) -> dict[str, dict[str, int]]:
        """Requests held per node (a copy the caller may change), plus the creates in flight the
        store does not hold yet. One lock for both: a reply stored between reading the totals and
        checking which pods are present would otherwise be counted by neither, and its room given
        away twice."""
        with self._lock:
            used = {node: dict(totals) for node, totals in self._used.items()}
            return add_in_flight(used, in_flight or {}, self._present.__contains__)

    def pods_on(self, nodes: Collection[str], in_flight: Assumed | None = None) -> list[PodOnNode]:
        """Every pod holding room on these nodes, bound or admitted and not bound yet, in no order;
        and the creates in flight there the store does not hold yet (no job, priority unknown). One
        lock for both, as in used(): a reply stored between two reads would be in neither."""
        with self._lock:  # by node: the nodes asked about, not every pod in the cluster
            held = self._held
            pods = [held[key] for node in nodes for key in self._on_node.get(node, ())]
            pods.extend(
                PodOnNode(node, None, False, dict(requests), UNKNOWN_PRIORITY)
                for key, (node, requests) in (in_flight or {}).items()
                if node in nodes and key not in self._present
            )
            return pods

    def freeing(self) -> dict[str, dict[str, int]]:
        """The part of used() held by pods being deleted: room that frees up once they stop."""
        with self._lock:
            return {node: dict(totals) for node, totals in self._freeing.items()}

    def unplaced(self, keys: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
        """Of these pod keys: those the store does not hold, and those it holds waiting at the gate."""
        with self._lock:
            return keys - self._present, keys & self._waiting

    def anyone_waits(self) -> bool:
        with self._lock:
            return bool(self._waiting)

    def anyone_gated(self) -> bool:
        """Some pod is held at the gang gate (a warm spare too): else an admission pass has nothing to do."""
        with self._lock:
            return bool(self._gated)


def _subtract(totals_by_node: dict[str, dict[str, int]], node: str, requests: Mapping[str, int]) -> None:
    totals = totals_by_node[node]
    add_into(totals, requests.items(), times=-1)
    for name in [n for n, amount in totals.items() if amount == 0]:
        del totals[name]
    if not totals:
        del totals_by_node[node]
