"""The operator's settings, built once at start from its command line (runner.py) and passed in."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from phalanx import constants as c
from phalanx import leader
from phalanx.policy.node_loss import DEFAULT_NODE_LOST_AFTER_SECONDS


def default_identity() -> str:
    """The pod's name: unique among live pods, and kept when the kubelet restarts a crashed
    container, which then renews its own lease at once instead of waiting for it to expire.
    Outside a pod: the host name and a random suffix, unique per process."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaderElection:
    enabled: bool = True
    namespace: str = field(default_factory=lambda: os.environ.get("POD_NAMESPACE") or "default")
    lease_name: str = "phalanx-operator"
    identity: str = field(default_factory=default_identity)
    lease_duration_seconds: int = leader.LEASE_DURATION_SECONDS
    renew_deadline_seconds: float = leader.RENEW_DEADLINE_SECONDS
    retry_period_seconds: float = leader.RETRY_PERIOD_SECONDS


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()
    cluster_domain: str = "cluster.local"
    leader_election: LeaderElection = field(default_factory=LeaderElection)


def node_lost_after_from_env() -> float:
    """PHALANX_NODE_LOST_AFTER_SECONDS (docs/reliability.md), else the policy's default."""
    raw = os.environ.get(c.ENV_NODE_LOST_AFTER, "")
    if not raw:
        return DEFAULT_NODE_LOST_AFTER_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"{c.ENV_NODE_LOST_AFTER}={raw!r}: give a number of seconds >= 0, for example 20")
    return value
