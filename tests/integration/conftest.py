"""Fixtures the integration tests share beyond tests/conftest.py's cluster and operator."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from phalanx.devcluster.kueue import (
    KueueError,
    KueueState,
    kueue_state,
    resolve_kueue_dir,
    start_kueue,
    stop_kueue,
)
from tests.conftest import Cluster


@pytest.fixture(scope="module")
def kueue(cluster: Cluster) -> Iterator[KueueState]:
    """Kueue on the session's cluster for this module; unregistered afterwards so later tests see none."""
    try:
        resolve_kueue_dir()
    except KueueError as exc:
        if shutil.which("go") is None:
            pytest.skip(f"Kueue is not built and go is missing to build it: {exc}")
        pytest.fail(str(exc))
    already = kueue_state(cluster.local)  # `phalanx dev up --kueue` with PHALANX_TEST_KUBECONFIG
    state = already or start_kueue(cluster.local)
    try:
        yield state
    finally:
        if already is None:
            stop_kueue(cluster.local, unregister=True)
