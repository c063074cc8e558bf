"""Which TrainingJob events need a reconcile (pure).

Every status write, the operator's own included, comes back as a watch event. Only what a reconcile
decides on makes one worth a reconcile: the spec (its generation), the labels, deletion, and the
object itself (a job deleted and re-created by name has a new uid).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def event_marker(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """Equal for two versions of a job that differ in status (or resourceVersion) alone."""
    metadata = body.get("metadata") or {}
    labels = tuple(sorted((metadata.get("labels") or {}).items()))
    return (metadata.get("uid"), metadata.get("generation"), metadata.get("deletionTimestamp"), labels)
