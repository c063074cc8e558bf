"""hostPath checkpoint volumes are refused unless the operator was started to allow them (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.policy.host_path import ALLOW_FLAG, FIELD, host_path_refusal

pytestmark = pytest.mark.unit


def spec(volume: dict[str, Any] | None) -> TrainingJobSpec:
    checkpoint = {"volume": volume} if volume is not None else {}
    return parse(
        TrainingJobSpec,
        {
            "replicas": 2,
            "checkpoint": checkpoint,
            "template": {"spec": {"containers": [{"name": "trainer"}]}},
        },
    )


HOST_PATH = {"hostPath": {"path": "/var/ckpt", "type": "DirectoryOrCreate"}}


def test_a_host_path_checkpoint_volume_is_refused_naming_the_field_and_the_fix() -> None:
    message = host_path_refusal(spec(HOST_PATH), allowed=False)
    assert message is not None
    assert FIELD == "spec.checkpoint.volume.hostPath" and FIELD in message
    assert ALLOW_FLAG == "--allow-host-path-checkpoints" and ALLOW_FLAG in message
    assert "persistentVolumeClaim" in message  # what to use instead
    assert "allowHostPathCheckpoints" in message  # the chart's value that sets the flag


def test_a_host_path_checkpoint_volume_passes_when_allowed() -> None:
    assert host_path_refusal(spec(HOST_PATH), allowed=True) is None


@pytest.mark.parametrize(
    "volume",
    [None, {"persistentVolumeClaim": {"claimName": "ckpt"}}, {"emptyDir": {}}, {"nfs": {"server": "s"}}],
)
def test_other_checkpoint_volumes_are_never_refused(volume: dict[str, Any] | None) -> None:
    assert host_path_refusal(spec(volume), allowed=False) is None
