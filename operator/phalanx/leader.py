"""Lease-based leader election (coordination.k8s.io/v1): one operator writes, the others stand by.

Two operator processes can run at once: two replicas, or a replacement pod started while the old one
is still Terminating on an unreachable node and can still reach the API server. Only the holder of
the Lease may write; a standby keeps its watch-fed stores warm, so it takes over in about one lease
duration after the leader stops renewing.

The rules, as client-go's leaderelection package has them:
- a standby judges a lease expired by its own clock: the time since it last saw the lease record
  change, not the holder's renewTime, so clock skew between machines does not matter;
- the leader acts only until `renew_deadline` after its last successful renewal began, which is
  shorter than the lease duration: it stops writing before anyone else may start;
- every update carries the lease's resourceVersion, so two standbys taking over at once cannot
  both win;
- a leader that loses the lease stops the process (the Deployment starts it again, as a standby);
  one that shuts down releases the lease, so the standby takes over at once.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger("phalanx.leader")

LEASE_DURATION_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10
RETRY_PERIOD_SECONDS = 2.0


class LeaseClient(Protocol):
    """The three Lease calls the election makes (k8s.LeaseApi): JSON dicts in and out. A failed
    call raises an exception whose `status` is the HTTP status (404: no lease, 409: a conflict)."""

    def read(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create(self, namespace: str, body: dict[str, Any]) -> None: ...

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...


class NotLeader(RuntimeError):
    """A write was attempted by an operator that does not hold the lease (or no longer knows it does)."""


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    renew_time: str
    duration_seconds: int
    transitions: int

    @staticmethod
    def of(lease: dict[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return LeaseRecord(
            holder=str(spec.get("holderIdentity") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            duration_seconds=int(spec.get("leaseDurationSeconds") or LEASE_DURATION_SECONDS),
            transitions=int(spec.get("leaseTransitions") or 0),
        )


@dataclass(frozen=True)
class Observation:
    """The lease record as last seen, and when (local monotonic clock) it was first seen so."""

    record: LeaseRecord
    seen_at: float


class Action(enum.Enum):
    CREATE = "create"  # no lease yet
    RENEW = "renew"  # ours
    TAKE_OVER = "take over"  # released, or its holder stopped renewing
    STAND_BY = "stand by"  # someone else holds it and renews it


def decide(
    identity: str, current: LeaseRecord | None, last: Observation | None, now: float
) -> tuple[Action, Observation | None]:
    """What to do with the lease as read now, and the observation to keep for the next round (pure)."""
    if current is None:
        return Action.CREATE, None
    if current.holder == identity:
        return Action.RENEW, Observation(current, now)
    if not current.holder:
        return Action.TAKE_OVER, Observation(current, now)
    if last is None or last.record != current:
        return Action.STAND_BY, Observation(current, now)  # it changed: the holder is alive
    if now - last.seen_at >= current.duration_seconds:
        return Action.TAKE_OVER, last
    return Action.STAND_BY, last


def lease_body(
    namespace: str,
    name: str,
    identity: str,
    now_iso: str,
    duration_seconds: int,
    transitions: int,
    acquire_time: str | None,
    resource_version: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version  # optimistic concurrency: 409 if it changed
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": identity,
            "leaseDurationSeconds": duration_seconds,
            "acquireTime": acquire_time or now_iso,
            "renewTime": now_iso,
            "leaseTransitions": transitions,
        },
    }


def micro_time(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Runs the election in a thread; `fence()` raises unless this process may write right now."""

    def __init__(
        self,
        leases: LeaseClient,
        namespace: str,
        name: str,
        identity: str,
        on_lost: Callable[[], None],
        duration_seconds: int = LEASE_DURATION_SECONDS,
        renew_deadline_seconds: float = RENEW_DEADLINE_SECONDS,
        retry_period_seconds: float = RETRY_PERIOD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not duration_seconds > renew_deadline_seconds > 1.2 * retry_period_seconds > 0:
            # As client-go checks: a renewal gets more than one try before the deadline, and the
            # deadline leaves a margin before anyone else may take the lease.
            raise ValueError(
                f"leader election needs lease duration > renew deadline > 1.2 x retry period, got "
                f"{duration_seconds} s, {renew_deadline_seconds} s, {retry_period_seconds} s"
            )
        self.leases = leases
        self.namespace, self.name, self.identity = namespace, name, identity
        self.on_lost = on_lost
        self.duration_seconds = duration_seconds
        self.renew_deadline_seconds = renew_deadline_seconds
        self.retry_period_seconds = retry_period_seconds
        self.clock = clock
        self.leading = threading.Event()
        self.in_contact = threading.Event()  # the last round reached the API server (readiness)
        self._valid_until = 0.0
        self._last: Observation | None = None
        self._acquire_time: str | None = None
        self._stop = threading.Event()
        self._lost = False
        self._fence_closed = False
        self._held = False  # this process wrote the lease as its holder at least once
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    # -- what the writers ask -------------------------------------------------------------------
    def may_write(self) -> bool:
        return not self._fence_closed and self.leading.is_set() and self.clock() < self._valid_until

    def last_holder(self) -> str:
        """The lease's holder as last read ('' when none, or not read yet)."""
        if self.leading.is_set():
            return self.identity
        last = self._last
        return last.record.holder if last is not None else ""

    def fence(self) -> None:
        if not self.may_write():
            raise NotLeader(f"{self.identity} does not hold lease {self.namespace}/{self.name}")

    # -- the loop -------------------------------------------------------------------------------
    def start(self) -> LeaderElector:
        self._thread.start()
        return self

    def close_fence(self) -> None:
        """From now on this process writes nothing (shutdown, or the lease is lost). Renewals go on
        until stop(), so no one else takes the lease while this process drains its writers."""
        self._fence_closed = True

    def stop(self, release: bool = True) -> None:
        """Ends the election. `release`: hand the lease over at once; only safe once no write of this
        process can still reach the API server (the caller closed the fence and drained its writers)."""
        self.close_fence()
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=self.retry_period_seconds + 5)
        if self._thread.is_alive():
            return  # a round is stuck in a request: let the lease expire rather than race it
        if release and self._held:
            self._release()
        self.leading.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = self.clock()
            try:
                self.try_once(began)
                self.in_contact.set()
            except Exception as exc:  # noqa: BLE001 - the API server may fail any way; keep trying
                self.in_contact.clear()
                log.warning("leader election round failed: %s", _short(exc))
            if self.leading.is_set() and self.clock() >= self._valid_until:
                self._lose("not renewed within the renew deadline")
            if self._lost:
                return
            self._stop.wait(self.retry_period_seconds)

    def _lose(self, why: str) -> None:
        self.close_fence()
        self.leading.clear()
        self.in_contact.clear()
        self._lost = True
        log.error("lost the lease %s/%s (%s): stopping", self.namespace, self.name, why)
        self.on_lost()

    def try_once(self, began: float) -> Action:
        """One round: read the lease, decide, write; returns what it did (for tests and logs).

        `began`: when the round started; the leader may write until began + renew deadline.
        """
        was_leading = self.leading.is_set()
        lease = self._read()
        # A standby dates what it saw from when the read returned, not from before it.
        current = LeaseRecord.of(lease) if lease is not None else None
        action, self._last = decide(self.identity, current, self._last, self.clock())
        if self._stop.is_set():
            return Action.STAND_BY  # shutting down: no more writes, not even to the lease
        if action is Action.STAND_BY:
            if was_leading:
                self._lose(f"now held by {current.holder if current else 'nobody'}")
            return action
        now_iso = micro_time()
        if action is Action.CREATE:
            body = lease_body(
                self.namespace, self.name, self.identity, now_iso, self.duration_seconds, 0, None
            )
            written = self._write(lambda: self.leases.create(self.namespace, body))
        else:
            assert current is not None and lease is not None
            ours = action is Action.RENEW
            transitions = current.transitions if ours else current.transitions + 1
            acquire = (lease.get("spec") or {}).get("acquireTime") if ours else None
            body = lease_body(self.namespace, self.name, self.identity, now_iso, self.duration_seconds,
                              transitions, acquire, lease["metadata"]["resourceVersion"])  # fmt: skip
            written = self._write(lambda: self.leases.replace(self.namespace, self.name, body))
        if not written:
            if was_leading and self._holds_it_still():
                # Our own write landed after this round's read: a request the server committed but
                # whose answer we lost (urllib3 retries a PUT after a read timeout, and the retry
                # meets the first attempt's version; a 504 on a committed write). Still ours; the
                # fence keeps its deadline (not extended without an answer) and the next round renews.
                log.warning("lease %s/%s moved under a renewal, by our own earlier write: still ours",
                            self.namespace, self.name)  # fmt: skip
                return Action.RENEW
            if was_leading:
                self._lose("another candidate wrote the lease first")
            return Action.STAND_BY  # someone else wrote first
        self._held = True
        self._valid_until = began + self.renew_deadline_seconds
        if not self.leading.is_set():
            log.info("%s leads (lease %s/%s, %s)", self.identity, self.namespace, self.name, action.value)
            self.leading.set()
        return action

    def _holds_it_still(self) -> bool:
        lease = self._read()
        return lease is not None and LeaseRecord.of(lease).holder == self.identity

    def _read(self) -> dict[str, Any] | None:
        return self.leases.read(self.namespace, self.name)

    @staticmethod
    def _write(request: Callable[[], Any]) -> bool:
        try:
            request()
        except Exception as exc:
            if getattr(exc, "status", None) == 409:
                return False  # someone else wrote first
            raise
        return True

    def _release(self) -> None:
        """An empty holder: a standby takes over at its next round instead of after a lease duration."""
        try:
            lease = self._read()
            if lease is None or LeaseRecord.of(lease).holder != self.identity:
                return
            spec = lease.get("spec") or {}
            body = lease_body(self.namespace, self.name, "", micro_time(), 1, int(spec.get("leaseTransitions") or 0),
                              spec.get("acquireTime"), lease["metadata"]["resourceVersion"])  # fmt: skip
            self.leases.replace(self.namespace, self.name, body)
            log.info("released lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # noqa: BLE001 - shutting down: the lease expires anyway
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, _short(exc))
        finally:
            self.close_fence()
            self._held = False


def _short(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    return f"HTTP {status} {getattr(exc, 'reason', '')}".strip() if status is not None else repr(exc)
