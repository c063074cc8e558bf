"""The operator's /readyz against the real control plane: ready once its stores are synced, for the
leader and for the standby alike; /healthz answers while the process is alive."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.ports import free_port
from tests.conftest import Cluster, OperatorProcess, wait_for

pytestmark = pytest.mark.integration


def get(url: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return None  # not listening yet


@pytest.fixture
def two_operators(
    cluster: Cluster, operator_process: OperatorProcess, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    """The session's operator steps aside; two candidates for its lease, each with a health port."""
    operator_process.stop()
    pair = []
    try:
        for index in range(2):
            (tmp_path / f"op{index}").mkdir()
            candidate = OperatorProcess(cluster, tmp_path / f"op{index}", Path(operator_process.kubeconfig))
            candidate.health_port = free_port()  # type: ignore[attr-defined]
            candidate.start(extra_args=["--health-port", str(candidate.health_port),  # type: ignore[attr-defined]
                                        "--health-bind-address", "127.0.0.1"])  # fmt: skip
            pair.append(candidate)
        yield pair
    finally:
        for candidate in pair:
            candidate.stop()


def test_leader_and_standby_are_ready_once_synced(
    cluster: Cluster, two_operators: list[OperatorProcess]
) -> None:
    def readiness() -> list[str] | None:
        answers = [get(f"http://127.0.0.1:{op.health_port}/readyz") for op in two_operators]  # type: ignore[attr-defined]
        if all(a is not None and a[0] == 200 for a in answers):
            return [a[1] for a in answers if a is not None]
        return None

    reasons = wait_for(readiness, timeout=60, what="both operators ready")
    assert sorted("leading" in r for r in reasons) == [False, True], reasons
    assert any("standing by" in r for r in reasons), reasons
    assert all("stores synced" in r for r in reasons), reasons
    for op in two_operators:
        assert get(f"http://127.0.0.1:{op.health_port}/healthz") == (200, "ok\n")  # type: ignore[attr-defined]
