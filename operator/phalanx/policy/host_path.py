"""hostPath checkpoint volumes need the operator's consent (pure).

A node directory outlives the job and is shared with every pod that lands on that node, and the
operator writes pods with its own rights: on a shared cluster that is a way onto the node's disk.
So the operator creates pods with a hostPath checkpoint volume only when started with
--allow-host-path-checkpoints (the dev cluster, the tests and the demo; off in the chart).
"""

from __future__ import annotations

from phalanx.api.v1alpha1 import TrainingJobSpec

FIELD = "spec.checkpoint.volume.hostPath"
ALLOW_FLAG = "--allow-host-path-checkpoints"
CHART_VALUE = "operator.allowHostPathCheckpoints"
# PodsCreated=False reason (and the Warning event's) of a refused job.
REASON_HOST_PATH_NOT_ALLOWED = "HostPathNotAllowed"


def host_path_refusal(spec: TrainingJobSpec, allowed: bool) -> str | None:
    """Why the job's pods may not be created; None when nothing in the spec stops them."""
    volume = spec.checkpoint.volume
    if allowed or volume is None or volume.host_path is None:
        return None
    return (
        f"{FIELD} is not allowed: this operator runs without {ALLOW_FLAG} (Helm value {CHART_VALUE}), "
        "since a node directory outlives the job and is shared with every pod on that node; use "
        "spec.checkpoint.volume.persistentVolumeClaim instead, or start the operator with "
        f"{ALLOW_FLAG} (single-node development)"
    )
