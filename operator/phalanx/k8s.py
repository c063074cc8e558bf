"""The operator's Kubernetes calls: JSON dicts in and out (camelCase, as the API speaks)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3

from phalanx import constants as c
from phalanx import metrics
from phalanx.kube_client import ApiError, KubeClient, Timeout, load_client

log = logging.getLogger("phalanx.k8s")


def load_lease_client() -> KubeClient:
    """The leader election's own client (LeaseApi): fewer retries than the default, see LEASE_RETRIES."""
    return load_client(retries=LEASE_RETRIES)


def release(response: Any) -> None:
    """Reads the unwanted body of a raw response so its connection goes back to the pool: one left
    unread is dropped, and the next request pays a new TCP and TLS handshake, on both sides."""
    response.drain_conn()
    response.release_conn()


def _pointer(key: str) -> str:
    """A map key as one JSON pointer token (RFC 6901): label keys hold '/'."""
    return key.replace("~", "~0").replace("/", "~1")


def short_error(exc: BaseException) -> str:
    """One line: an ApiError's status and reason, not its headers and body."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"


def api_message(exc: ApiError) -> str:
    """The message of the API server's Status body (what kubectl prints), else the HTTP reason."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or short_error(exc))[:900]


# -- paths and query parameters ----------------------------------------------------------------------
def core_path(resource: str, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
    return _path("/api/v1", resource, namespace, name, sub)


def group_path(
    group: str,
    version: str,
    resource: str,
    namespace: str | None = None,
    name: str | None = None,
    sub: str = "",
) -> str:
    return _path(f"/apis/{group}/{version}", resource, namespace, name, sub)


def _path(prefix: str, resource: str, namespace: str | None, name: str | None, sub: str) -> str:
    path = prefix + (f"/namespaces/{quote(namespace, safe='')}" if namespace else "") + f"/{resource}"
    if name is not None:
        path += f"/{quote(name, safe='')}"
    return path + (f"/{sub}" if sub else "")


# The reflectors' and callers' parameter names (reflector.py) as the API server spells them.
QUERY_NAMES = {
    "label_selector": "labelSelector", "field_selector": "fieldSelector", "limit": "limit",
    "_continue": "continue", "resource_version": "resourceVersion", "watch": "watch",
    "allow_watch_bookmarks": "allowWatchBookmarks", "timeout_seconds": "timeoutSeconds",
}  # fmt: skip


def list_or_watch(client: KubeClient, path: str, params: Mapping[str, Any]) -> Any:
    """One list page or a watch of `path`, unread; `_request_timeout` is the (connect, read) limit."""
    timeout: Timeout | None = params.get("_request_timeout")
    query = {QUERY_NAMES[k]: v for k, v in params.items() if k != "_request_timeout"}
    return client.request("GET", path, query, timeout=timeout)


def delete_options(
    uid: str | None = None,
    resource_version: str | None = None,
    propagation: str | None = None,
    grace_seconds: int | None = None,
) -> dict[str, Any]:
    preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
    options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if propagation:
        options["propagationPolicy"] = propagation
    if grace_seconds is not None:
        options["gracePeriodSeconds"] = grace_seconds
    if preconditions:
        options["preconditions"] = preconditions
    return options


REQUEST_TIMEOUT = (10.0, 60.0)  # connect, read: seconds
LEASE_REQUEST_TIMEOUT = (2.0, 4.0)  # within a renew deadline of 10 s: a renewal gets two tries
# One new connection if the first fails before sending; no retry after a send (the elector reads the
# lease again and decides, within its deadline: 3 retries of 4 s reads would outlast it).
LEASE_RETRIES = urllib3.Retry(total=1, connect=1, read=0, redirect=False, status_forcelist=(),
                              respect_retry_after_header=False)  # fmt: skip


def count_requests(api_client: KubeClient, write_fence: Callable[[], None] | None = None) -> None:
    """Counts every request of this client in phalanx_api_requests_total (endpoint: the path template,
    so the series stay few). `write_fence` runs before every write and may refuse it (leader.py).
    A request that brings no timeout and does not watch gets REQUEST_TIMEOUT: never wait forever (a
    half-open connection would hang a worker, or land a write long after the fence let it through).
    The client applies all three to each request (KubeClient.request), so no writer can forget them."""
    api_client.write_fence = write_fence
    api_client.default_timeout = REQUEST_TIMEOUT
    api_client.observe = _observe


def _observe(method: str, path: str, status: int | None) -> None:
    metrics.observe_api_request(method, endpoint_template(path), status)


def endpoint_template(url: str) -> str:
    """The API path with namespace and object names replaced, so metric series stay few:
    https://host/api/v1/namespaces/ns1/pods/p-0?x=1 -> /api/v1/namespaces/{namespace}/pods/{name}."""
    path = urlsplit(url).path if "://" in url else url.split("?", 1)[0]
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        prefix, rest = parts[:2], parts[2:]
    elif parts[:1] == ["apis"]:
        prefix, rest = parts[:3], parts[3:]
    else:
        return path
    if len(rest) >= 2 and rest[0] == "namespaces":
        rest = ["namespaces", "{namespace}", *rest[2:]]
        resource_at = 2
    else:
        resource_at = 0
    if len(rest) > resource_at + 1:
        rest[resource_at + 1] = "{name}"
    return "/" + "/".join(prefix + rest)


FACT_WRITE_ATTEMPTS = 3  # a busy job's version moves on between a read and a write; not forever


class CreationRefused(Exception):
    """The API server refused to create an object: 403 (ResourceQuota, Pod Security or another
    admission policy) or 422 (invalid). `message` is the API server's own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


REFUSED_CREATE_STATUSES = frozenset((403, 422))


class StatusConflict(Exception):
    """A conditional status write found a newer job than the one the decision was made on."""


class KubeApi:
    def __init__(self, api_client: KubeClient, write_fence: Callable[[], None] | None = None) -> None:
        self.api_client = api_client
        count_requests(api_client, write_fence)

    @staticmethod
    def _json(response: Any) -> Any:
        return json.loads(response.data)  # reading the whole body returns the connection to the pool

    def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        return self.api_client.request(method, path, params, body, content_type)

    def _read(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """The answer's JSON."""
        return self._json(self._send(method, path, body, content_type=content_type))

    def _discard(self, method: str, path: str, body: Any = None) -> None:
        """Sent for its effect: the answer is read to free the connection."""
        release(self._send(method, path, body))

    # -- raw list/watch requests for the reflectors (reflector.py) -----------------------------
    def pods_request(self, **params: Any) -> Any:
        """Every pod in every namespace: finished ones too, since a reconcile reads its job's outcome
        from them (capacity skips them)."""
        return list_or_watch(self.api_client, core_path("pods"), params)

    def nodes_request(self, **params: Any) -> Any:
        return list_or_watch(self.api_client, core_path("nodes"), params)

    def jobs_request(self, namespace: str | None, **params: Any) -> Any:
        return list_or_watch(self.api_client, _jobs(namespace), params)

    # -- TrainingJobs ---------------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            job: dict[str, Any] = self._read("GET", _jobs(namespace, name))
            return job
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any] | None:
        """Merge-patches status if the job is still `resource_version` (the version a decision was
        made on; a job re-created under the name never is): returns the job as stored, None when it
        is gone, StatusConflict when it changed (read again and decide again)."""
        try:
            return self._patch_status(namespace, name, status, resource_version)
        except ApiError as exc:
            if exc.status == 409:
                raise StatusConflict(f"{namespace}/{name} changed since version {resource_version}") from exc
            if exc.status != 404:
                raise
            return None

    def patch_job_facts(
        self, namespace: str, name: str, status: dict[str, Any], uid: str, resource_version: str | None,
        retry_on_conflict: bool = True,
    ) -> dict[str, Any] | None:  # fmt: skip
        """Merge-patches status fields that no decision rests on (the trainer's progress, why a gang
        waits) into the job with this `uid`, whatever its version; never into a successor under the
        same name. Returns the job as stored, None when that job is gone.

        The API server ignores a uid in a status patch, so the write is conditional on a version:
        `resource_version` first (the caller's copy), and after a conflict the current one, once its
        uid is checked. retry_on_conflict=False: StatusConflict instead, the fact being one that a
        newer version of the job may have made untrue (why a gang waits, once it was admitted)."""
        for _ in range(FACT_WRITE_ATTEMPTS):
            if resource_version is not None:
                try:
                    return self._patch_status(namespace, name, status, resource_version)
                except ApiError as exc:
                    if exc.status == 404:
                        return None
                    if exc.status != 409:
                        raise
                    if not retry_on_conflict:
                        raise StatusConflict(
                            f"{namespace}/{name} changed; {sorted(status)} not written"
                        ) from exc
            current = self.get_job(namespace, name)
            if current is None or current["metadata"].get("uid") != uid:
                return None
            resource_version = current["metadata"]["resourceVersion"]
        raise StatusConflict(f"{namespace}/{name} kept changing; {sorted(status)} not written")

    def _patch_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any]:
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        job: dict[str, Any] = self._read("PATCH", _jobs(namespace, name, "status"), body, MERGE_PATCH)
        return job

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """Deletes the job with this `uid`; a successor re-created under its name is left alone."""
        try:
            self._discard("DELETE", _jobs(namespace, name), delete_options(uid, propagation="Background"))
        except ApiError as exc:
            if exc.status not in (404, 409):  # 409: the uid precondition failed, it is someone else
                raise

    # -- pods, services, nodes --------------------------------------------------------------------
    def list_job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        selector = {"labelSelector": f"{c.LABEL_JOB_NAME}={job_name}"}
        items: list[dict[str, Any]] = self._json(
            self._send("GET", core_path("pods", namespace), params=selector)
        )["items"]
        return items

    def trainingjob_crd(self) -> dict[str, Any] | None:
        """The installed TrainingJob CustomResourceDefinition; None when absent. Listed by name
        (the list and watch kopf needs already; no get on CRDs is granted)."""
        selector = {"fieldSelector": f"metadata.name={c.CRD_NAME}"}
        items: list[dict[str, Any]] = self._json(self._send("GET", CRDS, params=selector))["items"]
        return items[0] if items else None

    def priority_classes_request(self, **params: Any) -> Any:
        """List or watch PriorityClasses (the admission pass's values, reflector.py)."""
        return list_or_watch(self.api_client, PRIORITY_CLASSES, params)

    def priority_values(self) -> dict[str, int]:
        out = self._read("GET", PRIORITY_CLASSES)
        return {pc["metadata"]["name"]: int(pc.get("value", 0)) for pc in out["items"]}

    def create_if_absent(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Creates a namespaced object and returns it as stored; None when it already exists
        (idempotent retries); CreationRefused when the API server will not have it."""
        try:
            created: dict[str, Any] = self._read("POST", _collection_of(manifest), manifest)
            return created
        except ApiError as exc:
            if exc.status == 409:
                return None
            if exc.status in REFUSED_CREATE_STATUSES:
                raise CreationRefused(exc.status, api_message(exc)) from exc
            raise

    def read_like(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """The stored object of the manifest's kind, namespace and name; None when absent."""
        path = f"{_collection_of(manifest)}/{quote(manifest['metadata']['name'], safe='')}"
        try:
            stored: dict[str, Any] = self._read("GET", path)
            return stored
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def delete_pod(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        grace_seconds: int | None,
        resource_version: str | None = None,
    ) -> None:
        """A 409 (the pod changed: another uid, or a newer version than `resource_version`) deletes
        nothing and is no error: the next pass decides on what it became."""
        body = delete_options(uid, resource_version, grace_seconds=grace_seconds)
        try:
            self._discard("DELETE", core_path("pods", namespace, name), body)
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def relabel_pod(
        self, namespace: str, name: str, uid: str, labels: dict[str, str], remove: tuple[str, ...] = ()
    ) -> dict[str, Any] | None:
        """Sets `labels` and removes the labels named in `remove` (each must be there) on this very
        pod (a JSON patch that first tests its uid); returns the pod as stored, None when it is gone
        or is another pod now (404, or the test failed: 409/422)."""
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            *(
                {"op": "add", "path": f"/metadata/labels/{_pointer(k)}", "value": v}
                for k, v in labels.items()
            ),
            *({"op": "remove", "path": f"/metadata/labels/{_pointer(k)}"} for k in remove),
        ]
        try:
            return self._json_patch_pod(namespace, name, patch)
        except ApiError as exc:
            if exc.status not in (404, 409, 422):
                raise
            # The spare keeps its rank through status.inPlace.keptPods (policy/in_place.py), and the
            # next pass tries again; said, since whatever indexes pods by label misses it meanwhile.
            log.warning("relabelling pod %s/%s (uid %s) as %s failed: %s", namespace, name, uid, labels,
                        short_error(exc))  # fmt: skip
            return None

    def evict_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None) -> bool:
        """Asks the Eviction API to stop the pod: the API server marks it DisruptionTarget
        (EvictionByEvictionAPI) and honours PodDisruptionBudgets. False when a budget refuses it now
        (429); a pod already gone counts as evicted."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": delete_options(uid, grace_seconds=grace_seconds),
        }
        try:
            self._discard("POST", core_path("pods", namespace, name, "eviction"), body)
        except ApiError as exc:
            if exc.status == 429:
                return False
            if exc.status not in (404, 409):
                raise
        return True

    def admit_pod(self, namespace: str, name: str, admitted_spec: dict[str, Any]) -> dict[str, Any] | None:
        """Writes the node pin (affinity) and gates of `admitted_spec` (builders.pods.admitted_pod)
        onto the gated pod in one JSON patch; returns the pod as stored, None when it is gone."""
        patch: list[dict[str, Any]] = [
            {"op": "add", "path": "/spec/affinity", "value": admitted_spec["affinity"]},
            {
                "op": "replace",
                "path": "/spec/schedulingGates",
                "value": admitted_spec.get("schedulingGates", []),
            },
        ]
        try:
            return self._json_patch_pod(namespace, name, patch)
        except ApiError as exc:
            if exc.status != 404:
                raise
            return None

    def _json_patch_pod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
        """One JSON patch (RFC 6902) of a pod; the pod as stored."""
        pod: dict[str, Any] = self._read("PATCH", core_path("pods", namespace, name), patch, JSON_PATCH)
        return pod

    # -- Kueue (controller/kueue_workloads.py); the Workload itself is created with create_if_absent ---
    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Workload; None when absent (or when Kueue's API is not served at all)."""
        try:
            workload: dict[str, Any] = self._read("GET", _workloads(namespace, name))
            return workload
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_workload(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patches the Workload (its spec.active, its finalizers); None when it is gone,
        StatusConflict when the patch names a resourceVersion that is no longer current,
        CreationRefused when an admission webhook (Kueue's) refuses the change."""
        try:
            workload: dict[str, Any] = self._read("PATCH", _workloads(namespace, name), patch, MERGE_PATCH)
            return workload
        except ApiError as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise StatusConflict(f"Workload {namespace}/{name} changed meanwhile") from exc
            if exc.status in REFUSED_CREATE_STATUSES:  # Kueue's validating webhook, in its words
                raise CreationRefused(exc.status, api_message(exc)) from exc
            raise

    def workloads_request(self, namespace: str | None, **params: Any) -> Any:
        """List or watch this operator's Workloads (controller/kueue_workloads.py: a change enqueues
        the owning job at once; reflector.py)."""
        params = {"label_selector": f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}", **params}
        return list_or_watch(self.api_client, _workloads(namespace), params)

    def list_workloads(self, namespace: str | None, label_selector: str) -> list[dict[str, Any]] | None:
        """The Workloads with these labels in `namespace` (None: every namespace); None when the API
        server serves no Kueue Workloads."""
        try:
            out = self._json(
                self._send("GET", _workloads(namespace), params={"labelSelector": label_selector})
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        items: list[dict[str, Any]] = out["items"]
        return items

    def delete_workload(self, namespace: str, name: str, uid: str | None) -> None:
        """Deletes the Workload with this `uid` (one built from an older version of its job); gone
        already, or replaced meanwhile (the uid precondition fails), is fine."""
        try:
            self._discard(
                "DELETE", _workloads(namespace, name), delete_options(uid, propagation="Background")
            )
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def patch_workload_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any] | None:
        """Merge-patches the Workload's status if it is still `resource_version` (Kueue writes it
        too): returns it as stored, None when it is gone, StatusConflict when it changed."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            workload: dict[str, Any] = self._read(
                "PATCH", _workloads(namespace, name, "status"), body, MERGE_PATCH
            )
            return workload
        except ApiError as exc:
            if exc.status == 409:
                raise StatusConflict(f"Workload {namespace}/{name} changed since {resource_version}") from exc
            if exc.status == 404:
                return None
            raise

    def get_resource_flavor(self, name: str) -> dict[str, Any] | None:
        try:
            flavor: dict[str, Any] = self._read(
                "GET", group_path(c.KUEUE_GROUP, c.KUEUE_VERSION, "resourceflavors", None, name)
            )
            return flavor
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create_event(self, job: dict[str, Any], type_: str, reason: str, message: str, now_iso: str) -> None:
        meta = job["metadata"]
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": c.API_VERSION, "kind": c.KIND, "name": meta["name"],
                "namespace": meta["namespace"], "uid": meta["uid"],
            },
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": "phalanx-operator"},
            "firstTimestamp": now_iso, "lastTimestamp": now_iso, "count": 1,
            "reportingComponent": "phalanx.dev/operator", "reportingInstance": "phalanx-operator",
        }  # fmt: skip
        try:
            self._discard("POST", core_path("events", meta["namespace"]), body)
        except ApiError as exc:
            if exc.status not in (404, 409, 403):
                raise


MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PRIORITY_CLASSES = group_path("scheduling.k8s.io", "v1", "priorityclasses")
CRDS = group_path("apiextensions.k8s.io", "v1", "customresourcedefinitions")


def _jobs(namespace: str | None, name: str | None = None, sub: str = "") -> str:
    return group_path(c.GROUP, c.VERSION, c.PLURAL, namespace, name, sub)


def _workloads(namespace: str | None, name: str | None = None, sub: str = "") -> str:
    return group_path(c.KUEUE_GROUP, c.KUEUE_VERSION, "workloads", namespace, name, sub)


def _collection_of(manifest: dict[str, Any]) -> str:
    """Where a namespaced object of the manifest's kind is created: pods and services are core,
    the rest (Kueue Workloads) are custom resources named by their lowercase plural."""
    namespace = manifest["metadata"]["namespace"]
    if manifest["kind"] in ("Pod", "Service"):
        return core_path(manifest["kind"].lower() + "s", namespace)
    group, version = manifest["apiVersion"].split("/")
    return group_path(group, version, manifest["kind"].lower() + "s", namespace)


class LeaseApi:
    """coordination.k8s.io/v1 Leases for leader.LeaderElector, on a client of their own: the write
    fence of the operator's other requests must not stop the lease renewals themselves."""

    def __init__(self, api_client: KubeClient) -> None:
        self.api_client = api_client

    def _lease(self, method: str, namespace: str, name: str | None = None, body: Any = None) -> Any:
        path = group_path("coordination.k8s.io", "v1", "leases", namespace, name)
        return self.api_client.request(method, path, None, body, timeout=LEASE_REQUEST_TIMEOUT)

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response = self._lease("GET", namespace, name)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        lease: dict[str, Any] = json.loads(response.data)
        return lease

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        release(self._lease("POST", namespace, None, body))

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        release(self._lease("PUT", namespace, name, body))
