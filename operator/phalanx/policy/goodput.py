"""Goodput and device time per job (status.goodput), pure: what waiting and disruptions cost.

Time is counted in device-seconds of the whole gang: the pods' accelerator request (GPUs or MIG
slices) times the replicas, or their CPU request where they ask for no accelerator (then `unit`
says "cpu"). Each reconcile books the time since the last one to what the job was doing meanwhile,
as its previous status says:

  waitingForAdmission  Pending before the first run: nothing held, nothing trained
  startup              the first attempt is admitted, or runs with its first step not done yet
                       (imports, rendezvous): the latter known only from a trainer that reports
                       it (/progress `startup`)
  recovery             from a disruption to the first step after it (status.lastRecovery open)
  allocated            pods hold their devices: Admitted, Running, Restarting
  productive           Running with no recovery open, less redone steps and checkpoint stalls
  standbySpares        warm spares (spec.spares) standing by on a node: devices held, nothing trained

Redone steps are those trained after the checkpoint a recovery resumed from and lost with the
disrupted attempt (booked when the recovery completes: the last step reported before the disruption
less the step the trainer resumed from). Checkpoint stalls are the seconds
the trainer's loop waited for a save (reported in /progress). Each total is shown in whole
device-seconds; the fraction below one is carried in remainderMilliseconds, so bookings shorter
than a second (a 0.3 s stall, eight 40 ms steps redone) add up instead of rounding away. goodput = productive / (devices x
wall time since the job was created, plus the spares' standby): start-up, waiting, recovery, redone
work, saves and the devices spares hold all count against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from phalanx.policy.recovery_timeline import is_complete, iso_ms, parse_time, restart_counted

HOLDING_PHASES: Final = ("Admitted", "Running", "Restarting")
LOST_CAUSES: Final = (
    "waitingForAdmission",
    "startup",
    "recovery",
    "redoneSteps",
    "checkpointStalls",
    "standbySpares",
)
TOTALS: Final = ("allocated", "productive", *LOST_CAUSES)
FINISHED: Final = ("Succeeded", "Failed")
# Status writes are what this costs: book at each phase change, else at most this often or with the
# reconcile's progress sample (policy/progress_writes.py: one periodic write for both), and only
# while the gang holds devices (a queued or suspended job's ledger waits for its next phase change).
REFRESH_SECONDS: Final = 30.0
MIN_STALL_SECONDS: Final = 0.01  # stall reports below this wait for the next booking
# How long the first attempt may run before its trainer's first report: until then its time is not
# booked (it may be start-up); a trainer that never reports gets it booked as productive.
FIRST_REPORT_GRACE_SECONDS: Final = 300.0


@dataclass(frozen=True)
class Devices:
    unit: str  # the resource counted: nvidia.com/gpu, a MIG profile, or cpu
    count: float  # for the whole gang
    spares: float = 0.0  # held by its warm spares standing by on nodes now (not one taking a rank)


@dataclass(frozen=True)
class TrainerFacts:
    """From the trainer's /progress, for the attempt it ran."""

    attempt: int
    first_step_at: float | None = None  # wall clock; None: not done yet
    seconds_per_step: float | None = None
    checkpoint_stall_seconds: float | None = None


def device_seconds(ledger: Mapping[str, Any], cause: str) -> float:
    """A cause's device-seconds: the whole seconds shown and the fraction carried."""
    carried = (ledger.get("remainderMilliseconds") or {}).get(cause) or 0
    return float(ledger.get(f"{cause}Seconds") or 0) + float(carried) / 1000


def _shown_and_carried(totals: Mapping[str, float]) -> tuple[dict[str, int], dict[str, int]]:
    seconds: dict[str, int] = {}
    carried: dict[str, int] = {}
    for cause, total in totals.items():
        seconds[cause], carried[cause] = divmod(max(0, round(total * 1000)), 1000)
    return seconds, carried


def account(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    created: float,
    now: float,
    devices: Devices,
    trainer: TrainerFacts | None = None,
    written_anyway: bool = False,
) -> dict[str, Any] | None:
    """The status.goodput the new status should carry, or None when there is nothing to book yet
    (no phase change, restart, recovery or stall to book, and less than REFRESH_SECONDS since the
    last booking). written_anyway: the status is written now regardless (the progress sample is
    due): a holding job books then, and its next refresh is timed from that write, not another."""
    ledger: dict[str, Any] = dict(old.get("goodput") or {})
    if old.get("phase") in FINISHED:
        return None  # booked up to the end: the ratio stays what the run achieved
    since = parse_time(ledger.get("accountedTime")) or created
    phase_changed = old.get("phase") != new.get("phase")
    restarted = restart_counted(old, new)
    stalls = _stall_seconds(ledger, trainer, int(new.get("attempt") or 0))
    recovered = is_complete(new.get("lastRecovery")) and not is_complete(old.get("lastRecovery"))
    due = (now - since >= REFRESH_SECONDS or written_anyway) and old.get("phase") in HOLDING_PHASES
    if not (phase_changed or restarted or recovered or stalls or due or not ledger):
        return None
    if now < since:
        # A clock behind the last booking's (another replica's, after a failover): accountedTime
        # never goes back, or a failback to the right clock would count the difference twice.
        if not (phase_changed or restarted or recovered or stalls):
            return None
        now = since  # the change is booked, with no time
    if not phase_changed and _awaiting_first_report(old, now, trainer):
        return None  # the span is split at the first step once the trainer tells when it came
    book = {cause: device_seconds(ledger, cause) for cause in LOST_CAUSES}
    allocated = device_seconds(ledger, "allocated")
    productive = device_seconds(ledger, "productive")
    phase = old.get("phase")
    span = max(0.0, now - since)
    if phase in HOLDING_PHASES:
        allocated += span * (devices.count + devices.spares)
        book["standbySpares"] += span * devices.spares  # the price of recovering in seconds
    # The part of the span lost to a recovery or to the first start, up to the first step.
    lost_until, cause = _lost_until(old, new, since, now, trainer)
    lost = min(span, max(0.0, lost_until - since)) if cause else 0.0
    if cause:
        book[cause] += lost * devices.count
    rest = (span - lost) * devices.count
    if cause or phase == "Running":
        productive += rest  # after the first step that ended the loss: training, whatever the phase said
    elif phase in (None, "Pending") and not old.get("startTime") and not cause:
        book["waitingForAdmission"] += rest
    elif phase == "Admitted" and not old.get("startTime") and not cause:
        book["startup"] += rest  # admitted, its containers starting
    if recovered:
        redo = _redone_device_seconds(new["lastRecovery"], devices, _step_seconds(ledger, trainer))
        book["redoneSteps"] += redo
        productive -= redo
    if stalls:
        stall_time = stalls * devices.count
        book["checkpointStalls"] += stall_time
        productive -= stall_time
    productive = max(0.0, productive)
    wall = max(1e-9, now - created) * devices.count + book["standbySpares"]
    shown, carried = _shown_and_carried({"allocated": allocated, "productive": productive, **book})
    out: dict[str, Any] = {
        "unit": devices.unit,
        "devices": _count_text(devices.count),
        **{f"{cause}Seconds": seconds for cause, seconds in shown.items()},
        "remainderMilliseconds": carried,
        "ratio": f"{min(1.0, productive / wall):.3f}",
        "accountedTime": iso_ms(now),
    }
    if trainer is not None and trainer.checkpoint_stall_seconds is not None:
        out["stallsReported"] = f"{trainer.attempt}:{trainer.checkpoint_stall_seconds!r}"  # exact
    elif "stallsReported" in ledger:
        out["stallsReported"] = ledger["stallsReported"]
    per_step = _step_seconds(ledger, trainer)
    if per_step:
        out["stepMilliseconds"] = max(1, round(per_step * 1000))
    return out


def _step_seconds(ledger: Mapping[str, Any], trainer: TrainerFacts | None) -> float | None:
    """The newest step time reported: a recovering attempt has none yet when its recovery completes,
    and its redone steps are the disrupted attempt's, at that attempt's pace."""
    if trainer is not None and trainer.seconds_per_step:
        return trainer.seconds_per_step
    kept = ledger.get("stepMilliseconds")
    return kept / 1000 if isinstance(kept, int) and kept > 0 else None


def _lost_until(
    old: Mapping[str, Any], new: Mapping[str, Any], since: float, now: float, trainer: TrainerFacts | None
) -> tuple[float, str | None]:
    """Until when the span [since, now) was lost, and to what: an open recovery until its first
    step (now, if not done yet), or the first attempt's start-up until the trainer's first step."""
    recovery = old.get("lastRecovery")
    if recovery and not is_complete(recovery):
        done = new.get("lastRecovery")
        disrupted = parse_time(recovery.get("disruptedTime"))
        if is_complete(done) and disrupted is not None and done.get("attempt") == recovery.get("attempt"):
            return disrupted + done["phasesMilliseconds"]["firstStep"] / 1000, "recovery"
        return now, "recovery"
    running_first = old.get("phase") in ("Admitted", "Running") and int(old.get("attempt") or 0) == 0
    if running_first and trainer is not None and trainer.attempt == 0:
        first = trainer.first_step_at if trainer.first_step_at is not None else now
        return (first, "startup") if first > since else (since, None)
    return since, None


def _awaiting_first_report(old: Mapping[str, Any], now: float, trainer: TrainerFacts | None) -> bool:
    """The first attempt runs and its trainer has not reported yet (imports, rendezvous, restore)."""
    if old.get("phase") != "Running" or int(old.get("attempt") or 0) != 0 or trainer is not None:
        return False
    started = parse_time(old.get("startTime"))
    return started is not None and now - started < FIRST_REPORT_GRACE_SECONDS


def _stall_seconds(ledger: Mapping[str, Any], trainer: TrainerFacts | None, attempt: int) -> float:
    """Checkpoint stall seconds the trainer reported since the last booking (per attempt, it counts
    from zero again)."""
    if trainer is None or trainer.checkpoint_stall_seconds is None or trainer.attempt != attempt:
        return 0.0
    booked_attempt, _, booked = str(ledger.get("stallsReported") or "").partition(":")
    already = float(booked) if booked_attempt == str(attempt) and booked else 0.0
    more = trainer.checkpoint_stall_seconds - already
    return more if more >= MIN_STALL_SECONDS else 0.0


def _redone_device_seconds(recovery: Mapping[str, Any], devices: Devices, per_step: float | None) -> float:
    """Steps the disrupted attempt had reported past the checkpoint the next one resumed from."""
    step, resumed = recovery.get("stepAtDisruption"), recovery.get("resumedFromStep")
    if not isinstance(step, int) or not isinstance(resumed, int) or not per_step or step <= resumed:
        return 0.0
    return (step - resumed) * per_step * devices.count


def _count_text(count: float) -> str:
    return str(int(count)) if float(count).is_integer() else f"{count:.3f}".rstrip("0")


def ratio(ledger: Mapping[str, Any] | None) -> float | None:
    try:
        return float((ledger or {})["ratio"])
    except (KeyError, TypeError, ValueError):
        return None
