"""When a running job's progress is written to its status (pure).

The trainer's /progress is read often, and its step changes with nearly every read. Written each
time, thousands of jobs cost thousands of status writes a second, each one a watch event for every
client. So status.progress is a sample: the poller writes it at once only when a person or a
decision needs it fresh (the first report, a new checkpoint); otherwise it holds the newest back.
The reconcile's own write carries it (controller/reconciler.py): on a phase change, with any other
change, and once the interval has passed since the last sample, with the goodput booking
(policy/goodput.py) in the same write, so a running job costs one periodic write, not two. The
resync brings that reconcile; an interval shorter than the resync period has the poller wake it.
Hang detection and metrics read the in-memory report, never the status, so they see every step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

DEFAULT_PROGRESS_STATUS_SECONDS: Final = 30.0


def progress_write_due(written: Mapping[str, Any] | None, patch: Mapping[str, Any]) -> bool:
    """Whether the poller writes `patch` (status.progress, status.lastCheckpoint) itself, at once,
    given what was last written; else it is held back for the reconcile's write."""
    if written is None:
        return True  # the first report: the job shows progress as soon as it has any
    if patch == written:
        return False
    # A new checkpoint is where a restart resumes (and an elastic gang's growth reads it): say it at once.
    return patch.get("lastCheckpoint") != written.get("lastCheckpoint")


def sample_due(written_at: float | None, now: float, interval: float) -> bool:
    """Whether the held-back progress is due for the status: the interval has passed since the last
    sample was written (monotonic seconds)."""
    return written_at is None or now - written_at >= interval


def poller_wakes_reconcile(interval: float, resync_seconds: float) -> bool:
    """Whether the poller enqueues the reconcile when a sample is due, rather than leave it to the
    resync: only for an interval shorter than the resync period (the e2e tests sample each second)."""
    return interval < resync_seconds


def decided_on(stored: Mapping[str, Any], held: Mapping[str, Any] | None) -> dict[str, Any]:
    """The status a decision reads: the stored one with the newest progress the interval held back
    (a disruption's step, and so the redone steps, comes from the trainer's last report)."""
    return {**stored, "progress": dict(held)} if held is not None else dict(stored)


def settle_progress(
    stored: Mapping[str, Any], decided: dict[str, Any], held: Mapping[str, Any] | None, due: bool = False
) -> None:
    """After deciding on decided_on(): the newest progress goes with the write when the sample is
    `due` (sample_due) or the status is written anyway (a phase change, a goodput booking, a
    condition: it costs nothing there); else the write keeps the stored progress. What the decision
    set itself (a finished job's complete progress) wins."""
    if held is None or due or decided.get("progress") != held:
        return
    if any(decided.get(k) != stored.get(k) for k in {*decided, *stored} - {"progress"}):
        return
    if "progress" in stored:
        decided["progress"] = stored["progress"]
    else:
        decided.pop("progress", None)
