"""One interface per scheduling provider (phalanx/providers/)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from phalanx.api.schema import field_info, parse
from phalanx.api.v1alpha1 import Scheduling, TrainingJobSpec
from phalanx.providers import PROVIDERS, provider_named, provider_of_raw

pytestmark = pytest.mark.unit


def spec(provider: str) -> TrainingJobSpec:
    return parse(TrainingJobSpec, {"replicas": 2, "scheduling": {"provider": provider},
                                   "template": {"spec": {"containers": [{"name": "trainer"}]}}})  # fmt: skip


def shaped(provider: str) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    pod_spec: dict[str, Any] = {}
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    provider_named(provider).shape_pod(pod_spec, labels, annotations, group="j")
    return pod_spec, labels, annotations


def test_every_provider_the_crd_accepts_has_one_module_and_no_other() -> None:
    field = next(f for f in dataclasses.fields(Scheduling) if f.name == "provider")
    assert set(PROVIDERS) == set(field_info(field).enum or ())


def test_only_builtin_admits_gangs_itself_and_gates_the_pods() -> None:
    assert [name for name, p in PROVIDERS.items() if p.admits_gangs] == ["builtin"]
    pod_spec, labels, annotations = shaped("builtin")
    assert pod_spec == {"schedulingGates": [{"name": "phalanx.dev/gang"}]} and not labels and not annotations
    assert provider_named(None) is PROVIDERS["builtin"] and provider_of_raw({}) is PROVIDERS["builtin"]


def test_external_schedulers_get_their_scheduler_name_and_group() -> None:
    pod_spec, labels, annotations = shaped("volcano")
    assert pod_spec["schedulerName"] == "volcano" and annotations == {"scheduling.k8s.io/group-name": "j"}
    pod_spec, labels, annotations = shaped("coscheduling")
    assert pod_spec["schedulerName"] == "scheduler-plugins-scheduler"
    assert labels == {"scheduling.x-k8s.io/pod-group": "j"}


def test_none_touches_nothing_and_only_external_schedulers_get_a_podgroup() -> None:
    assert shaped("none") == ({}, {}, {})
    meta = {"name": "j"}
    assert provider_named("builtin").podgroup(meta, spec("builtin"), {}) is None
    assert provider_named("none").podgroup(meta, spec("none"), {}) is None
    assert provider_named("volcano").podgroup(meta, spec("volcano"), {})["kind"] == "PodGroup"  # type: ignore[index]


def test_an_unknown_provider_names_the_field_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"spec.scheduling.provider='slurm': use one of builtin, volcano"):
        provider_named("slurm")
