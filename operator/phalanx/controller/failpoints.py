"""Test hooks that crash the operator or drop a write at a chosen moment, the way a real failure
would. The integration tests set them in the operator's environment; every one of them lives here,
and none is read anywhere else.

- PHALANX_FAILPOINT_EXIT_AFTER_PODS=N: exit after the N-th pod creation (tests/integration/test_reconcile.py).
- PHALANX_FAILPOINT_EXIT_AFTER_ADMITS=N: exit after lifting N gates, half-way through admitting a
  gang (tests/integration/test_gang.py).
- PHALANX_FAILPOINT_LOSE_STATUS_WRITE=Failed,Restarting: the first reconcile status write per job
  that moves it to one of those phases fails before it reaches the API server, as a dropped
  connection would (tests/integration/test_reliability.py).
- PHALANX_FAILPOINT_EXIT_AFTER_DECISION_WRITE=Resize,Resized: exit right after the status write that
  precedes a reconcile's deletions and creations, when it recorded a restart to grow (Resize) or a
  new elastic attempt sized differently from the one before (Resized), before any pod is deleted or
  created (tests/integration/test_elastic.py).
- PHALANX_FAILPOINT_LAUNCHER_ADDRESS=HOST:PORT: every POST /generation goes there instead of the
  pod's address: kwok's pods run no resident launcher, so a stand-in in the test answers for them
  (tests/integration/test_spares.py; it tells the pods apart by their control tokens).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

log = logging.getLogger("phalanx.controller")

EXIT_AFTER_PODS: Final = "PHALANX_FAILPOINT_EXIT_AFTER_PODS"
EXIT_AFTER_ADMITS: Final = "PHALANX_FAILPOINT_EXIT_AFTER_ADMITS"
LOSE_STATUS_WRITE: Final = "PHALANX_FAILPOINT_LOSE_STATUS_WRITE"
EXIT_AFTER_DECISION_WRITE: Final = "PHALANX_FAILPOINT_EXIT_AFTER_DECISION_WRITE"
LAUNCHER_ADDRESS: Final = "PHALANX_FAILPOINT_LAUNCHER_ADDRESS"
EXIT_CODE: Final = 3

_pods_created_here = 0
_pods_admitted_here = 0
_status_writes_lost: set[tuple[str, str]] = set()


def counts_pod_creations() -> bool:
    """The pod-creation failpoint is set: create one by one, so that it counts them in order."""
    return bool(os.environ.get(EXIT_AFTER_PODS))


def counts_admits() -> bool:
    """The admit failpoint is set: lift gates one by one, so that it counts them in order."""
    return bool(os.environ.get(EXIT_AFTER_ADMITS))


def after_pod_create() -> None:
    global _pods_created_here
    limit = os.environ.get(EXIT_AFTER_PODS)
    _pods_created_here += 1
    if limit and _pods_created_here >= int(limit):
        log.error("failpoint: exiting after %d pod creations", _pods_created_here)
        os._exit(EXIT_CODE)


def after_admit() -> None:
    global _pods_admitted_here
    limit = os.environ.get(EXIT_AFTER_ADMITS)
    _pods_admitted_here += 1
    if limit and _pods_admitted_here >= int(limit):
        log.error("failpoint: exiting after lifting %d gates", _pods_admitted_here)
        os._exit(EXIT_CODE)


def lose_status_write(key: str, patch: dict[str, Any]) -> None:
    phases = os.environ.get(LOSE_STATUS_WRITE)
    phase = patch.get("phase")
    if not phases or phase not in phases.split(",") or (key, phase) in _status_writes_lost:
        return
    _status_writes_lost.add((key, phase))
    log.error("failpoint: status write of %s to %s lost", key, phase)
    raise ConnectionResetError(f"failpoint: status write of {key} to {phase} lost")


def after_decision_write(old: dict[str, Any], new: dict[str, Any]) -> None:
    """`new` was just written over `old`, before the deletions and creations it decided."""
    moments = set((os.environ.get(EXIT_AFTER_DECISION_WRITE) or "").split(","))
    resize = (
        new.get("phase") == "Restarting"
        and old.get("phase") != "Restarting"
        and any(
            c.get("type") == "Restarting" and c.get("status") == "True" and c.get("reason") == "Resize"
            for c in new.get("conditions") or []
        )
    )
    resized = (
        isinstance(old.get("currentReplicas"), int)
        and new.get("sizedAttempt") != old.get("sizedAttempt")
        and new.get("currentReplicas") != old.get("currentReplicas")
    )
    if ("Resize" in moments and resize) or ("Resized" in moments and resized):
        log.error("failpoint: exiting after the status write of %s", "a grow" if resize else "a new size")
        os._exit(EXIT_CODE)


def launcher_address(ip: str, port: int) -> tuple[str, int]:
    """Where a resident launcher's control server is reached: the pod's, or the stand-in's."""
    override = os.environ.get(LAUNCHER_ADDRESS)
    if not override:
        return ip, port
    host, _, stand_in = override.rpartition(":")
    return host, int(stand_in)
