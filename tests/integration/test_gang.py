"""Gang admission, gang timeout, priority preemption and recovery against the real control plane.

Every test runs its jobs on nodes only it uses (`private_nodes`), so counting GPUs is exact. Pods are
kwok's: Running once bound, finished after the job's `run_for`. The pure rules these tests exercise
are in docs/scheduling.md; the many-seed versions of the randomized checks run in the simulation
(tests/unit/test_gang_simulation.py), here a few seeds go through the real API server and scheduler.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from phalanx.devcluster.nodes import NodePool, node_manifest
from tests.conftest import Cluster, OperatorProcess, node_ready_status, silence_node, wait_for
from tests.jobs import job_status, training_job, wait_phase

pytestmark = pytest.mark.integration

GATE = "phalanx.dev/gang"


# -- helpers --------------------------------------------------------------------------------------
def all_statuses(cluster: Cluster, ns: str) -> dict[str, dict[str, Any]]:
    items = cluster.get_json("tj", "-n", ns)["items"]
    return {j["metadata"]["name"]: j.get("status") or {} for j in items}


def pods_in(cluster: Cluster, ns: str, job: str | None = None) -> list[dict[str, Any]]:
    selector = f"phalanx.dev/job-name={job}" if job else "phalanx.dev/job-name"
    items: list[dict[str, Any]] = cluster.get_json("pods", "-n", ns, "-l", selector)["items"]
    return items


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def is_gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in pod["spec"].get("schedulingGates") or [])


def gpus_of(pod: dict[str, Any]) -> int:
    limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
    return int(limits.get("nvidia.com/gpu", 0))


def holds_node(pod: dict[str, Any]) -> bool:
    """Bound and not finished: the pod holds its node's resources."""
    return bool(pod["spec"].get("nodeName")) and pod["status"].get("phase") not in ("Succeeded", "Failed")


@pytest.fixture
def priority_classes(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """A (low, high) pair of PriorityClasses only this test uses."""
    tag = uuid.uuid4().hex[:6]
    low, high = f"gang-low-{tag}", f"gang-high-{tag}"
    cluster.apply([
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": low}, "value": 100},
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": high}, "value": 1000},
    ])  # fmt: skip
    yield low, high
    cluster.kubectl("delete", "priorityclass", low, high, "--ignore-not-found", check=False)


# -- admission ------------------------------------------------------------------------------------
def test_a_gang_that_fits_while_nothing_waits_is_created_admitted(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    private_nodes.add(2, gpus=8)
    cluster.apply(training_job("direct", replicas=2, gpus=8, placement=private_nodes.placement()), namespace)
    status = wait_phase(cluster, namespace, "direct", "Running", timeout=40)
    assert condition(status, "Admitted")["status"] == "True"
    pods = pods_in(cluster, namespace, "direct")
    assert len(pods) == 2
    for pod in pods:
        assert not is_gated(pod)
        assert pinned_node(pod) == pod["spec"]["nodeName"]
        # Created this way, not gated and patched later: the API server counts spec changes.
        assert pod["metadata"]["generation"] == 1, pod["metadata"]


def pinned_node(pod: dict[str, Any]) -> str | None:
    """The node admission pinned the pod to: a required matchFields term on metadata.name."""
    required = (pod["spec"].get("affinity") or {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    names = {
        tuple(f["values"])
        for term in required.get("nodeSelectorTerms") or []
        for f in term.get("matchFields") or []
        if f["key"] == "metadata.name" and f["operator"] == "In"
    }
    return names.pop()[0] if len(names) == 1 else None


@pytest.mark.parametrize("gated", [False, True], ids=["admitted-at-creation", "admitted-by-the-pass"])
def test_gangs_run_on_nodes_whose_hostname_label_differs_from_their_name(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any, gated: bool
) -> None:
    """Pinning must name the node itself, not assume kubernetes.io/hostname equals the node's name."""
    nodes = private_nodes.add(2, gpus=8, renamed_hostnames=2)
    labels = {n: cluster.get_json("node", n)["metadata"]["labels"]["kubernetes.io/hostname"] for n in nodes}
    assert all(labels[n] != n for n in nodes), labels
    if gated:
        # A gated gang ahead of it: the job below is created gated and admitted by the pass.
        cluster.apply(training_job("first", replicas=2, gpus=8, run_for="3s", placement=private_nodes.placement(),
                                   runPolicy={"terminationGracePeriodSeconds": 1}), namespace)  # fmt: skip
        wait_phase(cluster, namespace, "first", "Running", timeout=60)
    cluster.apply(training_job("renamed", replicas=2, gpus=8, run_for="3s", placement=private_nodes.placement(),
                               runPolicy={"terminationGracePeriodSeconds": 1}), namespace)  # fmt: skip
    status = wait_phase(cluster, namespace, "renamed", "Running", timeout=60)
    assert status["attempt"] == 0 and status.get("gangTimeouts", 0) == 0
    pods = pods_in(cluster, namespace, "renamed")
    assert {p["spec"]["nodeName"] for p in pods} == set(nodes)
    for pod in pods:
        assert pinned_node(pod) == pod["spec"]["nodeName"], pod["spec"].get("affinity")
    wait_phase(cluster, namespace, "renamed", "Succeeded", timeout=30)


def test_two_gangs_of_sixteen_gpus_on_sixteen_gpus_run_one_after_the_other(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    private_nodes.add(2, gpus=8)
    placement = private_nodes.placement()
    cluster.apply([training_job(n, replicas=2, gpus=8, run_for="4s", placement=placement) for n in ("a", "b")],
                  namespace)  # fmt: skip

    def one_running_one_waiting() -> tuple[str, str] | None:
        statuses = all_statuses(cluster, namespace)
        running = [n for n, s in statuses.items() if s.get("phase") == "Running"]
        waiting = [n for n, s in statuses.items() if condition(s, "Admitted").get("status") == "False"]
        return (running[0], waiting[0]) if len(running) == 1 and len(waiting) == 1 else None

    first, second = wait_for(one_running_one_waiting, timeout=30, what="one gang running, one waiting")

    def explained() -> dict[str, Any] | None:
        # The first reconcile says "waiting"; the next admission pass writes why.
        status = job_status(cluster, namespace, second)
        return status if "needs" in condition(status, "Admitted").get("message", "") else None

    waiting = wait_for(explained, timeout=15, what="the waiting gang's condition explains why")
    admitted = condition(waiting, "Admitted")
    assert admitted["reason"] == "WaitingForCapacity"
    assert "needs 2 pods x 8 nvidia.com/gpu" in admitted["message"], admitted
    assert waiting["phase"] == "Pending"
    second_pods = pods_in(cluster, namespace, second)
    assert len(second_pods) == 2 and all(is_gated(p) and not p["spec"].get("nodeName") for p in second_pods)

    # While the first's pods hold the GPUs, the second's never do; it runs once the first is done.
    # (The pods are read in one list, so both sides are seen at the same moment; the first job's
    # phase trails its pods by a reconcile.)
    while (s := job_status(cluster, namespace, first)).get("phase") == "Running":
        pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        holders = {p["metadata"]["labels"]["phalanx.dev/job-name"] for p in pods if holds_node(p)}
        assert holders != {first, second}, f"both gangs hold GPUs at once: {holders}"
        time.sleep(0.5)
    assert s["phase"] == "Succeeded"
    wait_phase(cluster, namespace, second, "Succeeded", timeout=40)
    assert job_status(cluster, namespace, second)["attempt"] == 0


@pytest.mark.parametrize(
    ("runs", "states"),
    [(8, 8), (12, 4)],  # as stated; and running 8 s past its estimate
    ids=["as-stated", "overruns"],
)
def test_a_gang_waiting_for_a_job_that_states_its_run_time_is_admitted_early_and_binds_as_it_ends(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any, runs: int, states: int
) -> None:
    # Both jobs say how long they run (spec.scheduling.expectedRunSeconds): within the lead
    # (gang/early_start.py) of the first one's stated end, the second's gates are lifted onto its
    # nodes, and the real scheduler binds each pod only once the first job's pod there has finished,
    # however late that is; its retries back off, but not past the gang timeout.
    private_nodes.add(2, gpus=8)
    placement = private_nodes.placement()
    first = training_job("first", replicas=2, gpus=8, run_for=f"{runs}s", placement=placement,
                         scheduling={"expectedRunSeconds": states})  # fmt: skip
    cluster.apply([first], namespace)
    wait_phase(cluster, namespace, "first", "Running", timeout=30)
    cluster.apply([training_job("second", replicas=2, gpus=8, run_for="2s", placement=placement,
                                scheduling={"expectedRunSeconds": 2})], namespace)  # fmt: skip

    admitted_early = False
    first_done = second_bound = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        by_job: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            by_job.setdefault(pod["metadata"]["labels"]["phalanx.dev/job-name"], []).append(pod)
        holders = {job for job, members in by_job.items() for p in members if holds_node(p)}
        assert holders != {"first", "second"}, f"both gangs hold GPUs at once: {holders}"
        second = by_job.get("second", [])
        if "first" in holders and len(second) == 2 and not any(is_gated(p) for p in second):
            admitted_early = True  # gates lifted while the first job's pods still run
            assert all(not p["spec"].get("nodeName") for p in second), "bound over a running pod"
        if first_done is None and admitted_early and "first" not in holders:
            first_done = time.monotonic()
        if second_bound is None and len(second) == 2 and all(p["spec"].get("nodeName") for p in second):
            second_bound = time.monotonic()
        if job_status(cluster, namespace, "second").get("phase") == "Succeeded":
            break
        time.sleep(0.3)
    assert admitted_early, "the second gang was admitted only once the first had finished"
    assert job_status(cluster, namespace, "second").get("phase") == "Succeeded"
    assert job_status(cluster, namespace, "first").get("phase") == "Succeeded"
    assert first_done is not None and second_bound is not None
    # The scheduler's backoff for a pod that failed its tries (at most 10 s), with the poll's slack.
    assert second_bound - first_done < 15, f"bound {second_bound - first_done:.1f}s after the room freed"


def node_agents(placement: dict[str, Any]) -> dict[str, Any]:
    """A DaemonSet on the test's nodes, as every real cluster runs (device plugin, exporters, CNI)."""
    labels = {"app": "node-agent"}
    restricted = {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                  "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    container = {"name": "agent", "image": "registry.k8s.io/pause:3.10", "securityContext": restricted,
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "node-agent"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {**placement, "containers": [container]}},
        },
    }


def test_a_blocked_head_holds_nodes_that_free_in_time_and_the_idle_one_trains_meanwhile(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    # 3 nodes, each with a DaemonSet's agent: "first" runs on two and states when it ends. The head
    # needs two whole nodes: it holds first's two (they free by the time it could start anyway)
    # rather than the idle third, so "small" (stating nothing) trains there meanwhile; the head
    # starts once first has ended, never beside it. Before, the head held the idle node, and the
    # agents made every node's end unknown.
    private_nodes.add(3, gpus=8)
    placement = private_nodes.placement()
    cluster.apply([node_agents(placement)], namespace)
    wait_for(
        lambda: sum(p["status"].get("phase") == "Running" for p in cluster.get_json("pods", "-n", namespace, "-l", "app=node-agent")["items"]) == 3,
        timeout=60, what="an agent Running on each node",
    )  # fmt: skip
    first = training_job("first", replicas=2, gpus=8, run_for="30s", placement=placement,
                         scheduling={"expectedRunSeconds": 30})  # fmt: skip
    cluster.apply([first], namespace)
    wait_phase(cluster, namespace, "first", "Running", timeout=30)
    cluster.apply([training_job("head", replicas=2, gpus=8, run_for="2s", placement=placement)], namespace)
    wait_for(lambda: bool(job_status(cluster, namespace, "head").get("admissionMessage")), timeout=30,
             what="the head waiting")  # fmt: skip
    cluster.apply([training_job("small", replicas=1, gpus=8, run_for="5s", placement=placement)], namespace)
    wait_phase(cluster, namespace, "small", "Running", timeout=30)
    assert job_status(cluster, namespace, "first").get("phase") == "Running", (
        "small ran only once first ended"
    )
    deadline = time.monotonic() + 90
    while job_status(cluster, namespace, "head").get("phase") != "Succeeded":
        assert time.monotonic() < deadline, f"head: {job_status(cluster, namespace, 'head')}"
        pods = pods_in(cluster, namespace)
        holders = {p["metadata"]["labels"]["phalanx.dev/job-name"] for p in pods if holds_node(p)}
        assert not {"first", "head"} <= holders, "the head bound beside first"
        time.sleep(0.5)


@pytest.mark.parametrize("seed", [11, 29])
def test_random_arrivals_of_mixed_gangs_all_finish_without_overcommit_or_partial_gangs(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any, seed: int
) -> None:
    """Mixed gang sizes arriving in a random order on 16 GPUs: everything finishes (no deadlock), admitted
    GPUs never exceed 16, and no gang is partly admitted or bound for longer than a scheduling round trip."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    private_nodes.add(2, gpus=8)
    placement = private_nodes.placement()
    shapes = [(1, 8), (2, 8), (2, 4), (4, 2), (3, 4), (2, 2), (1, 4), (4, 4), (2, 6), (1, 2)]
    rng.shuffle(shapes)
    jobs = [training_job(f"j{i}", replicas=r, gpus=g, run_for=f"{rng.choice((1, 2, 3))}s", placement=placement)
            for i, (r, g) in enumerate(shapes)]  # fmt: skip
    replicas = {j["metadata"]["name"]: j["spec"]["replicas"] for j in jobs}
    for job in jobs:
        cluster.apply(job, namespace)
        time.sleep(rng.uniform(0.0, 0.6))

    partial_since: dict[str, float] = {}
    peak = 0
    deadline = time.monotonic() + 75
    while time.monotonic() < deadline:
        pods = pods_in(cluster, namespace)
        # Admitted (gate lifted) and not finished, bound or not: what the operator has promised away.
        admitted = [
            p for p in pods if not is_gated(p) and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]
        peak = max(peak, sum(gpus_of(p) for p in admitted))
        assert peak <= 16, f"seed {seed}: {peak} GPUs admitted on 16"
        statuses = all_statuses(cluster, namespace)
        for name in replicas:
            attempt = statuses.get(name, {}).get("attempt", 0)
            mine = [p for p in pods if p["metadata"]["labels"]["phalanx.dev/job-name"] == name
                    and p["metadata"]["labels"]["phalanx.dev/attempt"] == str(attempt)]  # fmt: skip
            ungated = [p for p in mine if not is_gated(p) and p["status"].get("phase") != "Succeeded"]
            bound = [p for p in ungated if p["spec"].get("nodeName")]
            # Lifting the gates takes one request per pod, and binding follows: a snapshot may catch a
            # gang in between, but never for long.
            partly_admitted = bool(ungated) and any(is_gated(p) for p in mine)
            if partly_admitted or (bound and len(bound) < len(ungated)):
                partial_since.setdefault(name, time.monotonic())
                assert time.monotonic() - partial_since[name] < 8, f"seed {seed}: {name} partial gang"
            else:
                partial_since.pop(name, None)
        if len(statuses) == len(jobs) and all(s.get("phase") == "Succeeded" for s in statuses.values()):
            break
        time.sleep(0.5)
    statuses = all_statuses(cluster, namespace)
    assert {n: s.get("phase") for n, s in statuses.items()} == dict.fromkeys(replicas, "Succeeded"), seed
    assert all(s["attempt"] == 0 for s in statuses.values()), seed
    assert peak > 8, f"seed {seed}: gangs never ran side by side (peak {peak} GPUs)"


# -- gang timeout -----------------------------------------------------------------------------
def add_node_without_kubelet(cluster: Cluster, private_nodes: Any, name: str) -> str:
    """A node that reports Ready (for now: no heartbeat follows) but that nothing runs pods on: kwok
    does not manage it. The scheduler binds pods there and they stay Pending, like a node whose
    kubelet died a moment ago."""
    manifest = node_manifest(NodePool(name_prefix=name, count=1, gpus=8, labels=private_nodes.label,
                                      taints=(("phalanx.dev/test-pool", private_nodes.label["phalanx.dev/test-pool"],
                                               "NoSchedule"),)), 0)  # fmt: skip
    del manifest["metadata"]["annotations"]["kwok.x-k8s.io/node"]
    status = manifest.pop("status")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test",
                             "lastHeartbeatTime": now, "lastTransitionTime": now}]  # fmt: skip
    cluster.apply(manifest)
    node = manifest["metadata"]["name"]
    cluster.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": status}))  # fmt: skip
    return str(node)


def test_gang_that_cannot_fully_start_is_torn_down_requeued_and_succeeds_once_capacity_returns(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    """Admitted onto two nodes, one of which never starts its pod: after gang.timeoutSeconds the
    running half is stopped too and the gang waits out its backoff; a replacement node brings the
    capacity back and the next attempt succeeds. Neither counts as a failure or a preemption."""
    (good,) = private_nodes.add(1, gpus=8)
    dead = add_node_without_kubelet(cluster, private_nodes, f"dead-{uuid.uuid4().hex[:6]}")
    try:
        job = training_job("stuck", replicas=2, gpus=8, run_for="3s", placement=private_nodes.placement(),
                           scheduling={"gang": {"timeoutSeconds": 10}},
                           runPolicy={"terminationGracePeriodSeconds": 1})  # fmt: skip
        cluster.apply(job, namespace)
        half = wait_for(
            lambda: (p := pods_in(cluster, namespace, "stuck"))
            and sorted(x["status"].get("phase") for x in p) == ["Pending", "Running"]
            and all(x["spec"].get("nodeName") for x in p) and p,
            timeout=30, what="one pod running, its peer bound but not starting",
        )  # fmt: skip
        assert {p["spec"]["nodeName"] for p in half} == {good, dead}
        assert job_status(cluster, namespace, "stuck")["phase"] == "Admitted"

        status = wait_for(
            lambda: (s := job_status(cluster, namespace, "stuck")).get("gangTimeouts") == 1 and s,
            timeout=30, what="gang timeout",
        )  # fmt: skip
        assert status["attempt"] == 1 and status["requeueAfter"] in status["message"]
        assert status["phase"] == "Pending"
        assert status["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}
        # No partial gang keeps GPUs: the half that ran is stopped (the other waits for a kubelet).
        wait_for(lambda: [p["spec"]["nodeName"] for p in pods_in(cluster, namespace, "stuck")] == [dead],
                 timeout=15, what="only the never-started pod left")  # fmt: skip
        events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=stuck")
        timeout_events = [e for e in events["items"] if e["reason"] == "GangTimeout"]
        assert (
            timeout_events and "only 1/2 pod(s) running 10s after admission" in timeout_events[0]["message"]
        )

        # Capacity returns: a replacement node, and the dead one removed with its pod (what pod GC does).
        private_nodes.add(1, gpus=8, prefix="spare")
        cluster.delete_nodes([dead])
        cluster.kubectl("delete", "pod", "-n", namespace, "-l", "phalanx.dev/job-name=stuck", "--force",
                        "--grace-period=0")  # fmt: skip
        done = wait_phase(cluster, namespace, "stuck", "Succeeded", timeout=45)
        assert done["attempt"] == 1 and done["gangTimeouts"] == 1
        assert done["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}
    finally:
        cluster.delete_nodes([dead])


# -- priority preemption ----------------------------------------------------------------------
def test_higher_priority_gang_preempts_a_lower_one_which_resumes_as_the_next_attempt(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any,
    priority_classes: tuple[str, str],
) -> None:  # fmt: skip
    low_class, high_class = priority_classes
    private_nodes.add(2, gpus=8)
    placement = private_nodes.placement()
    low = training_job("low", replicas=2, gpus=8, run_for="20s", placement=placement,
                       scheduling={"priorityClassName": low_class},
                       runPolicy={"terminationGracePeriodSeconds": 5})  # fmt: skip
    cluster.apply(low, namespace)
    wait_phase(cluster, namespace, "low", "Running", timeout=30)

    high = training_job("high", replicas=2, gpus=8, run_for="4s", placement=placement,
                        scheduling={"priorityClassName": high_class})  # fmt: skip
    cluster.apply(high, namespace)
    victim = wait_for(
        lambda: (s := job_status(cluster, namespace, "low")).get("restarts", {}).get("preemptions") == 1 and s,
        timeout=30, what="low preempted",
    )  # fmt: skip
    assert victim["attempt"] == 1 and victim["restarts"]["failures"] == 0
    assert victim["phase"] in ("Restarting", "Pending"), victim["phase"]
    wait_phase(cluster, namespace, "high", "Running", timeout=30)
    low_pods = pods_in(cluster, namespace, "low")
    assert all(p["metadata"]["labels"]["phalanx.dev/attempt"] == "1" and not holds_node(p) for p in low_pods)
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=low")[
        "items"
    ]
    assert "PreemptedByPriority" in {e["reason"] for e in events}

    wait_phase(cluster, namespace, "high", "Succeeded", timeout=30)
    resumed = wait_phase(cluster, namespace, "low", "Running", timeout=30)
    assert resumed["attempt"] == 1
    assert resumed["restarts"] == {"failures": 0, "preemptions": 1, "hangs": 0}
    assert job_status(cluster, namespace, "high")["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}


def test_one_victim_per_preemption_while_its_pods_take_their_grace_period(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any,
    priority_classes: tuple[str, str],
) -> None:  # fmt: skip
    """A high-priority gang that needs the room of exactly one of three running jobs. The victim's pod
    takes its whole 60 s grace period to stop and holds its GPUs all that time; no second or third job
    may be stopped for the same head meanwhile, and the head runs once the victim's pod is gone."""
    low_class, high_class = priority_classes
    private_nodes.add(3, gpus=8)
    placement = private_nodes.placement()
    names = ("low-a", "low-b", "low-c")
    for name in names:
        cluster.apply(training_job(name, replicas=1, gpus=8, placement=placement,
                                   scheduling={"priorityClassName": low_class},
                                   runPolicy={"terminationGracePeriodSeconds": 60}), namespace)  # fmt: skip
    for name in names:
        wait_phase(cluster, namespace, name, "Running", timeout=90)  # three gangs at once on a loaded machine
    cluster.apply(training_job("high", replicas=1, gpus=8, run_for="5s", placement=placement,
                               scheduling={"priorityClassName": high_class}), namespace)  # fmt: skip

    def preempted() -> list[str]:
        statuses = all_statuses(cluster, namespace)
        return [n for n in names if statuses[n].get("restarts", {}).get("preemptions", 0) > 0]

    (victim,) = wait_for(preempted, timeout=30, what="a victim")
    preempted_at = time.monotonic()
    # Well past two preemption cooldowns (15 s) while the victim's pod is still Terminating.
    while time.monotonic() - preempted_at < 40:
        assert preempted() == [victim], "a second job was preempted for the same head"
        victim_pods = pods_in(cluster, namespace, victim)
        assert any(p["metadata"].get("deletionTimestamp") for p in victim_pods), "the victim's pod went early"
        time.sleep(1.0)
    status = wait_phase(cluster, namespace, "high", "Running", timeout=45)
    assert time.monotonic() - preempted_at > 50  # only after the victim's grace period
    assert status["attempt"] == 0
    assert preempted() == [victim]
    statuses = all_statuses(cluster, namespace)
    for name in names:
        if name != victim:
            assert statuses[name]["phase"] == "Running" and statuses[name]["attempt"] == 0, (
                name,
                statuses[name],
            )


class PodHistory:
    """Every version of the namespace's pods a watch delivers, kept after the pods are gone (kwok
    removes a deleted pod at once, so a condition set just before deletion is seen only this way)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        from kubernetes import client, watch

        self.versions: list[Any] = []
        self._watch = watch.Watch()
        core = client.CoreV1Api(cluster.api())

        def record() -> None:
            try:
                for event in self._watch.stream(core.list_namespaced_pod, namespace, timeout_seconds=120):
                    self.versions.append(event["object"])
            except Exception:  # noqa: BLE001 - the stream ends when stopped; what it saw is kept
                pass

        self._thread = threading.Thread(target=record, daemon=True)

    def __enter__(self) -> PodHistory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._watch.stop()

    def conditions(self, pod: str) -> set[tuple[str, str, str]]:
        return {
            (c.type, c.status, c.reason or "")
            for v in list(self.versions)
            if v.metadata.name == pod
            for c in (v.status.conditions or [])
        }


def test_preemption_evicts_the_victims_pods_and_tells_the_victim_who_preempted_it(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any,
    priority_classes: tuple[str, str],
) -> None:  # fmt: skip
    low_class, high_class = priority_classes
    private_nodes.add(1, gpus=8)
    placement = private_nodes.placement()
    low = training_job("low", replicas=1, gpus=8, placement=placement,
                       scheduling={"priorityClassName": low_class},
                       runPolicy={"terminationGracePeriodSeconds": 5})  # fmt: skip
    cluster.apply(low, namespace)
    wait_phase(cluster, namespace, "low", "Running", timeout=30)
    with PodHistory(cluster, namespace) as history:
        high = training_job("high", replicas=1, gpus=8, run_for="4s", placement=placement,
                            scheduling={"priorityClassName": high_class})  # fmt: skip
        cluster.apply(high, namespace)
        # The Eviction API marks the pod, so the trainer and anyone watching know why it stops.
        wait_for(
            lambda: (
                ("DisruptionTarget", "True", "EvictionByEvictionAPI") in history.conditions("low-worker-0")
            ),
            timeout=30,
            what="the victim's pod marked DisruptionTarget by the Eviction API",
        )
    said = f"preempted by {namespace}/high, priority 1000"
    victim = wait_for(
        lambda: (
            condition(s := job_status(cluster, namespace, "low"), "Preempted").get("status") == "True" and s
        ),
        timeout=30,
        what="a Preempted condition on the victim",
    )
    assert said in condition(victim, "Preempted")["message"], victim
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=low")
    assert any(said in e["message"] for e in events["items"] if e["reason"] == "PreemptedByPriority")
    wait_phase(cluster, namespace, "high", "Running", timeout=30)
    resumed = wait_phase(cluster, namespace, "low", "Running", timeout=60)
    assert resumed["restarts"] == {"failures": 0, "preemptions": 1, "hangs": 0}
    assert condition(resumed, "Preempted").get("status") == "False", "running again: no longer preempted"


# -- node loss --------------------------------------------------------------------------------
def test_node_deleted_under_a_running_gang_restarts_it_on_other_nodes(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    """Kubernetes' pod GC fails and deletes the pods of a vanished node after its 40 s quarantine;
    the gang then restarts as a preemption on the nodes left."""
    nodes = private_nodes.add(3, gpus=8)
    job = training_job("survivor", replicas=2, gpus=8, placement=private_nodes.placement(),
                       runPolicy={"terminationGracePeriodSeconds": 1})  # fmt: skip
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "survivor", "Running", timeout=30)
    used = {p["spec"]["nodeName"] for p in pods_in(cluster, namespace, "survivor")}
    lost = sorted(used)[0]
    cluster.kubectl("delete", "node", lost, "--wait=false")

    status = wait_for(
        lambda: (s := job_status(cluster, namespace, "survivor")).get("attempt") == 1
        and s.get("phase") == "Running" and s,
        timeout=100, what="recovery attempt running",
    )  # fmt: skip
    assert status["restarts"] == {"failures": 0, "preemptions": 1, "hangs": 0}
    pods = pods_in(cluster, namespace, "survivor")
    assert sorted(p["metadata"]["labels"]["phalanx.dev/attempt"] for p in pods) == ["1", "1"]
    placed = {p["spec"]["nodeName"] for p in pods}
    assert lost not in placed and placed <= set(nodes)


# The node lifecycle controller's --node-monitor-grace-period in the dev cluster, and the operator's
# default PHALANX_NODE_LOST_AFTER_SECONDS (docs/reliability.md).
NODE_MONITOR_GRACE_SECONDS = 40
NODE_LOST_AFTER_SECONDS = 20


def test_a_gang_with_a_pod_on_a_node_that_stops_heartbeating_runs_again_on_other_nodes(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    """A 2-pod gang and a spare node; one node goes silent (its Lease is no longer renewed). Its pod
    still says Running, and once deleted it stays Terminating for good (nobody confirms it). The gang
    is disrupted NODE_LOST_AFTER_SECONDS after the node turns Unknown, restarts as a preemption on the
    other nodes without waiting for the lost pod, under names of its own."""
    nodes = private_nodes.add(3, gpus=8)
    # The trainer on the healthy node stops 2 s after SIGTERM (its checkpoint is quick here).
    job = training_job("partitioned", replicas=2, gpus=8, placement=private_nodes.placement(),
                       terminate_after="2s")  # fmt: skip
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "partitioned", "Running", timeout=40)
    before = {p["metadata"]["name"]: p for p in pods_in(cluster, namespace, "partitioned")}
    silent = sorted(p["spec"]["nodeName"] for p in before.values())[0]
    lost_pod = next(n for n, p in before.items() if p["spec"]["nodeName"] == silent)
    silence_node(cluster, silent)
    silenced_at = time.monotonic()

    # Bound: the node turns Unknown after the node monitor grace period (<= 40 s after the last
    # renewal); the operator waits NODE_LOST_AFTER_SECONDS more; the healthy pod takes 2 s to stop;
    # admission, scheduling and kwok's start take a few seconds: 90 s in all, with room for a busy machine.
    bound = NODE_MONITOR_GRACE_SECONDS + NODE_LOST_AFTER_SECONDS + 30
    status = wait_for(
        lambda: (s := job_status(cluster, namespace, "partitioned")).get("attempt") == 1
        and s.get("phase") == "Running" and s,
        timeout=bound, what="the gang running again on other nodes",
    )  # fmt: skip
    elapsed = time.monotonic() - silenced_at
    print(f"running again {elapsed:.1f}s after the node went silent")
    assert node_ready_status(cluster, silent) == "Unknown"
    assert status["restarts"] == {"failures": 0, "preemptions": 1, "hangs": 0}
    events = cluster.get_json(
        "events", "-n", namespace, "--field-selector", "involvedObject.name=partitioned"
    )
    said = [e["message"] for e in events["items"] if e["reason"] == "Preempted"]
    assert said and f"node {silent} not Ready" in said[0], said

    pods = pods_in(cluster, namespace, "partitioned")
    current = [p for p in pods if p["metadata"]["labels"]["phalanx.dev/attempt"] == "1"]
    assert len(current) == 2 and all(p["status"].get("phase") == "Running" for p in current)
    placed = {p["spec"]["nodeName"] for p in current}
    assert silent not in placed and placed <= set(nodes) and len(placed) == 2
    for pod in current:  # kept off the lost node even if it came back Ready
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        avoid = {"key": "metadata.name", "operator": "NotIn", "values": [silent]}
        assert all(avoid in t["matchFields"] for t in terms["nodeSelectorTerms"]), terms
    # The lost pod is still there, Terminating: the new attempt did not wait for it, and shares
    # neither its name nor its DNS name (the rendezvous address) with it.
    (lingering,) = [p for p in pods if p["metadata"]["labels"]["phalanx.dev/attempt"] == "0"]
    assert lingering["metadata"]["name"] == lost_pod and lingering["metadata"].get("deletionTimestamp")
    names = {p["metadata"]["name"] for p in current}
    hostnames = {p["spec"]["hostname"] for p in current}
    assert lost_pod not in names and before[lost_pod]["spec"]["hostname"] not in hostnames
    rank0 = next(p for p in current if p["metadata"]["labels"]["phalanx.dev/replica-index"] == "0")
    for pod in current:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["MASTER_ADDR"].split(".")[0] == rank0["spec"]["hostname"]
        assert env["PHALANX_ATTEMPT"] == "1"


@pytest.mark.parametrize("fault", ["being-removed", "silent"])
def test_a_gang_admitted_early_onto_a_node_that_stops_taking_pods_runs_on_another_without_waiting_for_the_gang_timeout(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any, fault: str
) -> None:
    """The second gang is admitted early onto the first job's node (it says it ends in 4 s, and runs
    on), pinned there unbound; the cluster autoscaler then taints the node for removal, or it stops
    heartbeating. The scheduler will
    never bind there, so the gang is queued again at once (rules/stranded.py) and runs on a node
    added meanwhile, well before its 300 s gang timeout; nothing is counted as a restart. Fails
    before the rule: the pod stays pinned until the gang timeout."""
    (first_node,) = private_nodes.add(1, gpus=8)
    placement = private_nodes.placement()
    cluster.apply(training_job("first", replicas=1, gpus=8, run_for="600s", placement=placement,
                               scheduling={"expectedRunSeconds": 4}), namespace)  # fmt: skip
    wait_phase(cluster, namespace, "first", "Running", timeout=30)
    cluster.apply(training_job("second", replicas=1, gpus=8, run_for="600s", placement=placement,
                               scheduling={"expectedRunSeconds": 600}), namespace)  # fmt: skip

    def pinned_and_waiting() -> bool:
        second = pods_in(cluster, namespace, "second")
        return len(second) == 1 and not is_gated(second[0]) and not second[0]["spec"].get("nodeName")

    wait_for(pinned_and_waiting, timeout=30, what="the second gang admitted early, not bound")
    assert pinned_node(pods_in(cluster, namespace, "second")[0]) == first_node
    if fault == "being-removed":
        cluster.kubectl("taint", "node", first_node, "ToBeDeletedByClusterAutoscaler=1700000000:NoSchedule")
        bound = 30.0  # the node event, a reconcile, the next attempt's admission and kwok's start
    else:
        silence_node(cluster, first_node)
        bound = NODE_MONITOR_GRACE_SECONDS + NODE_LOST_AFTER_SECONDS + 30
    faulted_at = time.monotonic()
    # Room elsewhere, which the pinned pod cannot take: two nodes, as the silent node's job restarts too.
    others = private_nodes.add(2, gpus=8, prefix="q")

    def running_elsewhere() -> dict[str, Any] | None:
        status = job_status(cluster, namespace, "second")
        current = [
            p for p in pods_in(cluster, namespace, "second") if not p["metadata"].get("deletionTimestamp")
        ]
        on_other = len(current) == 1 and current[0]["spec"].get("nodeName") in others
        return status if status.get("phase") == "Running" and on_other else None

    status = wait_for(running_elsewhere, timeout=bound, what="the second gang running on the other node")
    print(f"running elsewhere {time.monotonic() - faulted_at:.1f}s after the node was {fault}")
    assert status["attempt"] == 1 and status["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}
    assert "gangTimeouts" not in status
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=second")
    said = [e["message"] for e in events["items"] if e["reason"] == "AdmittedNodeUnusable"]
    expected = "being removed" if fault == "being-removed" else "not Ready since"
    assert said and f"admitted onto node {first_node}, which is {expected}" in said[0], said


# -- operator restart during admission ------------------------------------------------------------
def test_operator_killed_in_the_middle_of_admitting_a_gang_finishes_it_after_restart(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    private_nodes.add(2, gpus=8)
    operator.stop()
    # Nothing else waits, so the gang would be admitted as its pods are created; this test is about
    # lifting gates, so every pod is created gated.
    operator.start(
        extra_env={"PHALANX_FAILPOINT_EXIT_AFTER_ADMITS": "2", "PHALANX_ADMIT_ON_CREATION": "false"}
    )
    cluster.apply(training_job("half", replicas=4, gpus=4, placement=private_nodes.placement()), namespace)
    assert operator.proc is not None
    operator.proc.wait(timeout=60)  # the failpoint killed it after lifting two of the four gates
    assert operator.proc.returncode == 3
    pods = pods_in(cluster, namespace, "half")
    assert len(pods) == 4 and sum(is_gated(p) for p in pods) == 2

    operator.start(extra_env={"PHALANX_ADMIT_ON_CREATION": "false"})
    status = wait_phase(cluster, namespace, "half", "Running", timeout=40)
    pods = pods_in(cluster, namespace, "half")
    assert sorted(p["metadata"]["name"] for p in pods) == [f"half-worker-{i}" for i in range(4)]
    assert not any(is_gated(p) for p in pods) and all(p["spec"].get("nodeName") for p in pods)
    assert status["attempt"] == 0 and status["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}
    per_node: dict[str, int] = {}
    for pod in pods:
        per_node[pod["spec"]["nodeName"]] = per_node.get(pod["spec"]["nodeName"], 0) + gpus_of(pod)
    assert sorted(per_node.values()) == [8, 8]
