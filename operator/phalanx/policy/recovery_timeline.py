"""The timeline of a job's last recovery (status.lastRecovery), pure.

A recovery starts when a reconcile restarts the gang (a new attempt after a preemption, an eviction,
a lost node or a retryable failure) and ends at the first training step of the new attempt. Its
phases, each the time since the disruption was seen, in the order they happen:

  podsStopped     the old attempt's pods are gone (they were saving the SIGTERM checkpoint)
  podsRunning     every pod of the new attempt runs
  rendezvousDone  the trainer's process group is up               (reported by the trainer)
  stateRestored   the checkpoint is loaded                       (reported by the trainer)
  firstStep       the first optimizer step of the new attempt     (reported by the trainer)

The operator sees the first two in pod and job status; the trainer reports the others in its
/progress document (`startup`, wall-clock times). The trainer's clock is another machine's: a phase
is never allowed to fall before the disruption or before the phase ahead of it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Final, TypeGuard

from phalanx import constants as c
from phalanx.pod_facts import restarted_in_place, spare_ranks

PHASES: Final = ("podsStopped", "podsRunning", "rendezvousDone", "stateRestored", "firstStep")
OPERATOR_PHASES: Final = PHASES[:2]
# /progress `startup` keys (docs/environment.md) -> phase
TRAINER_PHASES: Final = {
    "rendezvous_done": "rendezvousDone",
    "restored": "stateRestored",
    "first_step": "firstStep",
}
PATH_FULL_RESTART: Final = c.RESTART_STRATEGY_FULL
PATH_IN_PLACE: Final = c.RESTART_STRATEGY_IN_PLACE
PATH_IN_PLACE_SPARE: Final = c.RECOVERY_PATH_IN_PLACE_SPARE
TRAINER_REPORT_GRACE_SECONDS: Final = 300.0  # after podsRunning, how long to wait for the trainer's phases


def iso_ms(ts: float) -> str:
    """RFC 3339 with milliseconds: a recovery's phases are seconds apart."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_time(value: str | None) -> float | None:
    """RFC 3339 as the operator and the trainer write it (with or without a fraction)."""
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _restarts_total(status: Mapping[str, Any]) -> int:
    restarts = status.get("restarts") or {}
    return sum(int(restarts.get(cause, 0) or 0) for cause in ("failures", "preemptions", "hangs"))


def _restart_reason(status: Mapping[str, Any]) -> str:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Restarting" and condition.get("status") == "True":
            return str(condition.get("reason") or "Restarting")
    return "Restarting"


def recovery_path(status: Mapping[str, Any]) -> str:
    """InPlace while the current attempt keeps pods of the one before (status.inPlace), InPlaceSpare
    when a warm spare took a lost rank in it, else FullRestart."""
    if not restarted_in_place(status):
        return PATH_FULL_RESTART
    return PATH_IN_PLACE_SPARE if spare_ranks(status) else PATH_IN_PLACE


def is_complete(recovery: Mapping[str, Any] | None) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(recovery, Mapping) and "firstStep" in (recovery.get("phasesMilliseconds") or {})


def restart_counted(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """The attempt moved on and a restart was counted (not a resume, not a gang timeout)."""
    moved_on = int(new.get("attempt") or 0) > int(old.get("attempt") or 0)
    return moved_on and _restarts_total(new) > _restarts_total(old)


def after_reconcile(old: Mapping[str, Any], new: Mapping[str, Any], now: float) -> dict[str, Any] | None:
    """The lastRecovery the new status should carry, or None to leave it as it is.

    A restart (the attempt moves on and a restart is counted: not a resume, not a gang timeout)
    opens a new timeline; the phases the operator sees are stamped the first time they hold."""
    if restart_counted(old, new):
        opened: dict[str, Any] = {
            "attempt": int(new.get("attempt") or 0),
            "reason": _restart_reason(new),
            "path": recovery_path(new),
            "disruptedTime": iso_ms(now),
            "phasesMilliseconds": {},
        }
        step = (old.get("progress") or {}).get("step")
        if isinstance(step, int):
            opened["stepAtDisruption"] = step  # the last step reported: redone work counts from it
        return opened
    recovery = new.get("lastRecovery")
    if not recovery or is_complete(recovery):
        return None
    if recovery.get("attempt") != new.get("attempt"):
        # The recovering attempt was torn down uncounted (a gang timeout, a suspension): the same
        # recovery goes on with the next attempt, whose pods have to run again.
        phases = {k: v for k, v in (recovery.get("phasesMilliseconds") or {}).items() if k == "podsStopped"}
        # An in-place restart that fell back goes on as a full one.
        return {
            **recovery,
            "attempt": new.get("attempt"),
            "path": recovery_path(new),
            "phasesMilliseconds": phases,
        }
    seen = {
        "podsStopped": new.get("phase") != "Restarting",
        "podsRunning": new.get("phase") == "Running",
    }
    stamped = _stamp(recovery, {phase: now for phase, holds in seen.items() if holds})
    current = stamped or recovery
    running = (current.get("phasesMilliseconds") or {}).get("podsRunning")
    disrupted = parse_time(current.get("disruptedTime"))
    if (
        running is not None
        and disrupted is not None
        and now - (disrupted + running / 1000) > TRAINER_REPORT_GRACE_SECONDS
    ):
        # No start-up report from the trainer (an image without /progress): the timeline ends when
        # its pods ran, rather than staying open and counting every later second as recovery.
        return _stamp(current, {"firstStep": disrupted + running / 1000}, {"trainerReported": False})
    return stamped


def after_trainer_report(
    recovery: Mapping[str, Any] | None, report: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Adds the phases the trainer reported for the recovering attempt; None when nothing changes."""
    if not recovery or is_complete(recovery) or report.get("attempt") != recovery.get("attempt"):
        return None
    startup = report.get("startup") or {}
    times = {phase: parse_time(startup.get(key)) for key, phase in TRAINER_PHASES.items()}
    found = {phase: at for phase, at in times.items() if at is not None}
    if not found:
        return None
    # A trainer that reports means the pods were stopped and running, whatever the operator missed.
    earliest = min(found.values())
    resumed = report.get("resumed_from_step")
    extra = {"resumedFromStep": resumed} if isinstance(resumed, int) and not isinstance(resumed, bool) else {}
    return _stamp(recovery, {**dict.fromkeys(OPERATOR_PHASES, earliest), **found}, extra)


def _stamp(
    recovery: Mapping[str, Any], seen_at: Mapping[str, float], extra: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    disrupted = parse_time(recovery.get("disruptedTime"))
    if disrupted is None:
        return None
    phases = dict(recovery.get("phasesMilliseconds") or {})
    floor = 0
    changed = False
    for phase in PHASES:
        if phase in phases:
            floor = max(floor, int(phases[phase]))
            continue
        at = seen_at.get(phase)
        if at is None:
            continue
        phases[phase] = max(floor, int(round((at - disrupted) * 1000)))
        floor = phases[phase]
        changed = True
    extra = {k: v for k, v in (extra or {}).items() if recovery.get(k) != v}
    if not changed and not extra:
        return None
    updated = {**recovery, "phasesMilliseconds": phases, **extra}
    if "firstStep" in phases:
        updated["summary"] = summary(updated)
    return updated


def summary(recovery: Mapping[str, Any]) -> str:
    """One line for `kubectl describe` and the Event: the total, then when each phase was done."""
    phases = recovery.get("phasesMilliseconds") or {}
    done = [f"{phase} {phases[phase] / 1000:.1f}s" for phase in PHASES if phase in phases]
    total = phases.get("firstStep")
    head = f"recovered in {total / 1000:.1f}s" if total is not None else "recovering"
    if recovery.get("trainerReported") is False:
        head += " (no trainer report: up to its pods running)"
    return (
        f"{head} ({recovery.get('reason', 'Restarting')}, attempt {recovery.get('attempt')}): "
        + ", ".join(done)
    )


def phase_durations(recovery: Mapping[str, Any]) -> dict[str, float]:
    """Seconds spent in each phase (from the one before it), for the per-phase histogram."""
    phases = recovery.get("phasesMilliseconds") or {}
    out: dict[str, float] = {}
    previous = 0
    for phase in PHASES:
        if phase in phases:
            out[phase] = max(0, int(phases[phase]) - previous) / 1000
            previous = int(phases[phase])
    return out
