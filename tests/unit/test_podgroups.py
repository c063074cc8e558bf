"""PodGroups for external gang schedulers, and the pod fields each scheduler reads (pure builders)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.podgroups import build_podgroup
from phalanx.builders.pods import JobRef, build_worker_pod

pytestmark = pytest.mark.unit

JOB = JobRef(name="llm", namespace="team-a", uid="1234-abcd")


def spec_of(**scheduling: Any) -> TrainingJobSpec:
    raw = {"replicas": 4, "resources": {"gpus": 8}, "template": {"spec": {"containers": [{"name": "trainer"}]}},
           "scheduling": scheduling}  # fmt: skip
    return parse(TrainingJobSpec, raw)


def pod_of(spec: TrainingJobSpec) -> dict[str, Any]:
    pod: dict[str, Any] = build_worker_pod(
        JOB, spec, 0, 0, {"spec": {"containers": [{"name": "trainer", "image": "t"}]}}
    )
    return pod


def test_volcano_podgroup_carries_min_member_queue_priority_and_gang_resources() -> None:
    group = build_podgroup(JOB, spec_of(provider="volcano", queue="research", priorityClassName="high"))
    assert group is not None
    assert (group["apiVersion"], group["kind"]) == ("scheduling.volcano.sh/v1beta1", "PodGroup")
    assert group["metadata"]["name"] == "llm" and group["metadata"]["namespace"] == "team-a"
    assert group["spec"] == {
        "minMember": 4,
        "queue": "research",
        "priorityClassName": "high",
        "minResources": {"nvidia.com/gpu": "32"},
    }
    (owner,) = group["metadata"]["ownerReferences"]
    assert owner["uid"] == "1234-abcd" and owner["controller"] is True and owner["kind"] == "TrainingJob"


def test_volcano_podgroup_leaves_out_unset_queue_and_priority() -> None:
    group = build_podgroup(JOB, spec_of(provider="volcano"))
    assert group is not None and set(group["spec"]) == {"minMember", "minResources"}


def test_coscheduling_podgroup_gangs_every_replica_with_the_gang_timeout() -> None:
    group = build_podgroup(JOB, spec_of(provider="coscheduling", gang={"timeoutSeconds": 120}))
    assert group is not None
    assert (group["apiVersion"], group["kind"]) == ("scheduling.x-k8s.io/v1alpha1", "PodGroup")
    assert group["spec"] == {
        "minMember": 4,
        "scheduleTimeoutSeconds": 120,
        "minResources": {"nvidia.com/gpu": "32"},
    }


def test_coscheduling_podgroup_without_a_gang_timeout_leaves_the_schedulers_default() -> None:
    group = build_podgroup(JOB, spec_of(provider="coscheduling", gang={"timeoutSeconds": 0}))
    assert group is not None and "scheduleTimeoutSeconds" not in group["spec"]


def test_mig_jobs_count_the_mig_resource_in_min_resources() -> None:
    raw = {"replicas": 3, "resources": {"mig": {"profile": "1g.10gb", "count": 2}},
           "template": {"spec": {"containers": [{"name": "trainer"}]}}, "scheduling": {"provider": "volcano"}}  # fmt: skip
    group = build_podgroup(JOB, parse(TrainingJobSpec, raw))
    assert group is not None and group["spec"]["minResources"] == {"nvidia.com/mig-1g.10gb": "6"}


@pytest.mark.parametrize("provider", ["builtin", "none"])
def test_builtin_and_none_create_no_podgroup(provider: str) -> None:
    assert build_podgroup(JOB, spec_of(provider=provider)) is None


def test_pods_name_their_scheduler_and_group_per_provider() -> None:
    volcano = pod_of(spec_of(provider="volcano"))
    assert volcano["spec"]["schedulerName"] == "volcano"
    assert volcano["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "llm"
    cosched = pod_of(spec_of(provider="coscheduling"))
    assert cosched["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert cosched["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "llm"
    for pod in (volcano, cosched, pod_of(spec_of(provider="none"))):
        assert not pod["spec"].get("schedulingGates")
    builtin = pod_of(spec_of(provider="builtin"))
    assert builtin["spec"]["schedulingGates"] == [{"name": "phalanx.dev/gang"}]
    assert "schedulerName" not in builtin["spec"]
