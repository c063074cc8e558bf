"""The dev-node agent's loop against a fake API: what must keep the Node Ready whatever the peer list does."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from phalanx.devnode import agent as agent_module
from phalanx.devnode.agent import Agent, AgentConfig
from phalanx.devnode.node import NodeShape

pytestmark = pytest.mark.unit

NODE = "dev-a"
PEER_POD = {
    "metadata": {"name": "worker-1", "namespace": "ns"},
    "spec": {"hostname": "worker-1", "subdomain": "job", "nodeName": "dev-b"},
    "status": {"podIP": "127.9.8.2", "phase": "Running"},
}


@dataclass
class Raw:
    """What the client returns with _preload_content=False."""

    body: dict[str, Any]

    @property
    def data(self) -> bytes:
        return json.dumps(self.body).encode()


@dataclass
class FakeApi:
    """CoreV1Api and CoordinationV1Api in one: the agent's own pods are none; the peer list answers
    `peer_answers` in turn (the last one repeats); the agent stops after `syncs` of its own lists."""

    peer_answers: list[dict[str, Any] | Exception]
    syncs: int
    wake_after_beat: bool = False
    agent: Agent | None = None
    own_lists: int = 0
    peer_calls: list[dict[str, Any]] = field(default_factory=list)
    beats: int = 0

    def create_node(self, manifest: dict[str, Any], **_: Any) -> Raw:
        return Raw({"metadata": {"uid": "node-uid"}})

    def patch_node_status(self, name: str, body: dict[str, Any], **_: Any) -> None:
        self.beats += 1
        if self.wake_after_beat and self.agent is not None:
            self.agent.wake.set()  # the next pass comes at once, as on a watch event

    def patch_namespaced_lease(self, *_: Any, **__: Any) -> None:
        return None

    def list_pod_for_all_namespaces(self, field_selector: str, **kwargs: Any) -> Raw:
        assert self.agent is not None
        if field_selector.startswith(f"spec.nodeName={NODE}"):
            self.own_lists += 1
            if self.own_lists >= self.syncs:
                self.agent.stopping.set()
            return Raw({"items": []})
        self.peer_calls.append(kwargs)
        answer = self.peer_answers[min(len(self.peer_calls), len(self.peer_answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return Raw(answer)


def run_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: FakeApi, resync: float
) -> tuple[Agent, list[str]]:
    monkeypatch.setattr(agent_module, "build_bind_shim", lambda _directory: None)
    monkeypatch.setattr(agent_module, "check_name_resolution", lambda *_: None)
    monkeypatch.setattr(Agent, "_watch_pods", lambda _self: None)
    logs: list[str] = []
    config = AgentConfig(
        NodeShape(NODE, "1", "1Gi"), tmp_path, "127.9.9", heartbeat_seconds=0.0, resync_seconds=resync
    )
    agent = Agent(client.ApiClient(), config, log=logs.append)
    agent.core = agent.coordination = api
    api.agent = agent
    runner = threading.Thread(target=agent.run, daemon=True)
    runner.start()
    runner.join(timeout=30)
    assert not runner.is_alive(), "the agent loop did not stop"
    return agent, logs


def forbidden() -> ApiException:
    return ApiException(status=403, reason="Forbidden: a node may list only its own pods")


def test_the_node_keeps_its_heartbeat_when_the_peer_pod_list_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeApi([forbidden()], syncs=3)
    _, logs = run_agent(tmp_path, monkeypatch, api, resync=0.01)
    assert api.beats == 1 + 3, api  # the registration's, then one per pass
    assert len(api.peer_calls) >= 2, api
    assert len([line for line in logs if "403" in line]) == 1, logs  # once per new error, not per pass


def test_the_last_peers_stay_in_the_hosts_file_while_the_peer_list_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeApi([{"items": [PEER_POD]}, forbidden()], syncs=3)
    agent, _ = run_agent(tmp_path, monkeypatch, api, resync=0.01)
    assert len(api.peer_calls) >= 2, api
    assert "worker-1.job.ns.svc.cluster.local" in agent.config.hosts_file.read_text()


def test_the_peer_list_runs_at_most_once_per_resync_and_with_a_request_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeApi([{"items": []}], syncs=4, wake_after_beat=True)
    run_agent(tmp_path, monkeypatch, api, resync=60.0)
    assert api.beats == 1 + 4, api
    assert len(api.peer_calls) == 1, api  # four passes woken early, one list
    assert api.peer_calls[0].get("_request_timeout"), api.peer_calls
