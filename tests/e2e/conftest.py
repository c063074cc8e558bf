"""A second dev node that a test can lose the way a real node goes (tests/e2e/test_elastic_shrink_e2e.py)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

import pytest

from tests.conftest import Cluster, RealNode, start_dev_node_agent, stop_dev_node_agent

# What the second node advertises: room for one of the demo job's pods (500m each), not two.
LOSABLE_NODE_CPU = "750m"


@dataclass
class LosableNode:
    node: RealNode
    agent: Popen[bytes]
    frozen: list[int] = field(default_factory=list)

    def pod_processes(self) -> list[int]:
        """Pids of the processes of pods this agent started (their environment names its hosts file)."""
        marker = f"NSS_WRAPPER_HOSTS={self.node.state_dir / 'hosts'}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in environ:
                found.append(int(proc.name))
        return found

    def lose(self) -> list[int]:
        """The agent is SIGKILLed: no heartbeat, no pod status, no deletion ever confirmed. On one
        machine its pods' processes could still reach their peers, which a lost node's cannot, so they
        are frozen (SIGSTOP), as on a hung node or behind a partition: alive, silent. Returns them."""
        self.agent.kill()
        self.agent.wait()
        self.frozen = self.pod_processes()
        for pid in self.frozen:
            _signal(pid, signal.SIGSTOP)
        return self.frozen

    def clean_up(self, cluster: Cluster) -> None:
        """Nothing of the node outlives the test: its pods' processes (frozen or not), agent, Node."""
        for pid in {*self.frozen, *self.pod_processes()}:
            _signal(pid, signal.SIGKILL)
        stop_dev_node_agent(cluster, self.node.name, self.agent)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass  # gone already


@pytest.fixture
def losable_node(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LosableNode]:
    """A dev node of the test's own (name, state dir, pod addresses), with room for one demo pod."""
    name = f"losable-{uuid.uuid4().hex[:6]}"
    state_dir = tmp_path_factory.mktemp("losable-devnode")
    agent = start_dev_node_agent(cluster, name, state_dir, ["--cpu", LOSABLE_NODE_CPU])
    node = LosableNode(RealNode(name, state_dir), agent)
    try:
        yield node
    finally:
        node.clean_up(cluster)
