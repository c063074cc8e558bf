"""Which objects a TrainingJob may treat as its own: one rule for pods, the Service and PodGroups.

Its own is what it controls: an ownerReference with `controller: true` and the job's uid. Anything
else that holds a name the job needs, another owner's object or one with no controller at all,
whatever its labels, is a name conflict: never adopted, deleted, counted or evicted, and reported
the same way (PodsCreated=False, reason NameConflict, and a Warning event). Labels alone prove
nothing: a job of the same name deleted with `--cascade=orphan` leaves pods that carry its labels and
another job's uid in their environment (batch/v1 Job selects by its controller's uid for this reason).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def controller_uid(obj: Mapping[str, Any]) -> str:
    """The uid of the object's controlling owner; "" when it has none."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((str(o.get("uid")) for o in owners if o.get("controller") is True), "")


def is_owned_by(obj: Mapping[str, Any], job_uid: str) -> bool:
    return bool(job_uid) and controller_uid(obj) == job_uid
