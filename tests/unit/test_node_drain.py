"""A node being emptied (policy/node_drain.py): tainted for removal by an autoscaler, or cordoned."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.policy.node_drain import being_removed, is_cordoned

pytestmark = pytest.mark.unit


def node(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "n1"}, "spec": spec}


@pytest.mark.parametrize(
    ("taint", "why"),
    [
        ({"key": "ToBeDeletedByClusterAutoscaler", "value": "1733", "effect": "NoSchedule"},
         "the cluster autoscaler is removing it"),
        ({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}, "Karpenter is removing it"),
        ({"key": "karpenter.sh/disruption", "value": "disrupting", "effect": "NoSchedule"},
         "Karpenter is removing it"),
    ],
)  # fmt: skip
def test_a_removal_taint_says_the_node_is_going(taint: dict[str, Any], why: str) -> None:
    assert being_removed(node(taints=[taint])) == why


def test_other_taints_a_deletion_candidate_a_cordon_or_an_unknown_node_are_not_a_removal() -> None:
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    candidate = {"key": "DeletionCandidateOfClusterAutoscaler", "value": "1733", "effect": "PreferNoSchedule"}
    assert being_removed(node(taints=[gpu_taint, candidate])) is None
    assert being_removed(node(unschedulable=True)) is None
    assert being_removed(node()) is None and being_removed(None) is None


def test_cordoned_is_spec_unschedulable() -> None:
    assert is_cordoned(node(unschedulable=True))
    assert not is_cordoned(node(unschedulable=False)) and not is_cordoned(node()) and not is_cordoned(None)
