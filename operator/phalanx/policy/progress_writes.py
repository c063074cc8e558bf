"""When a running job's progress is written to its status (pure).

The trainer's /progress is read about once a second, and its step changes with nearly every read.
Written each time, thousands of jobs cost thousands of status writes a second, each one a watch
event for every client. So status.progress is a sample: written at most once per interval, and at
once when a person or a decision needs it fresh: the first report, and a new checkpoint. Phase
changes carry the newest report in the reconcile's own write (controller/reconciler.py). Hang
detection and metrics read the in-memory report, never the status, so they see every step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

DEFAULT_PROGRESS_STATUS_SECONDS: Final = 30.0


def progress_write_due(
    written: Mapping[str, Any] | None,
    written_at: float | None,
    patch: Mapping[str, Any],
    now: float,
    interval: float,
) -> bool:
    """Whether `patch` (status.progress, status.lastCheckpoint) goes to the status now, given what
    was last written and when (monotonic seconds)."""
    if written is None or written_at is None:
        return True  # the first report: the job shows progress as soon as it has any
    if patch == written:
        return False
    if patch.get("lastCheckpoint") != written.get("lastCheckpoint"):
        return True  # a new checkpoint is where a restart resumes: say it at once
    return now - written_at >= interval


def decided_on(stored: Mapping[str, Any], held: Mapping[str, Any] | None) -> dict[str, Any]:
    """The status a decision reads: the stored one with the newest progress the interval held back
    (a disruption's step, and so the redone steps, comes from the trainer's last report)."""
    return {**stored, "progress": dict(held)} if held is not None else dict(stored)


def settle_progress(
    stored: Mapping[str, Any], decided: dict[str, Any], held: Mapping[str, Any] | None
) -> None:
    """After deciding on decided_on(): the write keeps the stored progress while the phase stays
    (the interval still holds the newest back); on a phase change the newest goes with it, or what
    the decision set itself (a finished job's complete progress)."""
    if held is None or decided.get("phase") != stored.get("phase") or decided.get("progress") != held:
        return
    if "progress" in stored:
        decided["progress"] = stored["progress"]
    else:
        decided.pop("progress", None)
