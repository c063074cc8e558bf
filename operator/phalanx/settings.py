"""The operator's settings, built once at start from its command line (runner.py) and passed in."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from phalanx import leader


def default_identity() -> str:
    """Unique per process, as client-go's: the pod's name (or host name) and a random suffix."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


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
