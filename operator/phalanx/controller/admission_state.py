"""What admission at creation and the admission pass share, under one lock: one plan at a time.

assumed: pods admitted at creation whose create reply is still on its way ("namespace/name" ->
(node, requests)); reservations: nodes held for the head of the queue; priorities: PriorityClass
values as the last pass read them; node_infos: parsed nodes, re-parsed only when they change;
claims: room elastic gangs were sized or grown into and have not placed yet (admission_at_creation.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.cache import Store
from phalanx.gang.capacity import NodeInfoCache, PodDemand, Resources
from phalanx.gang.usage import UsageIndex

log = logging.getLogger("phalanx.controller")

# A PriorityClass's value cannot change (the API server refuses the update), so listing them on every
# admission pass (one request per pass, under the admission lock) bought nothing but new and deleted
# classes. They are watched (a reflector feeds a store); until that store has listed, a class a job
# names that is not known yet is listed at once (at most every PRIORITY_UNKNOWN_SECONDS), the rest
# every PRIORITY_REFRESH_SECONDS.
PRIORITY_REFRESH_SECONDS: Final = 30.0
PRIORITY_UNKNOWN_SECONDS: Final = 1.0


class PriorityValues:
    """PriorityClass name -> value: from the watch-fed store once it has listed (no request at all);
    before that listed at most every PRIORITY_REFRESH_SECONDS, or sooner for a name not known yet; a
    failed list keeps the last values (and is tried again at the next pass)."""

    def __init__(
        self,
        fetch: Callable[[], dict[str, int]],
        clock: Callable[[], float] = time.monotonic,
        watched: Store | None = None,
    ) -> None:
        self.fetch = fetch
        self.clock = clock
        self.watched = watched
        self.values: dict[str, int] = {}
        self.fetched_at: float | None = None

    def current(self, named: set[str] | frozenset[str] = frozenset()) -> dict[str, int]:
        """named: the PriorityClasses the waiting jobs name."""
        if self.watched is not None and self.watched.synced.is_set():
            return {pc["metadata"]["name"]: int(pc.get("value") or 0) for pc in self.watched.items()}
        now = self.clock()
        age = None if self.fetched_at is None else now - self.fetched_at
        unknown = bool(named - self.values.keys())
        if age is None or age >= PRIORITY_REFRESH_SECONDS or (unknown and age >= PRIORITY_UNKNOWN_SECONDS):
            try:
                self.values = self.fetch()
                self.fetched_at = now
            except Exception as err:  # an API error must not stop admission; old values serve
                log.warning("PriorityClasses not listed (keeping the last %d): %s", len(self.values), err)
        return self.values


@dataclass(frozen=True)
class Claim:
    """Room an elastic gang took a decision on and has not placed yet: the size of its new attempt,
    or a restart to grow. Others' sizing and growth see it as taken (admission_at_creation.room_for).

    pods: as many as the gang will place; needed: the fewest that must fit together (the whole gang
    when sized; for a grow, the pods beyond those it still holds). names: "namespace/pod" of the
    attempt's pods, once created (empty for a grow and a hold); the claim ends when all hold their
    nodes. provisional: taken while the room was read, for the decision about to use it.
    grown_attempt: for a grow, the attempt it restarts into; the claim lasts until that attempt's
    pods are created (their claim by name replaces it), however long the old pods take to go, and
    ends should the job move past that attempt or finish first. holding: the grower's old pods
    ("namespace/pod"); while one is in the store it holds its node (counted as used), so the claim
    takes only the pods beyond those, plus one for each old pod gone.
    """

    demand: PodDemand
    pods: int
    needed: int
    names: frozenset[str]
    since: float
    provisional: bool = False
    grown_attempt: int | None = None
    holding: frozenset[str] = frozenset()


class AdmissionState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.assumed: dict[str, tuple[str, Resources]] = {}
        self.reservations: dict[str, tuple[str, ...]] = {}
        self.priorities: dict[str, int] = {}  # PriorityClass name -> value, read by each admission pass
        self.node_infos = NodeInfoCache()  # node_set() under the lock only; a NodeSet may be read outside it
        self.claims: dict[str, Claim] = {}  # job key -> the room it sized or grew into, not placed yet

    def priority_of(self, spec: TrainingJobSpec) -> int:
        """The value of the job's PriorityClass as the last admission pass read it."""
        return self.priorities.get(spec.scheduling.priority_class_name or "", 0)

    def used_with_assumed(self, usage: UsageIndex) -> dict[str, dict[str, int]]:
        """Room held per node by bound and admitted pods, and by creates whose reply is on its way
        (the caller holds the lock, which guards self.assumed)."""
        return usage.used(self.assumed)
