"""In-memory copies of the objects gang admission reads, kept slim and fed by watches (reflector.py).

An admission pass used to list every pod, node and TrainingJob of the cluster; on 500 nodes that is
megabytes of JSON per pass. These stores hold only the fields the operator reads, so the pass reads
memory instead. Our own writes are applied at once from the API's reply ("assumed"), so a pass never
sees an older state than the operator itself wrote; a newer resourceVersion always wins.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from phalanx import constants as c
from phalanx.pod_facts import TERMINAL_PHASES, planned_node

Slim = dict[str, Any]


def _pick(source: Mapping[str, Any] | None, keys: Iterable[str]) -> dict[str, Any]:
    return {k: source[k] for k in keys if source and source.get(k) is not None}


def _metadata(obj: Mapping[str, Any], *extra: str) -> dict[str, Any]:
    keys = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", *extra)
    return _pick(obj.get("metadata"), keys)


def _resources_only(container: Mapping[str, Any]) -> dict[str, Any]:
    return _pick(container, ("name", "resources", "restartPolicy"))


def slim_pod(pod: Mapping[str, Any]) -> Slim:
    """What capacity and admission read (requests, placement, gates, binding, phase) and, for the
    operator's own pods, what a reconcile reads too: all metadata but managedFields, and the status
    fields the pod outcome reads."""
    spec = pod.get("spec") or {}
    ours = c.LABEL_JOB_NAME in ((pod.get("metadata") or {}).get("labels") or {})
    if ours:
        metadata = {k: v for k, v in (pod.get("metadata") or {}).items() if k != "managedFields"}
    else:
        metadata = _metadata(pod, "labels", "ownerReferences")
    slim_spec = _pick(
        spec, ("nodeName", "nodeSelector", "schedulingGates", "tolerations", "overhead", "priority")
    )
    affinity = (spec.get("affinity") or {}).get("nodeAffinity")
    if affinity:
        slim_spec["affinity"] = {"nodeAffinity": affinity}
    slim_spec["containers"] = [_resources_only(x) for x in spec.get("containers") or ()]
    if spec.get("initContainers"):
        slim_spec["initContainers"] = [_resources_only(x) for x in spec["initContainers"]]
    status = _own_pod_status(pod.get("status") or {}) if ours else _pick(pod.get("status"), ("phase",))
    return {"metadata": metadata, "spec": slim_spec, "status": status}


def _own_pod_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """What the pod outcome, the gang's counters and the progress poll read: phase, reason, the pod's
    IP, its conditions without probe times, and each container's termination, if any."""
    slim = _pick(status, ("phase", "reason", "message", "podIP"))
    conditions = [
        _pick(x, ("type", "status", "reason", "message", "lastTransitionTime"))
        for x in status.get("conditions") or ()
    ]
    if conditions:
        slim["conditions"] = conditions
    for key in ("containerStatuses", "initContainerStatuses"):
        containers = [
            {"name": x.get("name"), "state": {"terminated": (x.get("state") or {})["terminated"]}}
            for x in status.get(key) or ()
            if (x.get("state") or {}).get("terminated")
        ]
        if containers:
            slim[key] = containers
    return slim


def slim_node(node: Mapping[str, Any]) -> Slim:
    """Capacity, labels, taints and the Ready condition: what NodeInfo and the pod outcome read."""
    status = node.get("status") or {}
    # Heartbeat times change every few seconds and mean nothing here; lastTransitionTime changes only
    # when readiness does, and tells how long a node has been not Ready (policy/node_loss.py).
    ready = [
        _pick(x, ("type", "status", "reason", "lastTransitionTime"))
        for x in status.get("conditions") or ()
        if x.get("type") == "Ready"
    ]
    return {
        "metadata": _metadata(node, "labels"),
        "spec": _pick(node.get("spec"), ("taints", "unschedulable")),
        "status": {**_pick(status, ("allocatable", "capacity")), "conditions": ready},
    }


def slim_job(job: Mapping[str, Any]) -> Slim:
    """A TrainingJob as a reconcile reads it, without managedFields and kopf's bookkeeping
    annotation (a copy of the whole spec)."""
    metadata = {k: v for k, v in (job.get("metadata") or {}).items() if k != "managedFields"}
    annotations = {
        k: v for k, v in (metadata.get("annotations") or {}).items() if not k.startswith(c.GROUP + "/")
    }
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    return {"metadata": metadata, "spec": job.get("spec") or {}, "status": job.get("status") or {}}


def slim_priority_class(priority_class: Mapping[str, Any]) -> Slim:
    """Its name and value: all the admission pass reads."""
    return {"metadata": _metadata(priority_class), "value": int(priority_class.get("value") or 0)}


def object_key(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata.get('name')}" if namespace else str(metadata.get("name"))


def resource_version(obj: Mapping[str, Any]) -> int:
    """etcd's revision; the API calls it opaque, but every server built on etcd gives an integer,
    and client-go's assume cache orders by it the same way."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


INDEX_PRIMARY: Final = "primary"  # the index a store is built with (pods: their TrainingJob)
INDEX_NODE: Final = "node"  # pods by the node they are bound to, or admitted onto and not bound yet
# How long a deleted key is remembered: far longer than any reply to our own write can take (the
# client's read timeout is a minute), so a late reply never brings a deleted object back.
TOMBSTONE_SECONDS: Final = 300.0


def node_of(pod: Slim) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or planned_node(pod)


SHARED_STRING_MAX = 24  # short values repeat across objects: phases, reasons, labels, timestamps


def compact(value: Any) -> Any:
    """The same JSON value, its keys and short strings shared with every other copy held.

    Each decoded watch event brings its own copies of "metadata", "Running", "phalanx.dev/job-name"
    and so on; held for thousands of objects they were about half of the stores' memory.
    """
    if isinstance(value, dict):
        return {sys.intern(k): compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= SHARED_STRING_MAX:
        return sys.intern(value)
    return value


class StoreObserver(Protocol):
    """Keeps something derived from a store's objects up to date (gang.usage.UsageIndex)."""

    def changed(self, key: str, new: Slim | None) -> None: ...

    def reset(self, objects: Mapping[str, Slim]) -> None: ...


class Store:
    """key -> slim object, newest resourceVersion wins; thread-safe."""

    def __init__(
        self,
        slim: Callable[[Mapping[str, Any]], Slim],
        index: Callable[[Slim], str | None] | None = None,
        observer: StoreObserver | None = None,
        by_node: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slim = slim
        # Told of every change under the store's lock, so it sees them in the store's order.
        self._observer = observer
        self._lock = threading.Lock()
        self._objects: dict[str, Slim] = {}
        # Secondary indexes, name -> (value of an object, value -> keys): for pods their TrainingJob
        # (INDEX_PRIMARY) and their node (INDEX_NODE: a node event reads its pods, not every pod).
        self._indexes: dict[str, tuple[Callable[[Slim], str | None], dict[str, set[str]]]] = {}
        if index is not None:
            self._indexes[INDEX_PRIMARY] = (index, {})
        if by_node:
            self._indexes[INDEX_NODE] = (node_of, {})
        # Deleted keys, the revision of the delete and when it was seen: a late reply to our own
        # write must not bring a deleted object back. Kept TOMBSTONE_SECONDS, not until the next list
        # (a watch resumes without listing for days, and every deleted pod would stay).
        self._deleted: dict[str, tuple[int, float]] = {}
        self._clock = clock
        self._pruned_at = clock()
        # The lists that must arrive before the store is synced: one per namespace reflector.
        self._unlisted: set[str | None] = {None}
        self.synced = threading.Event()

    def expect_lists(self, namespaces: Iterable[str | None]) -> None:
        """The store is synced once each of these namespaces (None: every namespace) has listed."""
        with self._lock:
            self._unlisted = set(namespaces)

    def slimmed(self, items: Iterable[Mapping[str, Any]]) -> dict[str, Slim]:
        """key -> slim copy of each object (a list page: the raw page can go as soon as it is read)."""
        return {object_key(o): compact(self._slim(o)) for o in items}

    def replace(
        self, items: Iterable[Mapping[str, Any]], list_version: int, namespace: str | None = None
    ) -> None:
        """A full list at list_version (raw objects); see replace_slimmed."""
        self.replace_slimmed(self.slimmed(items), list_version, namespace)

    def replace_slimmed(
        self, fresh: dict[str, Slim], list_version: int, namespace: str | None = None
    ) -> None:
        """A full list at list_version, slimmed already (slimmed()): the truth for every object not
        written after it.

        `namespace`: the list covers that namespace only (one reflector per watched namespace feeds
        one store), so objects of other namespaces are kept as they are.
        """
        prefix = f"{namespace}/" if namespace is not None else ""

        def covered(key: str) -> bool:
            return key.startswith(prefix)

        with self._lock:
            for key, obj in self._objects.items():
                if key in fresh:
                    continue
                if not covered(key) or resource_version(obj) > list_version:
                    fresh[key] = obj  # another namespace's, or created (and assumed) after the list
            self._objects = fresh
            self._deleted = {k: v for k, v in self._deleted.items() if v[0] > list_version or not covered(k)}
            for _, values in self._indexes.values():
                values.clear()
            for key, obj in fresh.items():
                self._index_add(key, obj)
            if self._observer is not None:
                self._observer.reset(fresh)
            self._unlisted.discard(namespace)
            complete = not self._unlisted
        if complete:
            self.synced.set()  # not before: admission on one namespace's jobs would see a partial view

    def upsert(self, obj: Mapping[str, Any]) -> tuple[Slim | None, Slim] | None:
        """Stores obj unless a newer copy is held; returns (old, new) when it changed the store."""
        key, version = object_key(obj), resource_version(obj)
        with self._lock:
            tombstone = self._deleted.get(key)
            if tombstone is not None and tombstone[0] >= version:
                return None
            old = self._objects.get(key)
            if old is not None and resource_version(old) >= version:
                return None
            new = compact(self._slim(obj))
            if old is not None:
                self._index_remove(key, old)
            self._objects[key] = new
            self._index_add(key, new)
            self._deleted.pop(key, None)
            if self._observer is not None:
                self._observer.changed(key, new)
            return old, new

    def delete(self, obj: Mapping[str, Any]) -> Slim | None:
        key, version = object_key(obj), resource_version(obj)
        with self._lock:
            old = self._objects.get(key)
            if old is not None and resource_version(old) > version:
                return None  # recreated since
            now = self._clock()
            self._deleted[key] = (version, now)
            if now - self._pruned_at >= TOMBSTONE_SECONDS:
                self._deleted = {k: v for k, v in self._deleted.items() if now - v[1] < TOMBSTONE_SECONDS}
                self._pruned_at = now
            old = self._objects.pop(key, None)
            if old is not None:
                self._index_remove(key, old)
                if self._observer is not None:
                    self._observer.changed(key, None)
            return old

    def _index_add(self, key: str, obj: Slim) -> None:
        for value_of, values in self._indexes.values():
            value = value_of(obj)
            if value is not None:
                values.setdefault(value, set()).add(key)

    def _index_remove(self, key: str, obj: Slim) -> None:
        for value_of, values in self._indexes.values():
            value = value_of(obj)
            keys = values.get(value) if value is not None else None
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del values[value]  # type: ignore[arg-type]

    def indexed(self, value: str, index: str = INDEX_PRIMARY) -> list[Slim]:
        """The objects whose `index` value is `value` (for pods: the pods of one TrainingJob, or with
        INDEX_NODE the pods bound to one node or admitted onto it)."""
        with self._lock:
            entry = self._indexes.get(index)
            return [self._objects[k] for k in (entry[1].get(value, ()) if entry is not None else ())]

    def tombstones(self) -> int:
        with self._lock:
            return len(self._deleted)

    def get(self, key: str) -> Slim | None:
        with self._lock:
            return self._objects.get(key)

    def items(self) -> list[Slim]:
        with self._lock:
            return list(self._objects.values())

    def as_dict(self) -> dict[str, Slim]:
        with self._lock:
            return dict(self._objects)

    def __len__(self) -> int:
        return len(self._objects)


def frees_or_changes_capacity(old: Slim | None, new: Slim | None) -> bool:
    """Whether a pod change can let a waiting gang in: it finished, went away, or lost its node."""
    if new is None:
        return True
    phase = (new.get("status") or {}).get("phase")
    old_phase = ((old or {}).get("status") or {}).get("phase")
    return phase in TERMINAL_PHASES and phase != old_phase


def node_changed_for_admission(old: Slim | None, new: Slim | None) -> bool:
    """Added, removed, or its capacity, taints, cordon, labels or readiness changed."""
    if old is None or new is None:
        return True
    return _without_version(old) != _without_version(new)


def _without_version(obj: Slim) -> Slim:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": None}}
