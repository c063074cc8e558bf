"""Writes to a TrainingJob: its status (conditional on the version decided on), the facts others
copy into it (progress, admission messages: for one uid only) and its Events. Every write's reply
goes into the job store, so the next decision never reads an older status than this operator wrote."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from phalanx.controller import failpoints
from phalanx.controller.stores import ClusterStores
from phalanx.k8s import KubeApi, short_error

log = logging.getLogger("phalanx.controller")


def status_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch that turns `old` into `new` (None removes a key); only what changed. Nested
    objects are diffed too: a merge patch merges an object into the stored one, so sending the new
    object whole would keep the old one's keys it no longer has (a new recovery timeline kept the
    last one's phases and summary)."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        if isinstance(before, dict) and isinstance(value, dict):
            patch[key] = status_diff(before, value)
        else:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


class JobWriter:
    def __init__(self, api: KubeApi, stores: ClusterStores, event_pool: ThreadPoolExecutor) -> None:
        self.api = api
        self.stores = stores
        self.event_pool = event_pool

    def write_status(
        self, key: str, job: dict[str, Any], old: dict[str, Any], new: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Writes what changed from `old` to `new`, on condition that the job is still the version
        read; returns the job as stored (unchanged when there was nothing to write), None when gone."""
        patch = status_diff(old, new)
        if not patch:
            return job
        failpoints.lose_status_write(key, patch)
        meta = job["metadata"]
        stored = self.api.patch_job_status(meta["namespace"], meta["name"], patch, meta["resourceVersion"])
        if stored is not None:
            self.stores.jobs.upsert(stored)
        return stored

    def write_facts(self, key: str, uid: str, patch: dict[str, Any], decided_on: str | None = None) -> bool:
        """Copies facts (progress, an admission message) into the status of the job with `uid`;
        False when that job is gone, whether or not another was created under its name.
        decided_on: the resourceVersion the fact was decided on; written on that version only
        (StatusConflict when the job has moved on), not retried on the current one."""
        namespace, name = key.split("/", 1)
        cached = self.stores.jobs.get(key)
        if cached is not None and cached["metadata"].get("uid") != uid:
            return False  # the watch already saw its successor
        version = cached["metadata"].get("resourceVersion") if cached is not None else None
        if decided_on is not None:
            version = decided_on
        stored = self.api.patch_job_facts(
            namespace, name, patch, uid, version, retry_on_conflict=decided_on is None
        )
        if stored is not None:
            self.stores.jobs.upsert(stored)  # the next admission pass must not read an older status
        return stored is not None

    def refreshed(self, key: str) -> list[float]:
        """Someone wrote the job after it was read: read it again and decide once more, at once."""
        namespace, name = key.split("/", 1)
        fresh = self.api.get_job(namespace, name)
        if fresh is not None:
            self.stores.jobs.upsert(fresh)
        log.info("%s changed while it was being reconciled; deciding again", key)
        return [0.0]

    def record_event(self, job: dict[str, Any], type_: str, reason: str, message: str, now_iso: str) -> None:
        """Events are for people reading `kubectl describe`; a reconcile does not wait for them."""

        def record() -> None:
            try:
                self.api.create_event(job, type_, reason, message, now_iso)
            except Exception as exc:  # noqa: BLE001 - a lost event must not fail anything
                log.warning(
                    "event %s for %s not recorded: %s", reason, job["metadata"]["name"], short_error(exc)
                )

        self.event_pool.submit(record)
