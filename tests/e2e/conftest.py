"""A second dev node that a test can lose the way a real node goes (tests/e2e/test_elastic_shrink_e2e.py)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from subprocess import Popen

import pytest

from phalanx.devnode.processes import kill_leftover_group
from tests.conftest import Cluster, RealNode, start_dev_node_agent, stop_dev_node_agent
from tests.e2e.runs import process_start_time

# What the second node advertises: room for one of the demo job's pods (500m each), not two.
LOSABLE_NODE_CPU = "750m"


@dataclass
class LosableNode:
    node: RealNode
    agent: Popen[bytes]
    frozen: dict[int, int] = field(default_factory=dict)  # process group -> its leader's start time

    def pod_groups(self) -> dict[int, int]:
        """The process groups of the containers this agent started and had not seen end (its pid
        files: each container leads a group of its own, its workers in it), with their leaders'
        start times."""
        found = {}
        for pid_file in sorted((self.node.state_dir / "pods").glob("*/*.pid")):
            try:
                pgid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            started = process_start_time(pgid)
            if started is not None:
                found[pgid] = started
        return found

    def lose(self) -> list[int]:
        """The agent is SIGKILLed: no heartbeat, no pod status, no deletion ever confirmed. On one
        machine its pods' processes could still reach their peers, which a lost node's cannot, so
        their whole groups are frozen (SIGSTOP), as on a hung node or behind a partition: alive,
        silent. Returns the groups."""
        self.agent.kill()
        self.agent.wait()
        self.frozen = self.pod_groups()
        for pgid in self.frozen:
            _signal_group(pgid, signal.SIGSTOP)
        return list(self.frozen)

    def clean_up(self, cluster: Cluster) -> None:
        """Nothing of the node outlives the test: its pods' processes (frozen or not), agent, Node."""
        for pgid, started in self.frozen.items():
            if process_start_time(pgid) == started:  # the same process, not a reused pid
                _signal_group(pgid, signal.SIGKILL)
        pods_dir = self.node.state_dir / "pods"
        for pid_file in sorted(pods_dir.glob("*/*.pid")):
            # As the agent itself does at start: only a group whose leader carries the pod's uid.
            kill_leftover_group(pid_file, pid_file.parent.name)
        stop_dev_node_agent(cluster, self.node.name, self.agent)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
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
