"""What a gang's time is counted in, for goodput (policy/goodput.py): its accelerators, or its CPUs
where its pods ask for no accelerator."""

from __future__ import annotations

from typing import Any

from phalanx.builders.pods import accelerator_limits
from phalanx.gang.capacity import effective_requests
from phalanx.gang.quantities import MILLI, parse_quantity

CPU = "cpu"
DEFAULT_CORES_PER_POD = 1.0  # a pod without a CPU request still holds a share of a node


def gang_devices(spec: Any, template_spec: dict[str, Any]) -> tuple[str, float]:
    """(resource, amount for the whole gang): spec.resources' GPUs or MIG slices times replicas,
    else the pod template's CPU request times replicas (one core per pod when it requests none)."""
    unit, per_pod = pod_devices(spec, template_spec)
    return unit, per_pod * spec.replicas


def pod_devices(spec: Any, template_spec: dict[str, Any]) -> tuple[str, float]:
    """(resource, amount for one worker pod, a warm spare alike)."""
    for resource, amount in accelerator_limits(spec).items():
        return resource, float(parse_quantity(amount))
    cpu_milli = effective_requests(template_spec).get(CPU, 0)
    return CPU, cpu_milli / MILLI if cpu_milli else DEFAULT_CORES_PER_POD
