"""The operator's Kubernetes calls: JSON dicts in and out (camelCase, as the API speaks)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlsplit

from kubernetes import client, config
from kubernetes.client import ApiException

from phalanx import constants as c
from phalanx import metrics

log = logging.getLogger("phalanx.k8s")


def load_api_client() -> client.ApiClient:
    """In-cluster service account first, else the current kubeconfig (KUBECONFIG)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = 32
    return client.ApiClient(configuration)


def release(response: Any) -> None:
    """Reads the unwanted body of a raw response so its connection goes back to the pool: one left
    unread is dropped, and the next request pays a new TCP and TLS handshake, on both sides."""
    response.drain_conn()
    response.release_conn()


def _without_none(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def _pointer(key: str) -> str:
    """A map key as one JSON pointer token (RFC 6901): label keys hold '/'."""
    return key.replace("~", "~0").replace("/", "~1")


def short_error(exc: BaseException) -> str:
    """One line: an ApiException's status and reason, not its headers and body."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"


def api_message(exc: ApiException) -> str:
    """The message of the API server's Status body (what kubectl prints), else the HTTP reason."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or short_error(exc))[:900]


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
REQUEST_TIMEOUT = (10.0, 60.0)  # connect, read: seconds
LEASE_REQUEST_TIMEOUT = (2.0, 4.0)  # within a renew deadline of 10 s: a renewal gets two tries


def count_requests(api_client: client.ApiClient, write_fence: Callable[[], None] | None = None) -> None:
    """Counts every request of this client in phalanx_api_requests_total (endpoint: the path template,
    so the series stay few). `write_fence` runs before every write and may refuse it (leader.py):
    one place, so no writer can forget it."""
    send = api_client.call_api

    def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if write_fence is not None and method.upper() not in READ_METHODS:
            write_fence()
        if len(args) < 4 and kwargs.get("_request_timeout") is None and "watch=true" not in url.lower():
            # Never wait forever (a half-open connection would hang a worker, or land a write long
            # after the fence let it through); watches bring their own, longer timeout.
            kwargs["_request_timeout"] = REQUEST_TIMEOUT
        endpoint = endpoint_template(url)
        try:
            response = send(method, url, *args, **kwargs)
        except ApiException as exc:
            metrics.observe_api_request(method, endpoint, exc.status)
            raise
        except Exception:
            metrics.observe_api_request(method, endpoint, None)
            raise
        # The client raises for an error status only later, when it reads the answer.
        metrics.observe_api_request(method, endpoint, _status_of(response))
        return response

    api_client.call_api = counted  # type: ignore[method-assign,assignment]


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


def _status_of(response: Any) -> int | None:
    status = getattr(response, "status", None)
    return status if isinstance(status, int) else None


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
    def __init__(self, api_client: client.ApiClient, write_fence: Callable[[], None] | None = None) -> None:
        self.api_client = api_client
        count_requests(api_client, write_fence)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)

    @staticmethod
    def _json(response: Any) -> Any:
        return json.loads(response.data)  # reading the whole body returns the connection to the pool

    # -- raw list/watch requests for the reflectors (reflector.py) -----------------------------
    def pods_request(self, **params: Any) -> Any:
        """Every pod in every namespace: finished ones too, since a reconcile reads its job's outcome
        from them (capacity skips them)."""
        return self.core.list_pod_for_all_namespaces(_preload_content=False, **_without_none(params))

    def nodes_request(self, **params: Any) -> Any:
        return self.core.list_node(_preload_content=False, **_without_none(params))

    def jobs_request(self, namespace: str | None, **params: Any) -> Any:
        params = _without_none(params)
        if namespace is None:
            return self.custom.list_cluster_custom_object(
                c.GROUP, c.VERSION, c.PLURAL, _preload_content=False, **params
            )
        return self.custom.list_namespaced_custom_object(
            c.GROUP, c.VERSION, namespace, c.PLURAL, _preload_content=False, **params
        )

    # -- TrainingJobs ---------------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            job: dict[str, Any] = self._json(
                self.custom.get_namespaced_custom_object(
                    c.GROUP, c.VERSION, namespace, c.PLURAL, name, _preload_content=False
                )
            )
            return job
        except ApiException as exc:
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
        except ApiException as exc:
            if exc.status == 409:
                raise StatusConflict(f"{namespace}/{name} changed since version {resource_version}") from exc
            if exc.status != 404:
                raise
            return None

    def patch_job_facts(
        self, namespace: str, name: str, status: dict[str, Any], uid: str, resource_version: str | None
    ) -> dict[str, Any] | None:
        """Merge-patches status fields that no decision rests on (the trainer's progress, why a gang
        waits) into the job with this `uid`, whatever its version; never into a successor under the
        same name. Returns the job as stored, None when that job is gone.

        The API server ignores a uid in a status patch, so the write is conditional on a version:
        `resource_version` first (the caller's copy), and after a conflict the current one, once its
        uid is checked."""
        for _ in range(FACT_WRITE_ATTEMPTS):
            if resource_version is not None:
                try:
                    return self._patch_status(namespace, name, status, resource_version)
                except ApiException as exc:
                    if exc.status == 404:
                        return None
                    if exc.status != 409:
                        raise
            current = self.get_job(namespace, name)
            if current is None or current["metadata"].get("uid") != uid:
                return None
            resource_version = current["metadata"]["resourceVersion"]
        raise StatusConflict(f"{namespace}/{name} kept changing; {sorted(status)} not written")

    def _patch_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any]:
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        job: dict[str, Any] = self._json(
            self.custom.patch_namespaced_custom_object_status(
                c.GROUP,
                c.VERSION,
                namespace,
                c.PLURAL,
                name,
                body,
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        )
        return job

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """Deletes the job with this `uid`; a successor re-created under its name is left alone."""
        body = client.V1DeleteOptions(
            propagation_policy="Background", preconditions=client.V1Preconditions(uid=uid)
        )
        try:
            release(self.custom.delete_namespaced_custom_object(
                c.GROUP, c.VERSION, namespace, c.PLURAL, name, body=body, _preload_content=False,
            ))  # fmt: skip
        except ApiException as exc:
            if exc.status not in (404, 409):  # 409: the uid precondition failed, it is someone else
                raise

    # -- pods, services, nodes --------------------------------------------------------------------
    def list_job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        out = self.core.list_namespaced_pod(
            namespace, label_selector=f"{c.LABEL_JOB_NAME}={job_name}", _preload_content=False
        )
        items: list[dict[str, Any]] = self._json(out)["items"]
        return items

    def priority_classes_request(self, **params: Any) -> Any:
        """List or watch PriorityClasses (the admission pass's values, reflector.py)."""
        return self.scheduling.list_priority_class(_preload_content=False, **_without_none(params))

    def priority_values(self) -> dict[str, int]:
        out = self._json(self.scheduling.list_priority_class(_preload_content=False))
        return {pc["metadata"]["name"]: int(pc.get("value", 0)) for pc in out["items"]}

    def create_if_absent(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Creates a namespaced object and returns it as stored; None when it already exists
        (idempotent retries); CreationRefused when the API server will not have it."""
        namespace = manifest["metadata"]["namespace"]
        response: Any
        try:
            if manifest["kind"] == "Pod":
                response = self.core.create_namespaced_pod(
                    namespace, cast(Any, manifest), _preload_content=False
                )
            elif manifest["kind"] == "Service":
                response = self.core.create_namespaced_service(
                    namespace, cast(Any, manifest), _preload_content=False
                )
            else:
                group, version = manifest["apiVersion"].split("/")
                plural = manifest["kind"].lower() + "s"
                response = self.custom.create_namespaced_custom_object(
                    group, version, namespace, plural, manifest, _preload_content=False
                )
        except ApiException as exc:
            if exc.status == 409:
                return None
            if exc.status in REFUSED_CREATE_STATUSES:
                raise CreationRefused(exc.status, api_message(exc)) from exc
            raise
        created: dict[str, Any] = self._json(response)
        return created

    def read_like(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """The stored object of the manifest's kind, namespace and name; None when absent."""
        meta = manifest["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        response: Any
        try:
            if manifest["kind"] == "Pod":
                response = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
            elif manifest["kind"] == "Service":
                response = self.core.read_namespaced_service(name, namespace, _preload_content=False)
            else:
                group, version = manifest["apiVersion"].split("/")
                plural = manifest["kind"].lower() + "s"
                response = self.custom.get_namespaced_custom_object(
                    group, version, namespace, plural, name, _preload_content=False
                )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        stored: dict[str, Any] = self._json(response)
        return stored

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
        body = client.V1DeleteOptions(
            grace_period_seconds=grace_seconds,
            preconditions=client.V1Preconditions(uid=uid, resource_version=resource_version)
            if uid or resource_version
            else None,
        )
        try:
            release(self.core.delete_namespaced_pod(name, namespace, body=body, _preload_content=False))
        except ApiException as exc:
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
        except ApiException as exc:
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
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=client.V1DeleteOptions(
                grace_period_seconds=grace_seconds,
                preconditions=client.V1Preconditions(uid=uid) if uid else None,
            ),
        )
        try:
            release(self.core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False))
        except ApiException as exc:
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
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None

    def _json_patch_pod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
        """One JSON patch (RFC 6902) of a pod; the pod as stored."""
        pod: dict[str, Any] = self._json(
            self.core.patch_namespaced_pod(
                name, namespace, patch, _content_type="application/json-patch+json", _preload_content=False
            )
        )
        return pod

    # -- Kueue (controller/kueue_workloads.py); the Workload itself is created with create_if_absent ---
    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Workload; None when absent (or when Kueue's API is not served at all)."""
        try:
            workload: dict[str, Any] = self._json(self.custom.get_namespaced_custom_object(
                c.KUEUE_GROUP, c.KUEUE_VERSION, namespace, "workloads", name, _preload_content=False
            ))  # fmt: skip
            return workload
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_workload(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patches the Workload (its spec.active, its finalizers); None when it is gone,
        StatusConflict when the patch names a resourceVersion that is no longer current,
        CreationRefused when an admission webhook (Kueue's) refuses the change."""
        try:
            workload: dict[str, Any] = self._json(self.custom.patch_namespaced_custom_object(
                c.KUEUE_GROUP, c.KUEUE_VERSION, namespace, "workloads", name, patch,
                _content_type="application/merge-patch+json", _preload_content=False,
            ))  # fmt: skip
            return workload
        except ApiException as exc:
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
        params = {"label_selector": f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}", **_without_none(params)}
        if namespace is None:
            return self.custom.list_cluster_custom_object(
                c.KUEUE_GROUP, c.KUEUE_VERSION, "workloads", _preload_content=False, **params
            )
        return self.custom.list_namespaced_custom_object(
            c.KUEUE_GROUP, c.KUEUE_VERSION, namespace, "workloads", _preload_content=False, **params
        )

    def list_workloads(self, namespace: str | None, label_selector: str) -> list[dict[str, Any]] | None:
        """The Workloads with these labels in `namespace` (None: every namespace); None when the API
        server serves no Kueue Workloads."""
        try:
            if namespace is None:
                out = self.custom.list_cluster_custom_object(
                    c.KUEUE_GROUP, c.KUEUE_VERSION, "workloads", label_selector=label_selector,
                    _preload_content=False,
                )  # fmt: skip
            else:
                out = self.custom.list_namespaced_custom_object(
                    c.KUEUE_GROUP, c.KUEUE_VERSION, namespace, "workloads", label_selector=label_selector,
                    _preload_content=False,
                )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        items: list[dict[str, Any]] = self._json(out)["items"]
        return items

    def delete_workload(self, namespace: str, name: str, uid: str | None) -> None:
        """Deletes the Workload with this `uid` (one built from an older version of its job); gone
        already, or replaced meanwhile (the uid precondition fails), is fine."""
        body = client.V1DeleteOptions(
            propagation_policy="Background", preconditions=client.V1Preconditions(uid=uid) if uid else None
        )
        try:
            release(self.custom.delete_namespaced_custom_object(
                c.KUEUE_GROUP, c.KUEUE_VERSION, namespace, "workloads", name, body=body, _preload_content=False,
            ))  # fmt: skip
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def patch_workload_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any] | None:
        """Merge-patches the Workload's status if it is still `resource_version` (Kueue writes it
        too): returns it as stored, None when it is gone, StatusConflict when it changed."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            workload: dict[str, Any] = self._json(self.custom.patch_namespaced_custom_object_status(
                c.KUEUE_GROUP, c.KUEUE_VERSION, namespace, "workloads", name, body,
                _content_type="application/merge-patch+json", _preload_content=False,
            ))  # fmt: skip
            return workload
        except ApiException as exc:
            if exc.status == 409:
                raise StatusConflict(f"Workload {namespace}/{name} changed since {resource_version}") from exc
            if exc.status == 404:
                return None
            raise

    def get_resource_flavor(self, name: str) -> dict[str, Any] | None:
        try:
            flavor: dict[str, Any] = self._json(self.custom.get_cluster_custom_object(
                c.KUEUE_GROUP, c.KUEUE_VERSION, "resourceflavors", name, _preload_content=False
            ))  # fmt: skip
            return flavor
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_event(self, job: dict[str, Any], type_: str, reason: str, message: str, now_iso: str) -> None:
        meta = job["metadata"]
        body = {
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
            release(
                self.core.create_namespaced_event(meta["namespace"], cast(Any, body), _preload_content=False)
            )
        except ApiException as exc:
            if exc.status not in (404, 409, 403):
                raise


class LeaseApi:
    """coordination.k8s.io/v1 Leases for leader.LeaderElector, on a client of their own: the write
    fence of the operator's other requests must not stop the lease renewals themselves."""

    def __init__(self, api_client: client.ApiClient) -> None:
        # Untyped on purpose: bodies go out as plain dicts and answers come back as raw JSON.
        self.coordination: Any = client.CoordinationV1Api(api_client)

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response = self.coordination.read_namespaced_lease(
                name, namespace, _preload_content=False, _request_timeout=LEASE_REQUEST_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        lease: dict[str, Any] = json.loads(response.data)
        return lease

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        release(self.coordination.create_namespaced_lease(
            namespace, body, _preload_content=False, _request_timeout=LEASE_REQUEST_TIMEOUT))  # fmt: skip

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        release(
            self.coordination.replace_namespaced_lease(
                name, namespace, body, _preload_content=False, _request_timeout=LEASE_REQUEST_TIMEOUT
            )
        )
