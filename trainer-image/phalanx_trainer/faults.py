"""Fault hooks for tests, read from the environment once; nothing happens unless one is set.

PHALANX_FAULT_SLOW_RANK=<rank>:<seconds>  that global rank sleeps this long before each forward
                                          pass (a straggler on purpose: tests/e2e, straggler.py)
"""

from __future__ import annotations

import os
import time
from typing import Final

SLOW_RANK_ENV: Final = "PHALANX_FAULT_SLOW_RANK"


def slow_rank_delay(rank: int, environ: dict[str, str] | None = None) -> float:
    """Seconds this rank is to sleep before each forward pass (0.0: none)."""
    raw = (environ if environ is not None else dict(os.environ)).get(SLOW_RANK_ENV, "")
    if not raw:
        return 0.0
    slow_rank, _, seconds = raw.partition(":")
    try:
        return float(seconds) if int(slow_rank) == rank else 0.0
    except ValueError:
        raise ValueError(f"{SLOW_RANK_ENV}={raw!r}: expected <rank>:<seconds>, such as 1:0.05") from None


def sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)
