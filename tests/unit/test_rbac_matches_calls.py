"""The chart's RBAC grants exactly what the operator calls: no verb more, no verb less.

The grants the operator needs are derived from its own API calls: every method of k8s.KubeApi and
k8s.LeaseApi runs against a recording client, and each request (HTTP method, path, watch flag)
becomes the (API group, resource, verb) the API server's authorizer checks. What kopf does on its
own and what the API server demands besides are listed below, each with its reason. The chart is
rendered for a cluster-wide and a namespaced install and compared role by role.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from phalanx import constants as c
from phalanx import k8s
from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.podgroups import build_podgroup
from phalanx.builders.pods import JobRef, admitted_pod, build_headless_service, build_worker_pod
from phalanx.kube_client import query_string
from phalanx.kueue.workload import build_workload
from tests.unit.test_chart import NAMESPACED_WATCH, of_kind, rendered

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
RELEASE_NAMESPACE = "phalanx-system"  # what test_chart.rendered installs into
JOB_NAMESPACE = NAMESPACED_WATCH[0]
JOB = JobRef("gpt", JOB_NAMESPACE, "uid-1")

Grant = tuple[str, str, str]  # (API group, resource[/subresource], verb)
CLUSTER, WATCHED, RELEASE = "cluster-wide", "watched namespace", "release namespace"

# What kopf itself calls, beyond the handlers' KubeApi calls (kopf 1.45; handlers.py, runner.py).
KOPF_NEEDS: dict[str, set[Grant]] = {
    # @kopf.on.event(trainingjobs): kopf lists and watches them, cluster-wide or per namespace.
    "jobs": {("phalanx.dev", "trainingjobs", "list"), ("phalanx.dev", "trainingjobs", "watch")},
    # kopf posts handler warnings and errors as core v1 Events (settings.posting.level).
    WATCHED: {("", "events", "create")},
    # kopf's resource observer lists and watches CRDs, so a TrainingJob CRD installed after the
    # operator is still picked up.
    CLUSTER: {
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    },
}
# Not needed from kopf, on purpose:
# - patch/update on trainingjobs: kopf patches an object only for finalizers, progress and diff-base
#   annotations of changing handlers (on.create/update/delete/resume), daemons and timers; Phalanx
#   registers none (test_kopf_handlers_need_no_patch), and never did, so no object carries kopf's
#   finalizer that it would have to remove.
# - namespaces: with --namespace, kopf tries to list them (for globs) and falls back to the exact
#   names it was given when that is forbidden.
# - kopfpeerings: the operator runs standalone (runner.py); the Lease is its own.


def api_server_needs() -> set[Grant]:
    """Creating an object whose ownerReference sets blockOwnerDeletion needs update on the owner's
    finalizers under the OwnerReferencesPermissionEnforcement admission plugin."""
    if JOB.owner_reference().get("blockOwnerDeletion"):
        return {("phalanx.dev", "trainingjobs/finalizers", "update")}
    return set()


class Answer:
    """The raw answer the recording transport gives every request: 200 and an empty list/object."""

    status = 200
    data = json.dumps({"metadata": {"name": "x", "resourceVersion": "1"}, "items": []}).encode()

    @property
    def response(self) -> Answer:
        return self

    def drain_conn(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def grant_of(method: str, url: str) -> tuple[str, Grant]:
    """(scope, grant) of one request, as the API server's RBAC authorizer sees it."""
    parts = [p for p in urlsplit(url).path.split("/") if p]
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        assert parts[0] == "apis", url
        group, rest = parts[1], parts[3:]
    scope = CLUSTER
    if len(rest) >= 3 and rest[0] == "namespaces":
        scope, rest = rest[1], rest[2:]
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"
    named = len(rest) >= 2
    watch = parse_qs(urlsplit(url).query).get("watch") == ["true"]
    verb = {
        "GET": "get" if named else ("watch" if watch else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[method.upper()]
    return scope, (group, resource, verb)


def spec_for(provider: str) -> TrainingJobSpec:
    return parse(
        TrainingJobSpec,
        {
            "replicas": 2,
            "resources": {"gpus": 1},
            "scheduling": {"provider": provider},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "t"}]}},
        },
    )


def providers() -> list[str]:
    crd = yaml.safe_load((REPO_ROOT / "crds" / "phalanx.dev_trainingjobs.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return list(schema["properties"]["spec"]["properties"]["scheduling"]["properties"]["provider"]["enum"])


def created_manifests() -> list[dict[str, Any]]:
    """Every kind of object the operator creates for a job: pods, the Service, each PodGroup kind."""
    manifests: list[dict[str, Any]] = []
    for provider in providers():
        spec = spec_for(provider)
        manifests.append(build_worker_pod(JOB, spec, 0, 0, {"spec": {"containers": [{"name": "trainer"}]}}))
        manifests.append(build_headless_service(JOB, spec))
        podgroup = build_podgroup(JOB, spec)
        if podgroup is not None:
            manifests.append(podgroup)
    # A job in a Kueue queue: its Workload (controller/kueue_workloads.py).
    manifests.append(build_workload(JOB_BODY, "lq", 2, manifests[0], None))
    return manifests


JOB_BODY = {"metadata": {"name": JOB.name, "namespace": JOB.namespace, "uid": JOB.uid}}

# How the operator calls each KubeApi method; `jobs_namespace` is None in a cluster-wide install.
# The reflectors (reflector.py) list, then watch, with the same request.
KUBE_API_CALLS: dict[str, Callable[[k8s.KubeApi, str | None], Iterable[Any]]] = {
    "pods_request": lambda api, _: [api.pods_request(watch=w) for w in (False, True)],
    "nodes_request": lambda api, _: [api.nodes_request(watch=w) for w in (False, True)],
    "priority_classes_request": lambda api, _: [api.priority_classes_request(watch=w) for w in (False, True)],
    "jobs_request": lambda api, ns: [api.jobs_request(ns, watch=w) for w in (False, True)],
    "get_job": lambda api, _: [api.get_job(JOB.namespace, JOB.name)],
    "patch_job_status": lambda api, _: [
        api.patch_job_status(JOB.namespace, JOB.name, {"phase": "Pending"}, "7")
    ],
    # With a version: the patch; without: the read of the current version first.
    "patch_job_facts": lambda api, _: [
        api.patch_job_facts(JOB.namespace, JOB.name, {"progress": {}}, JOB.uid, rv) for rv in ("7", None)
    ],
    "delete_job": lambda api, _: [api.delete_job(JOB.namespace, JOB.name, JOB.uid)],
    "list_job_pods": lambda api, _: [api.list_job_pods(JOB.namespace, JOB.name)],
    "priority_values": lambda api, _: [api.priority_values()],
    "trainingjob_crd": lambda api, _: [api.trainingjob_crd()],
    "create_if_absent": lambda api, _: [api.create_if_absent(m) for m in created_manifests()],
    "read_like": lambda api, _: [api.read_like(m) for m in created_manifests()],
    "delete_pod": lambda api, _: [api.delete_pod(JOB.namespace, "gpt-worker-0", "u", 0)],
    "evict_pod": lambda api, _: [api.evict_pod(JOB.namespace, "gpt-worker-0", "u", 30)],
    "admit_pod": lambda api, _: [
        api.admit_pod(JOB.namespace, "gpt-worker-0", admitted_pod(created_manifests()[0], "node-1")["spec"])
    ],
    "relabel_pod": lambda api, _: [
        api.relabel_pod(JOB.namespace, "gpt-spare-0", "u", {c.LABEL_REPLICA_INDEX: "1"}, (c.LABEL_SPARE,))
    ],
    "get_workload": lambda api, _: [api.get_workload(JOB.namespace, "trainingjob-gpt-abcde")],
    "patch_workload_status": lambda api, _: [
        api.patch_workload_status(JOB.namespace, "trainingjob-gpt-abcde", {"conditions": []}, "7")
    ],
    "patch_workload": lambda api, _: [
        api.patch_workload(JOB.namespace, "trainingjob-gpt-abcde", {"spec": {"active": False}})
    ],
    # By one job's name (a deleted job's Workloads), and in the watched scope (the orphan sweep).
    "list_workloads": lambda api, ns: [
        api.list_workloads(JOB.namespace, "phalanx.dev/job-name=gpt"),
        api.list_workloads(ns, "app.kubernetes.io/managed-by=phalanx"),
    ],
    "workloads_request": lambda api, ns: [api.workloads_request(ns, watch=w) for w in (False, True)],
    "delete_workload": lambda api, _: [api.delete_workload(JOB.namespace, "trainingjob-gpt-abcde", "u")],
    "get_resource_flavor": lambda api, _: [api.get_resource_flavor("h100")],
    "create_event": lambda api, _: [
        api.create_event(JOB_BODY, "Normal", "Created", "m", "2026-01-01T00:00:00Z")
    ],
}
LEASE_API_CALLS: dict[str, Callable[[k8s.LeaseApi], Any]] = {
    "read": lambda leases: leases.read(RELEASE_NAMESPACE, "phalanx-operator"),
    "create": lambda leases: leases.create(RELEASE_NAMESPACE, {"metadata": {"name": "phalanx-operator"}}),
    "replace": lambda leases: leases.replace(RELEASE_NAMESPACE, "phalanx-operator", {"metadata": {}}),
}


class RecordingClient:
    """Stands in for kube_client.KubeClient: records each request as (method, path?query)."""

    def __init__(self, requests: list[tuple[str, str]]) -> None:
        self.requests = requests

    def request(
        self, method: str, path: str, params: Mapping[str, Any] | None = None, *_: Any, **__: Any
    ) -> Answer:
        self.requests.append((method, path + query_string(params or {})))
        return Answer()


def public_methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


K8S_PY = inspect.getfile(k8s)
SENDERS = frozenset(
    ("request", "_send", "_read", "_discard", "_lease", "list_or_watch", "core_path", "group_path")
)
COMPOUND = (ast.FunctionDef, ast.ClassDef, ast.If, ast.Try, ast.For, ast.While, ast.With)


def request_statements_in_k8s_py() -> set[int]:
    """The line of every simple statement of a function in k8s.py that sends a request or builds its
    path (each branch of a kind's path counts)."""
    lines: set[int] = set()
    functions = [f for f in ast.walk(ast.parse(Path(K8S_PY).read_text())) if isinstance(f, ast.FunctionDef)]
    for statement in (s for f in functions for s in ast.walk(f)):
        if not isinstance(statement, ast.stmt) or isinstance(statement, COMPOUND):
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                name = (
                    node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                )
                if name in SENDERS:
                    lines.add(statement.lineno)
    return lines


def exercise(jobs_namespace: str | None) -> tuple[list[tuple[str, str]], set[int]]:
    """Runs every KubeApi and LeaseApi call; the requests sent and the lines of k8s.py run."""
    assert set(KUBE_API_CALLS) == public_methods(k8s.KubeApi), "every KubeApi method needs a call here"
    assert set(LEASE_API_CALLS) == public_methods(k8s.LeaseApi), "every LeaseApi method needs a call here"
    requests: list[tuple[str, str]] = []
    ran: set[int] = set()

    def trace(frame: FrameType, event: str, _: Any) -> Any:
        if frame.f_code.co_filename != K8S_PY:
            return None
        if event == "line":
            ran.add(frame.f_lineno)
        return trace

    api = k8s.KubeApi(RecordingClient(requests))  # type: ignore[arg-type]
    leases = k8s.LeaseApi(RecordingClient(requests))  # type: ignore[arg-type]
    previous = sys.gettrace()  # a coverage tool's or debugger's, put back after
    sys.settrace(trace)
    try:
        for call in KUBE_API_CALLS.values():
            list(call(api, jobs_namespace))
        for lease_call in LEASE_API_CALLS.values():
            lease_call(leases)
    finally:
        sys.settrace(previous)
    return requests, ran


def operator_needs(jobs_namespace: str | None) -> dict[str, set[Grant]]:
    """scope (CLUSTER, WATCHED, RELEASE) -> grants, from the operator's calls and the lists above."""
    needs: dict[str, set[Grant]] = {CLUSTER: set(), WATCHED: set(), RELEASE: set()}
    for method, url in exercise(jobs_namespace)[0]:
        scope, grant = grant_of(method, url)
        needs[{JOB_NAMESPACE: WATCHED, RELEASE_NAMESPACE: RELEASE}.get(scope, scope)].add(grant)
    needs[CLUSTER if jobs_namespace is None else WATCHED] |= KOPF_NEEDS["jobs"]
    needs[WATCHED] |= KOPF_NEEDS[WATCHED] | api_server_needs()
    needs[CLUSTER] |= KOPF_NEEDS[CLUSTER]
    return needs


def test_every_request_in_k8s_py_is_exercised() -> None:
    """So a new request (or a new branch, such as another kind in create_if_absent) cannot slip past."""
    ran = exercise(None)[1] | exercise(JOB_NAMESPACE)[1]
    unexercised = request_statements_in_k8s_py() - ran
    assert not unexercised, (
        f"k8s.py lines {sorted(unexercised)} send requests no call in KUBE_API_CALLS reaches"
    )


def granted(role: dict[str, Any]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in role.get("rules", [])
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def difference(where: str, grants: set[Grant], needs: set[Grant]) -> str:
    def show(items: set[Grant]) -> str:
        return ", ".join(f"{verb} {group or 'core'}/{resource}" for group, resource, verb in sorted(items))

    return f"{where}: granted but never called: [{show(grants - needs)}]; called but not granted: [{show(needs - grants)}]"


def leader_role(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (role,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    return role


def test_cluster_wide_install_grants_exactly_what_the_operator_calls() -> None:
    docs = rendered("default")
    needs = operator_needs(jobs_namespace=None)
    (cluster_role,) = of_kind(docs, "ClusterRole")
    lease_role = leader_role(docs)
    assert lease_role["metadata"]["namespace"] == RELEASE_NAMESPACE
    comparisons = [
        ("ClusterRole", granted(cluster_role), needs[CLUSTER] | needs[WATCHED]),
        ("leader-election Role", granted(lease_role), needs[RELEASE]),
    ]
    bad = [difference(where, grants, need) for where, grants, need in comparisons if grants != need]
    assert not bad, "\n".join(bad)


def test_namespaced_install_grants_exactly_what_the_operator_calls() -> None:
    docs = rendered("namespaced")
    needs = operator_needs(jobs_namespace=JOB_NAMESPACE)
    (cluster_role,) = of_kind(docs, "ClusterRole")
    roles = {r["metadata"]["namespace"]: r for r in of_kind(docs, "Role") if r not in [leader_role(docs)]}
    assert sorted(roles) == NAMESPACED_WATCH
    comparisons = [("ClusterRole", granted(cluster_role), needs[CLUSTER])]
    comparisons += [(f"Role in {ns}", granted(role), needs[WATCHED]) for ns, role in roles.items()]
    comparisons.append(("leader-election Role", granted(leader_role(docs)), needs[RELEASE]))
    bad = [difference(where, grants, need) for where, grants, need in comparisons if grants != need]
    assert not bad, "\n".join(bad)


def test_kopf_handlers_need_no_patch() -> None:
    """KOPF_NEEDS holds no patch because Phalanx registers only on.event handlers with kopf."""
    import kopf

    import phalanx.handlers  # noqa: F401  (registers the handlers)

    registry = kopf.get_default_registry()
    assert registry._watching.get_all_handlers(), "the TrainingJob event handler is registered"
    for kind in ("_changing", "_spawning", "_webhooks", "_indexing"):
        assert not getattr(registry, kind).get_all_handlers(), f"kopf {kind} handlers need more RBAC"


def test_grant_of_maps_requests_as_the_authorizer_does() -> None:
    base = "https://h/api/v1/namespaces/ns"
    assert grant_of("GET", f"{base}/pods?watch=true") == ("ns", ("", "pods", "watch"))
    assert grant_of("GET", f"{base}/pods") == ("ns", ("", "pods", "list"))
    assert grant_of("POST", f"{base}/pods/p/eviction") == ("ns", ("", "pods/eviction", "create"))
    assert grant_of("GET", "https://h/api/v1/pods?watch=false") == (CLUSTER, ("", "pods", "list"))
    status = "https://h/apis/phalanx.dev/v1alpha1/namespaces/ns/trainingjobs/j/status"
    assert grant_of("PATCH", status) == ("ns", ("phalanx.dev", "trainingjobs/status", "patch"))
    assert grant_of("PUT", "https://h/apis/coordination.k8s.io/v1/namespaces/ns/leases/l")[1][2] == "update"
