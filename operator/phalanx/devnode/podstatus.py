"""Pod status as a kubelet would report it, from what the agent knows of each container (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

NODE_AGENT_RESTARTED = "NodeAgentRestarted"
IMAGE_ID = "phalanx-devnode://local-process"


def rfc3339(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ContainerState:
    """One container: not started (started_at None), running, or terminated (exit_code set)."""

    name: str
    image: str
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""

    @property
    def terminated(self) -> bool:
        return self.exit_code is not None

    @property
    def running(self) -> bool:
        return self.started_at is not None and not self.terminated


def terminated_reason(exit_code: int) -> str:
    """The kubelet's words: Completed for 0, OOMKilled is unknowable here, otherwise Error."""
    return "Completed" if exit_code == 0 else "Error"


def exit_code_of(returncode: int) -> int:
    """Popen says -N for death by signal N; a container runtime reports 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def container_status(state: ContainerState) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": state.name,
        "image": state.image,
        "imageID": IMAGE_ID,
        "restartCount": 0,
        "ready": state.running,
        "started": state.running,
    }
    if state.terminated:
        assert state.exit_code is not None
        terminated: dict[str, Any] = {
            "exitCode": state.exit_code,
            "reason": state.reason or terminated_reason(state.exit_code),
            "finishedAt": rfc3339(state.finished_at or 0.0),
        }
        if state.started_at is not None:
            terminated["startedAt"] = rfc3339(state.started_at)
        if state.message:
            terminated["message"] = state.message
        status["state"] = {"terminated": terminated}
    elif state.running:
        assert state.started_at is not None
        status["state"] = {"running": {"startedAt": rfc3339(state.started_at)}}
    else:
        waiting = {"reason": state.reason or "ContainerCreating"}
        if state.message:
            waiting["message"] = state.message
        status["state"] = {"waiting": waiting}
    return status


def pod_phase(states: Sequence[ContainerState]) -> str:
    """restartPolicy Never: Succeeded when all exited 0, Failed when all ended and one did not."""
    if states and all(s.terminated for s in states):
        return "Succeeded" if all(s.exit_code == 0 for s in states) else "Failed"
    if any(s.started_at is not None for s in states):
        return "Running"
    return "Pending"


def _condition(kind: str, true: bool, now: str, reason: str = "") -> dict[str, Any]:
    condition = {"type": kind, "status": "True" if true else "False", "lastTransitionTime": now}
    if reason:
        condition["reason"] = reason
    return condition


def pod_status(
    states: Sequence[ContainerState],
    pod_ip: str,
    host_ip: str,
    start_time: float,
    now: float,
    reason: str = "",
    message: str = "",
) -> dict[str, Any]:
    """The status subresource body; conditions merge by type, containers by name."""
    phase = pod_phase(states)
    all_running = bool(states) and all(s.running for s in states)
    stamp = rfc3339(now)
    not_ready_reason = (
        "" if all_running else ("PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady")
    )
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": rfc3339(start_time),
        "conditions": [
            _condition("PodScheduled", True, stamp),
            _condition("Initialized", True, stamp),
            _condition("ContainersReady", all_running, stamp, not_ready_reason),
            _condition("Ready", all_running, stamp, not_ready_reason),
        ],
        "containerStatuses": [container_status(s) for s in states],
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return status


def orphan_status(pod: Mapping[str, Any], now: float) -> dict[str, Any]:
    """A pod this agent's previous run started and no process of which survives: Failed, saying why."""
    containers = (pod.get("spec") or {}).get("containers") or []
    message = "the dev node agent restarted and no longer runs this pod's processes"
    states = [
        ContainerState(
            c["name"], c.get("image", ""), finished_at=now, exit_code=137, reason=NODE_AGENT_RESTARTED
        )
        for c in containers
    ]
    status = pod_status(states, "", "", now, now, NODE_AGENT_RESTARTED, message)
    del status["startTime"]
    status.pop("hostIP")
    status.pop("hostIPs")
    return status
