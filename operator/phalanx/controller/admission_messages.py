"""Why each waiting gang waits, written to its status.admissionMessage off the admission pass's
thread (I/O side; the reasons are gang/admission.py's).

A turnover changes the reason of many waiting gangs at once, and one write takes tens of
milliseconds on a busy API server: written by the pass itself, eleven of them held the next pass,
and the GPUs that finished meanwhile, for 0.42 s in `make bench-gang`'s contention part. Here one
thread writes them in the order asked, and only the latest reason asked for a job is written: a
reason replaced before its turn came is never sent, so a job's message never goes back to an older
one, and none is written once the gang was admitted, nor over a version of the job newer than the
one it was decided on (the next pass asks again)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from phalanx.controller.job_writes import JobWriter
from phalanx.controller.stores import ClusterStores
from phalanx.k8s import StatusConflict, short_error
from phalanx.pod_facts import in_current_attempt, is_gated

log = logging.getLogger("phalanx.controller")


def waits_at_the_gate(job: dict[str, Any], stores: ClusterStores) -> bool:
    """A pod of the job's current attempt is still gated: the gang is not admitted (the admission
    rule's test, rules/admission.py; a warm spare standing by or a pod of an earlier attempt is no
    attempt's)."""
    status = job.get("status") or {}
    return any(is_gated(p) and in_current_attempt(p, status) for p in stores.own_pods(job))


class AdmissionMessages:
    def __init__(self, stores: ClusterStores, writer: JobWriter, written: Callable[[str], None]) -> None:
        """written(key): called after a message was stored (the job is reconciled again)."""
        self.stores = stores
        self.writer = writer
        self.written = written
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="admission-messages")
        self._lock = threading.Lock()
        # job key -> (uid, reason, the job's resourceVersion the reason was decided on), not written yet
        self._asked: dict[str, tuple[str, str, str | None]] = {}

    def ask(self, key: str, uid: str, reason: str, version: str | None) -> None:
        """Writes `reason` to the job soon, on the `version` of it the reason was decided on, unless
        a later ask replaces it first."""
        with self._lock:
            asked = self._asked.get(key)
            if asked is not None and asked[:2] == (uid, reason):
                return  # already on its way
            self._asked[key] = (uid, reason, version)
        if asked is None:
            try:
                self.pool.submit(self._write, key)
            except RuntimeError:  # the operator is stopping: its successor's first pass writes it
                with self._lock:
                    self._asked.pop(key, None)

    def drop(self, key: str) -> None:
        """The gang was admitted: a reason not written yet is no longer true."""
        with self._lock:
            self._asked.pop(key, None)

    def pending(self, key: str) -> tuple[str, str] | None:
        """(uid, reason) asked for the job and not written yet (tests, and a pass deciding again)."""
        with self._lock:
            asked = self._asked.get(key)
        return None if asked is None else asked[:2]

    def _write(self, key: str) -> None:
        with self._lock:
            asked = self._asked.get(key)
        if asked is None:
            return
        uid, reason, version = asked
        try:
            job = self.stores.jobs.get(key)
            # Gone, replaced, or admitted meanwhile (no pod at the gate: its reconcile clears the
            # message, which this write must not bring back).
            if job is not None and job["metadata"].get("uid") == uid and waits_at_the_gate(job, self.stores):
                status = job.get("status") or {}
                # On the version it was decided on, not retried on a conflict: the job moved on
                # (admitted, its message cleared, perhaps), and whether it still waits, and why, is
                # the next pass's to say.
                if status.get("admissionMessage") != reason and self.writer.write_facts(
                    key, uid, {"admissionMessage": reason}, decided_on=version
                ):
                    self.written(key)
        except StatusConflict:
            pass
        except Exception as exc:  # noqa: BLE001 - the next pass asks again
            log.warning("admission message for %s not written: %s", key, short_error(exc))
        finally:
            with self._lock:
                replaced = self._asked.get(key) != asked
                if not replaced:
                    del self._asked[key]
            if replaced:  # a newer reason was asked while this one was written: it goes next
                try:
                    self.pool.submit(self._write, key)
                except RuntimeError:
                    pass  # the operator is stopping: its successor's first pass writes it
