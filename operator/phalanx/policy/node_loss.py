"""When a node counts as lost, and what that means for the gang pods on it (pure).

A node that stops heartbeating (a network partition, a hung kubelet or GPU driver) is marked
Ready=Unknown by the node lifecycle controller after its grace period (about 40-50 s), and its pods
keep saying Running: nobody is left to update them. Kubernetes evicts them only after their
toleration of the unreachable taint (300 s by default), and nobody confirms that deletion either,
so they stay Terminating until the node returns. A gang with a rank there is not training. The
operator treats such a node as lost once it has been not Ready for `node_lost_after` seconds
(PHALANX_NODE_LOST_AFTER_SECONDS, default DEFAULT_NODE_LOST_AFTER_SECONDS): the gang is disrupted
(a preemption: the infrastructure's fault), and the next attempt does not wait for the pods left
there. Those may still run behind the partition, so the next attempt takes names (and so DNS names
and a rendezvous address) of its own: no two attempts' pods ever share a name.

Called by reconcile/lifecycle.py; docs/reliability.md has the bounds.
"""

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

DEFAULT_NODE_LOST_AFTER_SECONDS: Final = 20.0


def _ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    conditions = (node.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c.get("type") == "Ready"), None)


def not_ready_since(node: Mapping[str, Any]) -> float | None:
    """When the node stopped being Ready (its Ready condition's lastTransitionTime), or None while it
    is Ready or that time is not known (a node that never reported is not lost: it never ran pods)."""
    ready = _ready_condition(node)
    if ready is None or ready.get("status") == "True":
        return None
    stamp = ready.get("lastTransitionTime")
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def seconds_until_lost(node: Mapping[str, Any], now: float, node_lost_after: float) -> float | None:
    """<= 0: the node is lost; > 0: lost after that many seconds unless it recovers; None: Ready."""
    since = not_ready_since(node)
    return None if since is None else since + node_lost_after - now


def lost_node_names(
    nodes: Mapping[str, Mapping[str, Any]], now: float, node_lost_after: float
) -> frozenset[str]:
    """Nodes not Ready for at least node_lost_after seconds."""
    return frozenset(
        name
        for name, node in nodes.items()
        if (left := seconds_until_lost(node, now, node_lost_after)) is not None and left <= 0
    )


def on_lost_node(pod: Mapping[str, Any], nodes: Mapping[str, Any], lost: frozenset[str]) -> bool:
    """Bound to a node that is lost or no longer exists (an empty node map means "not known yet")."""
    node = (pod.get("spec") or {}).get("nodeName")
    return bool(node) and bool(nodes) and (node not in nodes or node in lost)


def attempt_in_names(
    current: Iterable[Mapping[str, Any]], others: Iterable[Mapping[str, Any]], attempt: int
) -> bool:
    """Whether the pods of `attempt` still to be created carry the attempt in their names.

    Plain names (<job>-worker-<i>) while no pod of another attempt exists: the operator waits for
    those, except for pods left on a lost node, which may never go. Once one pod of the attempt
    exists, the others follow its choice, so the whole gang agrees on rank 0's address."""
    suffix = f"-a{attempt}"
    existing = [str((p.get("metadata") or {}).get("name", "")) for p in current]
    if existing:
        return any(name.endswith(suffix) for name in existing)
    return any(True for _ in others)
