"""A node being emptied (policy/node_drain.py): cordoned, or tainted for removal by an autoscaler."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.policy.node_drain import being_emptied

pytestmark = pytest.mark.unit


def node(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "n1"}, "spec": spec}


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({"unschedulable": True}, "it is cordoned"),
        ({"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1733", "effect": "NoSchedule"}]},
         "the cluster autoscaler is removing it"),
        ({"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}, "Karpenter is removing it"),
        ({"taints": [{"key": "karpenter.sh/disruption", "value": "disrupting", "effect": "NoSchedule"}]},
         "Karpenter is removing it"),
    ],
)  # fmt: skip
def test_a_cordoned_or_removal_tainted_node_is_being_emptied(spec: dict[str, Any], why: str) -> None:
    assert being_emptied(node(**spec)) == why


def test_a_schedulable_node_with_other_taints_or_an_unknown_node_is_not() -> None:
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert being_emptied(node(taints=[gpu_taint], unschedulable=False)) is None
    assert being_emptied(node()) is None
    assert being_emptied(None) is None
