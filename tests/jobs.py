"""TrainingJob manifests for tests (plain dicts, as a user would write them)."""

from __future__ import annotations

import copy
from typing import Any


def training_job(
    name: str,
    replicas: int = 2,
    gpus: int | None = 1,
    *,
    run_for: str | None = None,
    exit_code: int | None = None,
    placement: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A job whose pods kwok 'runs': run_for makes them finish (with exit_code, default 0)."""
    annotations: dict[str, str] = {}
    if run_for is not None:
        annotations["phalanx.dev/sim-run-for"] = run_for
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
