"""The operator's settings, built once at start (cli.py: the command line over the environment) and
passed in: to kopf's memo (runner.py), then to the Controller (handlers.py). Nothing deeper reads
the environment."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from phalanx import constants as c
from phalanx import leader
from phalanx.policy.node_loss import DEFAULT_NODE_LOST_AFTER_SECONDS
from phalanx.policy.progress_url import template_problem
from phalanx.policy.progress_writes import DEFAULT_PROGRESS_STATUS_SECONDS

log = logging.getLogger("phalanx.settings")


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


Clock = Callable[[], float]
"""Wall-clock seconds (API timestamps are wall time); tests pass their own."""

ENV_CLUSTER_DOMAIN: Final = "PHALANX_CLUSTER_DOMAIN"
ENV_ADMIT_ON_CREATION: Final = "PHALANX_ADMIT_ON_CREATION"


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()
    cluster_domain: str = "cluster.local"
    # Pods with a hostPath checkpoint volume are created only then (policy/host_path.py).
    allow_host_path_checkpoints: bool = False
    leader_election: LeaderElection = field(default_factory=LeaderElection)
    # False: every pod is created gated, even when nothing waits (docs/scheduling.md).
    admit_on_creation: bool = True
    # Seconds a node may be not Ready before the gangs with pods there restart (policy/node_loss.py).
    node_lost_after_seconds: float = DEFAULT_NODE_LOST_AFTER_SECONDS
    # The longest wait before a failed reconcile is tried again (doubling from 2 s up to it).
    retry_max_seconds: float = c.RETRY_MAX_SECONDS
    # The least seconds between two status.progress writes of a running job; a new checkpoint and a
    # phase change are written at once (policy/progress_writes.py).
    progress_status_seconds: float = DEFAULT_PROGRESS_STATUS_SECONDS
    # Where /progress is read; only the steady-state bench changes it (constants.py).
    progress_url_template: str = c.PROGRESS_URL_TEMPLATE

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] = os.environ, **from_command_line: Any
    ) -> OperatorSettings:
        """The settings the environment gives (the chart's operator.extraEnv), with the command
        line's on top. The only place the operator reads its settings from the environment
        (failpoints aside: controller/failpoints.py)."""
        from_environment: dict[str, Any] = {
            "cluster_domain": environ.get(ENV_CLUSTER_DOMAIN) or "cluster.local",
            "admit_on_creation": environ.get(ENV_ADMIT_ON_CREATION, "true").lower() != "false",
            "node_lost_after_seconds": node_lost_after_from_env(environ),
            "retry_max_seconds": _positive_seconds(environ, c.ENV_RETRY_MAX_SECONDS, c.RETRY_MAX_SECONDS),
            "progress_url_template": progress_url_template_from_env(environ),
            "progress_status_seconds": _positive_seconds(
                environ, c.ENV_PROGRESS_STATUS_SECONDS, DEFAULT_PROGRESS_STATUS_SECONDS
            ),
        }
        return cls(**{**from_environment, **from_command_line})


def _positive_seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds, such as 60") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r}: expected more than 0 seconds")
    return value


def node_lost_after_from_env(environ: Mapping[str, str] = os.environ) -> float:
    """PHALANX_NODE_LOST_AFTER_SECONDS (docs/reliability.md), else the policy's default."""
    raw = environ.get(c.ENV_NODE_LOST_AFTER, "")
    if not raw:
        return DEFAULT_NODE_LOST_AFTER_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"{c.ENV_NODE_LOST_AFTER}={raw!r}: give a number of seconds >= 0, for example 20")
    return value


def progress_url_template_from_env(environ: Mapping[str, str]) -> str:
    """$PHALANX_PROGRESS_URL_TEMPLATE, checked at start (policy/progress_url.py): a template the
    poller cannot use would fail every poll, and that reads as silence, not as an error."""
    template = environ.get(c.ENV_PROGRESS_URL_TEMPLATE)
    if not template:
        return c.PROGRESS_URL_TEMPLATE
    problem = template_problem(template)
    if problem is not None:
        raise ValueError(
            f"{c.ENV_PROGRESS_URL_TEMPLATE}={template!r} {problem}; give http://{{ip}}:{{port}}/progress "
            "or a stand-in on this machine, as http://127.0.0.1:8000/{ip}/progress"
        )
    log.warning("%s=%r: /progress is read from there, not from the trainers (benchmarks only)",
                c.ENV_PROGRESS_URL_TEMPLATE, template)  # fmt: skip
    return template
