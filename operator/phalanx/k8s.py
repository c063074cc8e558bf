"""The operator's Kubernetes calls: JSON dicts in and out (camelCase, as the API speaks)."""

from __future__ import annotations

import json
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client import ApiException

from phalanx import constants as c


def load_api_client() -> client.ApiClient:
    """In-cluster service account first, else the current kubeconfig (KUBECONFIG)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = 32
    return client.ApiClient(configuration)


class KubeApi:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)

    @staticmethod
    def _json(response: Any) -> Any:
        return json.loads(response.data)

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

    def list_jobs(self, namespaces: list[str]) -> list[dict[str, Any]]:
        if not namespaces:
            out = self.custom.list_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL, _preload_content=False)
            items: list[dict[str, Any]] = self._json(out)["items"]
            return items
        items = []
        for ns in namespaces:
            out = self.custom.list_namespaced_custom_object(
                c.GROUP, c.VERSION, ns, c.PLURAL, _preload_content=False
            )
            items.extend(self._json(out)["items"])
        return items

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object_status(
                c.GROUP,
                c.VERSION,
                namespace,
                c.PLURAL,
                name,
                {"status": status},
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                c.GROUP, c.VERSION, namespace, c.PLURAL, name, propagation_policy="Background"
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    # -- pods, services, nodes --------------------------------------------------------------------
    def list_job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        out = self.core.list_namespaced_pod(
            namespace, label_selector=f"{c.LABEL_JOB_NAME}={job_name}", _preload_content=False
        )
        items: list[dict[str, Any]] = self._json(out)["items"]
        return items

    def list_all_pods(self) -> list[dict[str, Any]]:
        out = self.core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False
        )
        items: list[dict[str, Any]] = self._json(out)["items"]
        return items

    def list_nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._json(self.core.list_node(_preload_content=False))["items"]
        return items

    def priority_values(self) -> dict[str, int]:
        out = self._json(self.scheduling.list_priority_class(_preload_content=False))
        return {pc["metadata"]["name"]: int(pc.get("value", 0)) for pc in out["items"]}

    def create_if_absent(self, manifest: dict[str, Any]) -> bool:
        """Creates a namespaced core object; False when it already exists (idempotent retries)."""
        namespace = manifest["metadata"]["namespace"]
        try:
            if manifest["kind"] == "Pod":
                self.core.create_namespaced_pod(namespace, cast(Any, manifest))
            elif manifest["kind"] == "Service":
                self.core.create_namespaced_service(namespace, cast(Any, manifest))
            else:
                group, version = manifest["apiVersion"].split("/")
                plural = manifest["kind"].lower() + "s"
                self.custom.create_namespaced_custom_object(group, version, namespace, plural, manifest)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def pod_controller_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the pod's controlling owner; "" when it has none, None when the pod is absent."""
        try:
            pod = self._json(self.core.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        owners = pod.get("metadata", {}).get("ownerReferences") or []
        return next((str(o.get("uid")) for o in owners if o.get("controller")), "")

    def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None) -> None:
        body = client.V1DeleteOptions(
            grace_period_seconds=grace_seconds,
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
        )
        try:
            self.core.delete_namespaced_pod(name, namespace, body=body)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def admit_pod(self, namespace: str, name: str, node: str, remaining_gates: list[dict[str, Any]],
                  node_selector: dict[str, str]) -> None:  # fmt: skip
        """Pins a gated pod to its planned node and lifts the gang gate (JSON patch, one request)."""
        patch: list[dict[str, Any]] = [
            {
                "op": "add",
                "path": "/spec/nodeSelector",
                "value": {**node_selector, "kubernetes.io/hostname": node},
            },
            {"op": "replace", "path": "/spec/schedulingGates", "value": remaining_gates},
        ]
        try:
            self.core.patch_namespaced_pod(
                name, namespace, patch, _content_type="application/json-patch+json"
            )
        except ApiException as exc:
            if exc.status != 404:
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
            self.core.create_namespaced_event(meta["namespace"], cast(Any, body))
        except ApiException as exc:
            if exc.status not in (404, 409, 403):
                raise
