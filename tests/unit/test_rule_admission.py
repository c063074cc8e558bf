"""Admission as the job sees it (reconcile/rules/admission.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from tests.unit.lifecycle_fixtures import NODES, NOW, job, pod

pytestmark = pytest.mark.unit


def test_gated_pods_wait_with_the_admission_message() -> None:
    gated = [
        pod(i, phase="Pending", spec={"nodeName": "", "schedulingGates": [{"name": "phalanx.dev/gang"}]})
        for i in (0, 1)
    ]
    status = {"attempt": 0, "createdAttempt": 0, "admissionMessage": "needs 2 pods x 8 nvidia.com/gpu"}
    plan = decide(job(status), gated, NODES, NOW)
    assert plan.status["phase"] == "Pending"
    admitted = next(c for c in plan.status["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "False" and "needs 2 pods" in admitted["message"]


def test_a_gang_with_any_pod_still_gated_waits_even_when_others_are_placed() -> None:
    # An operator stopped half-way through lifting the gates: the gang is not admitted until all are.
    gate = {"nodeName": "", "schedulingGates": [{"name": "phalanx.dev/gang"}]}
    pods = [pod(0), pod(1), pod(2, phase="Pending", spec=gate)]
    status = {"attempt": 0, "createdAttempt": 0, "admissionMessage": "needs 1 pod x 8 nvidia.com/gpu"}
    plan = decide(job(status, replicas=3), pods, NODES, NOW)
    admitted = next(c for c in plan.status["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "False" and plan.status["phase"] == "Pending"
    assert "admittedTime" not in plan.status
