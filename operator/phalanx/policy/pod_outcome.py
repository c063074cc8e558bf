"""What happened to a training pod, and what that means for its whole gang.

classify_pod reads one pod (plain API JSON) and says whether it is pending, running, done, was
disrupted from outside (preemption, eviction, node loss, deletion by someone else) or failed, and
whether such a failure is worth retrying. gang_verdict folds the pods of one attempt into the
decision the reconciler acts on. The exit-code contract is in docs/environment.md, the whole table in
docs/scheduling.md.
"""

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Final

from phalanx.constants import (
    EXIT_CHECKPOINTED_ON_PREEMPTION,
    EXIT_GENERATION_FAILED,
    EXIT_WORLD_SIZE_UNUSABLE,
    FIRST_SIGNAL_EXIT_CODE,
    TRAINER_CONTAINER,
    WORLD_SIZE_TOO_SMALL_MARKER,
    WORLD_SIZE_UNUSABLE_MARKER,
)

DISRUPTION_CONDITION: Final = "DisruptionTarget"
REASON_COMPLETED: Final = "Completed"
REASON_CHECKPOINTED: Final = "CheckpointedOnSigterm"
REASON_DELETED: Final = "Deleted"
REASON_NODE_LOST: Final = "NodeLost"
REASON_EVICTED: Final = "Evicted"
REASON_OOM: Final = "OOMKilled"
REASON_EXIT_CODE: Final = "ExitCode"
REASON_DEADLINE: Final = "DeadlineExceeded"
REASON_DEVICE_ERROR: Final = "DeviceError"
# The trainer cannot split the attempt's world size (exit 78): an elastic gang skips the size.
REASON_WORLD_SIZE_UNUSABLE: Final = "WorldSizeUnusable"
# The same, for a world smaller than tp x pp: an elastic gang skips every size up to it.
REASON_WORLD_SIZE_TOO_SMALL: Final = "WorldSizeTooSmall"
# What NVIDIA drivers, CUDA and NCCL print when the device, not the program, failed, as whole
# phrases (a bare "Xid" is in "txid" and "oxidized"): an Xid event with its number, an uncorrectable
# ECC error, a GPU gone from the bus, an NVLink error. Searched in the trainer container's
# termination message.
DEVICE_ERROR_PATTERNS: Final = (
    re.compile(r"\bNVRM: Xid\b"),
    re.compile(r"\bXid[: ]+(\(PCI:[^)]*\)[:,]? *)?\d+"),
    re.compile(r"uncorrectable ECC error", re.IGNORECASE),
    re.compile(r"GPU has fallen off the bus", re.IGNORECASE),
    re.compile(r"\bNVLink (error|fatal)", re.IGNORECASE),
)
# Failures this close before a preemption are treated as its consequences too: API timestamps have
# one-second resolution and node clocks drift a little.
CASCADE_TOLERANCE_SECONDS: Final = 2.0


class OutcomeKind(Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    PREEMPTED = "Preempted"
    FAILED_RETRYABLE = "FailedRetryable"
    FAILED_PERMANENT = "FailedPermanent"


@dataclass(frozen=True)
class PodOutcome:
    pod: str
    kind: OutcomeKind
    reason: str
    message: str
    exit_code: int | None = None
    # When the deciding event happened (seconds since the epoch), when the API tells us.
    at: float | None = None


class VerdictKind(Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    RESTART_PREEMPTION = "RestartPreemption"
    RESTART_FAILURE = "RestartFailure"


@dataclass(frozen=True)
class GangVerdict:
    kind: VerdictKind
    reason: str
    message: str
    pod: str | None = None  # the pod whose outcome decided, if one did
    running: int = 0
    pending: int = 0
    succeeded: int = 0


def _timestamp(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _condition(conditions: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def node_is_ready(node: Mapping[str, Any]) -> bool:
    ready = _condition((node.get("status") or {}).get("conditions") or (), "Ready")
    return ready is not None and ready.get("status") == "True"


@dataclass(frozen=True)
class _Termination:
    container: str
    exit_code: int
    reason: str
    message: str
    finished_at: float | None


def _terminations(status: Mapping[str, Any]) -> list[_Termination]:
    """Terminated containers, the trainer first, then the others and init containers in order."""
    found: list[_Termination] = []
    for key in ("containerStatuses", "initContainerStatuses"):
        for container in status.get(key) or ():
            terminated = (container.get("state") or {}).get("terminated")
            if not terminated or terminated.get("exitCode") is None:
                continue
            found.append(
                _Termination(
                    container=str(container.get("name", "")),
                    exit_code=int(terminated["exitCode"]),
                    reason=str(terminated.get("reason") or ""),
                    message=str(terminated.get("message") or ""),
                    finished_at=_timestamp(terminated.get("finishedAt")),
                )
            )
    found.sort(key=lambda t: t.container != TRAINER_CONTAINER)
    return found


def _deletion_requested_at(metadata: Mapping[str, Any]) -> float | None:
    # deletionTimestamp is the deadline (request time + grace period), not the request time.
    deadline = _timestamp(metadata.get("deletionTimestamp"))
    if deadline is None:
        return None
    return deadline - float(metadata.get("deletionGracePeriodSeconds") or 0)


def device_error(text: str) -> str | None:
    """The accelerator fault a termination message names (the trainer's last log lines, through
    FallbackToLogsOnError), if any: the node's hardware failed, not the job's code."""
    for pattern in DEVICE_ERROR_PATTERNS:
        found = pattern.search(text)
        if found is not None:
            return found.group(0)
    return None


def _failure(pod: str, termination: _Termination, retryable_exit_codes: frozenset[int]) -> PodOutcome:
    code = termination.exit_code
    where = f"container {termination.container} exited with code {code}"
    fault = device_error(termination.message)
    if fault is not None:
        # Retryable whatever the code: the next attempt runs elsewhere (policy/bad_nodes.py).
        message = f"{where} after a device error ({fault})"
        return PodOutcome(
            pod, OutcomeKind.FAILED_RETRYABLE, REASON_DEVICE_ERROR, message, code, termination.finished_at
        )
    if termination.reason == REASON_OOM:
        return PodOutcome(
            pod,
            OutcomeKind.FAILED_RETRYABLE,
            REASON_OOM,
            f"{where} (OOMKilled)",
            code,
            termination.finished_at,
        )
    if code >= FIRST_SIGNAL_EXIT_CODE:
        message = f"{where} (killed by signal {code - FIRST_SIGNAL_EXIT_CODE})"
        return PodOutcome(
            pod, OutcomeKind.FAILED_RETRYABLE, REASON_EXIT_CODE, message, code, termination.finished_at
        )
    if code == EXIT_GENERATION_FAILED:
        message = f"{where} (its restart generation broke: a peer was lost or no new generation came)"
        return PodOutcome(
            pod, OutcomeKind.FAILED_RETRYABLE, REASON_EXIT_CODE, message, code, termination.finished_at
        )
    if code in retryable_exit_codes:
        message = f"{where} (listed in retryableExitCodes)"
        return PodOutcome(
            pod, OutcomeKind.FAILED_RETRYABLE, REASON_EXIT_CODE, message, code, termination.finished_at
        )
    if (
        code == EXIT_WORLD_SIZE_UNUSABLE
        and termination.container == TRAINER_CONTAINER
        and WORLD_SIZE_TOO_SMALL_MARKER in termination.message
    ):
        line = next(ln for ln in termination.message.splitlines() if WORLD_SIZE_TOO_SMALL_MARKER in ln)
        return PodOutcome(
            pod,
            OutcomeKind.FAILED_PERMANENT,
            REASON_WORLD_SIZE_TOO_SMALL,
            f"{where}: {line.removeprefix(WORLD_SIZE_TOO_SMALL_MARKER).strip()[:200]}",
            code,
            termination.finished_at,
        )
    if (
        code == EXIT_WORLD_SIZE_UNUSABLE
        and termination.container == TRAINER_CONTAINER
        and WORLD_SIZE_UNUSABLE_MARKER in termination.message
    ):
        message = (
            f"{where}: the trainer cannot split this world size (data.global_batch_size over the "
            "data-parallel ranks, or tp x pp, does not divide it); run sizes it divides, for an elastic "
            "job with spec.elastic.replicasMultipleOf"
        )
        return PodOutcome(
            pod,
            OutcomeKind.FAILED_PERMANENT,
            REASON_WORLD_SIZE_UNUSABLE,
            message,
            code,
            termination.finished_at,
        )
    detail = f": {termination.message[:120]}" if termination.message else ""
    return PodOutcome(
        pod, OutcomeKind.FAILED_PERMANENT, REASON_EXIT_CODE, f"{where}{detail}", code, termination.finished_at
    )


def classify_pod(
    pod: Mapping[str, Any],
    *,
    retryable_exit_codes: frozenset[int] = frozenset(),
    node: Mapping[str, Any] | None,
) -> PodOutcome:
    """Classify one pod of an attempt. node: the Node the pod is bound to, None when it no longer exists.

    Only pods of the current attempt are classified, and the operator deletes those only after it
    has recorded the attempt's end (decide, record, then act): a deletionTimestamp here is always
    someone else's.
    """
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    name = str(metadata.get("name", ""))
    phase = str(status.get("phase") or "Pending")
    deleting = bool(metadata.get("deletionTimestamp"))
    deletion_at = _deletion_requested_at(metadata)
    disruption = _condition(status.get("conditions") or (), DISRUPTION_CONDITION)
    disrupted = disruption is not None and disruption.get("status") == "True"
    disrupted_at = _timestamp(disruption.get("lastTransitionTime")) if disruption else None
    terminations = _terminations(status)
    bound_to = spec.get("nodeName")

    if phase == "Succeeded":
        finished = max((t.finished_at for t in terminations if t.finished_at is not None), default=None)
        return PodOutcome(
            name, OutcomeKind.SUCCEEDED, REASON_COMPLETED, "all containers exited 0", 0, finished
        )

    checkpointed = next((t for t in terminations if t.exit_code == EXIT_CHECKPOINTED_ON_PREEMPTION), None)
    if checkpointed is not None:
        # The SIGTERM came before the exit: prefer the time the disruption was announced.
        at = min(
            (t for t in (disrupted_at, deletion_at, checkpointed.finished_at) if t is not None), default=None
        )
        message = f"container {checkpointed.container} checkpointed and stopped on SIGTERM"
        return PodOutcome(
            name, OutcomeKind.PREEMPTED, REASON_CHECKPOINTED, message, checkpointed.exit_code, at
        )

    if disrupted and disruption is not None and (phase == "Failed" or deleting):
        reason = str(disruption.get("reason") or DISRUPTION_CONDITION)
        message = str(disruption.get("message") or f"pod disrupted ({reason})")
        return PodOutcome(
            name, OutcomeKind.PREEMPTED, reason, message, _first_code(terminations), disrupted_at
        )

    if deleting:
        message = "pod deleted by someone other than the operator"
        return PodOutcome(
            name, OutcomeKind.PREEMPTED, REASON_DELETED, message, _first_code(terminations), deletion_at
        )

    node_lost = bool(bound_to) and (node is None or not node_is_ready(node))
    if node_lost and phase in ("Failed", "Unknown"):
        state = "no longer exists" if node is None else "is not Ready"
        lost_at = _node_not_ready_since(node)
        message = f"node {bound_to} {state}"
        return PodOutcome(
            name, OutcomeKind.PREEMPTED, REASON_NODE_LOST, message, _first_code(terminations), lost_at
        )

    if phase == "Failed":
        return _failed_pod(name, status, terminations, retryable_exit_codes)

    if phase == "Running":
        trainer = next(
            (t for t in terminations if t.container == TRAINER_CONTAINER and t.exit_code != 0), None
        )
        if trainer is not None:
            # A sidecar keeps the pod Running, but the trainer is already gone.
            return _failure(name, trainer, retryable_exit_codes)
        note = " (DisruptionTarget set, pod not stopped: no action yet)" if disrupted else ""
        return PodOutcome(name, OutcomeKind.RUNNING, "Running", f"running on {bound_to}{note}")

    if phase == "Unknown":
        return PodOutcome(
            name, OutcomeKind.PENDING, "PhaseUnknown", f"node {bound_to} does not report the pod"
        )
    waiting = "waiting for admission" if (spec.get("schedulingGates") and not bound_to) else "pending"
    return PodOutcome(name, OutcomeKind.PENDING, "Pending", waiting)


def _first_code(terminations: Sequence[_Termination]) -> int | None:
    return terminations[0].exit_code if terminations else None


def _node_not_ready_since(node: Mapping[str, Any] | None) -> float | None:
    if node is None:
        return None
    ready = _condition((node.get("status") or {}).get("conditions") or (), "Ready")
    return _timestamp(ready.get("lastTransitionTime")) if ready else None


def _failed_pod(
    name: str,
    status: Mapping[str, Any],
    terminations: Sequence[_Termination],
    retryable_exit_codes: frozenset[int],
) -> PodOutcome:
    pod_reason = str(status.get("reason") or "")
    if pod_reason == REASON_DEADLINE:
        return PodOutcome(
            name, OutcomeKind.FAILED_PERMANENT, REASON_DEADLINE, "pod activeDeadlineSeconds exceeded"
        )
    failing = next((t for t in terminations if t.exit_code != 0), None)
    if failing is not None:
        return _failure(name, failing, retryable_exit_codes)
    # Failed without a container exit code: the kubelet rejected or evicted the pod (Evicted,
    # NodeShutdown, OutOf<resource>...). The code never ran to a verdict, so it is a disruption.
    reason = pod_reason or REASON_EVICTED
    message = str(status.get("message") or f"pod failed without an exit code ({reason})")
    return PodOutcome(name, OutcomeKind.PREEMPTED, reason, message[:200])


def missing_pod_outcome(name: str) -> PodOutcome:
    """A pod of the current attempt that no longer exists and that the operator did not delete."""
    return PodOutcome(name, OutcomeKind.PREEMPTED, REASON_DELETED, "pod no longer exists")


def _first(outcomes: Iterable[PodOutcome]) -> PodOutcome:
    return min(outcomes, key=lambda o: (o.at if o.at is not None else float("inf"), o.pod))


def gang_verdict(outcomes: Sequence[PodOutcome]) -> GangVerdict:
    """One decision for the whole attempt.

    Order: all succeeded -> SUCCEEDED; a permanent failure that is not a consequence of a preemption
    -> FAILED; any preemption -> RESTART_PREEMPTION; a retryable failure -> RESTART_FAILURE; otherwise
    RUNNING when every pod runs (or has finished), else PENDING.

    A failure counts as a consequence of a preemption when it happened at or after (within
    CASCADE_TOLERANCE_SECONDS) the earliest preemption, or when either time is unknown: ranks
    crash with ordinary exit codes once a peer disappears, and that must not burn the failure
    budget. A genuine bug recurs in the next attempt without a preemption and fails the job then.
    The same holds after a retryable failure (a rank killed by a signal, out of memory, a device
    error): a permanent-looking failure at or after it is its cascade, and the gang restarts,
    spending the failure budget once, instead of failing because both ended inside one look.
    """
    running = sum(o.kind is OutcomeKind.RUNNING for o in outcomes)
    pending = sum(o.kind is OutcomeKind.PENDING for o in outcomes)
    succeeded = sum(o.kind is OutcomeKind.SUCCEEDED for o in outcomes)

    def verdict(kind: VerdictKind, reason: str, message: str, pod: str | None = None) -> GangVerdict:
        return GangVerdict(kind, reason, message, pod, running=running, pending=pending, succeeded=succeeded)

    if not outcomes:
        return verdict(VerdictKind.PENDING, "NoPods", "no pods yet")
    if succeeded == len(outcomes):
        return verdict(VerdictKind.SUCCEEDED, REASON_COMPLETED, "every pod finished successfully")

    preempted = [o for o in outcomes if o.kind is OutcomeKind.PREEMPTED]
    retryable = [o for o in outcomes if o.kind is OutcomeKind.FAILED_RETRYABLE]
    disruptions = preempted + retryable
    known_times = [o.at for o in disruptions if o.at is not None]
    if disruptions and len(known_times) == len(disruptions):
        cutoff: float | None = min(known_times) - CASCADE_TOLERANCE_SECONDS
    else:
        cutoff = None  # no disruption, or one of unknown time: see the docstring

    def independent(outcome: PodOutcome) -> bool:
        if not disruptions:
            return True
        return cutoff is not None and outcome.at is not None and outcome.at < cutoff

    permanent = [o for o in outcomes if o.kind is OutcomeKind.FAILED_PERMANENT and independent(o)]
    if permanent:
        first = _first(permanent)
        return verdict(VerdictKind.FAILED, first.reason, f"{first.pod}: {first.message}", first.pod)
    if preempted:
        first = _first(preempted)
        return verdict(
            VerdictKind.RESTART_PREEMPTION, first.reason, f"{first.pod}: {first.message}", first.pod
        )
    if retryable:
        first = _first(retryable)
        return verdict(VerdictKind.RESTART_FAILURE, first.reason, f"{first.pod}: {first.message}", first.pod)
    if pending == 0:
        return verdict(VerdictKind.RUNNING, "Running", f"{running} pods running")
    return verdict(VerdictKind.PENDING, "Pending", f"{pending} of {len(outcomes)} pods not running yet")
