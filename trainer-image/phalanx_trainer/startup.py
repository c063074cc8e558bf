"""When this process reached each start-up phase, for the `startup` section of /progress.

The operator turns these wall-clock times into the phases of a recovery (status.lastRecovery):
rendezvous done, state restored, first step. Each is recorded once, the first time it happens.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

STARTED: Final = "started"
RENDEZVOUS_DONE: Final = "rendezvous_done"
RESTORED: Final = "restored"
FIRST_STEP: Final = "first_step"

_marks: dict[str, str] = {}


def utc_now_ms() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def mark(phase: str) -> None:
    _marks.setdefault(phase, utc_now_ms())


def marks() -> dict[str, str]:
    return dict(_marks)


def reset() -> None:
    """A new run in the same process (tests, a restart in place) starts its own record."""
    _marks.clear()
