"""TrainingJob manifests for tests (plain dicts, as a user would write them)."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.conftest import Cluster, wait_for

SIM_TERMINATE_AFTER = "phalanx.dev/sim-terminate-after"


def training_job(
    name: str,
    replicas: int = 2,
    gpus: int | None = 1,
    *,
    run_for: str | None = None,
    exit_code: int | None = None,
    terminate_after: str | None = None,
    placement: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A job whose pods kwok 'runs': run_for makes them finish (with exit_code, default 0).

    A deleted pod stays Terminating for its whole grace period (spec.runPolicy.
    terminationGracePeriodSeconds, 60 s by default), as with a kubelet; terminate_after="1s" makes it
    stop that soon instead, like a trainer that exits quickly on SIGTERM (docs/dev-cluster.md)."""
    annotations: dict[str, str] = {}
    if run_for is not None:
        annotations["phalanx.dev/sim-run-for"] = run_for
    if terminate_after is not None:
        annotations[SIM_TERMINATE_AFTER] = terminate_after
    if exit_code is not None:
        annotations["phalanx.dev/sim-exit-code"] = str(exit_code)
    pod_spec: dict[str, Any] = {"containers": [{"name": "trainer", "image": "trainer:test"}]}
    if placement:
        pod_spec.update(copy.deepcopy(placement))
    body: dict[str, Any] = {
        "apiVersion": "phalanx.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "template": {"metadata": {"annotations": annotations}, "spec": pod_spec},
            **spec,
        },
    }
    if gpus is not None:
        body["spec"].setdefault("resources", {})["gpus"] = gpus
    return body


def job_status(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    result = cluster.kubectl("get", "tj", name, "-n", ns, "-o", "json", check=False)
    if result.returncode != 0:
        return {}
    status: dict[str, Any] = json.loads(result.stdout).get("status") or {}
    return status


def job_pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json("pods", "-n", ns, "-l", f"phalanx.dev/job-name={name}")[
        "items"
    ]
    return items


def wait_phase(cluster: Cluster, ns: str, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
    status: dict[str, Any] = wait_for(
        lambda: (s := job_status(cluster, ns, name)).get("phase") == phase and s,
        timeout=timeout,
        what=f"TrainingJob {name} phase {phase}",
    )
    return status
