"""Warm spares (spec.spares) against the real control plane, with kwok's simulated pods: the workers
are admitted without waiting for their spares (best effort, after them; a quota refusing a spare is
said in status.spares), a spare takes an evicted rank in place (no pod created for it, a new spare
in the background), and an idle spare lost is replaced with no restart.

kwok's pods run no resident launcher: a stand-in in this process answers the operator's POST of the
generation for every pod (PHALANX_FAILPOINT_LAUNCHER_ADDRESS, controller/failpoints.py) and tells
the pods apart by their control tokens (each pod's phalanx.dev/control-token annotation)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import Cluster, OperatorProcess, wait_for
from tests.jobs import job_pods, job_status, training_job, wait_phase

pytestmark = pytest.mark.integration

IN_PLACE = {"restartStrategy": "InPlace"}


class StandIn(BaseHTTPRequestHandler):
    """Answers POST /generation as a resident launcher does: 202 for a newer generation."""

    posts: list[tuple[str, dict[str, Any]]] = []  # (bearer token, body)
    generations: dict[str, int] = {}

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        StandIn.posts.append((token, body))
        newer = body["generation"] > StandIn.generations.get(token, -1)
        if newer:
            StandIn.generations[token] = body["generation"]
        code = 202 if newer else 409
        raw = json.dumps({"generation": StandIn.generations[token], "state": "running"}).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in_launcher(operator: OperatorProcess) -> Iterator[None]:
    """The operator restarted to POST generations to a stand-in; restarted plain afterwards."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    StandIn.posts, StandIn.generations = [], {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    operator.stop()
    operator.start(extra_env={"PHALANX_FAILPOINT_LAUNCHER_ADDRESS": f"127.0.0.1:{server.server_address[1]}"})
    try:
        yield
    finally:
        operator.stop()
        operator.start()
        server.shutdown()
        server.server_close()


def pods_by_name(cluster: Cluster, ns: str, name: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in job_pods(cluster, ns, name)}


def events_of(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json(
        "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return items


def spares_ready(cluster: Cluster, ns: str, name: str, ready: int) -> dict[str, Any] | None:
    status = job_status(cluster, ns, name)
    return status if (status.get("spares") or {}).get("ready") == ready else None


def bound(pod: dict[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName")) and not (pod["spec"].get("schedulingGates") or [])


def diagnosis(cluster: Cluster, ns: str, name: str, operator: OperatorProcess) -> str:
    """Where the job's pods stand (node, phase, gates, pin, scheduler's word), its status.spares,
    and the operator log's lines about this namespace and admissions."""
    lines = []
    for pod_name, pod in sorted(pods_by_name(cluster, ns, name).items()):
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        conditions = [
            (c.get("type"), c.get("status"), c.get("message")) for c in status.get("conditions") or []
        ]
        terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")  # fmt: skip
        lines.append(f"{pod_name}: node={spec.get('nodeName')} phase={status.get('phase')} "
                     f"deleting={pod['metadata'].get('deletionTimestamp')} gates={spec.get('schedulingGates')} "
                     f"pin={terms} conditions={conditions}")  # fmt: skip
    lines.append(f"status.spares: {job_status(cluster, ns, name).get('spares')}")
    mine = [line for line in operator.log_text().splitlines() if ns in line or "admitted" in line]
    return "\n".join([*lines, "operator log (this namespace, admissions; last 40):", *mine[-40:]])


def test_a_gang_runs_without_room_for_its_spare_which_is_admitted_once_room_appears(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    private_nodes.add(2, gpus=1, prefix="sa")  # room for the 2 workers, not for the spare
    job = training_job("sa", replicas=2, gpus=1, terminate_after="1s", placement=private_nodes.placement(),
                       spares=1, runPolicy=IN_PLACE)  # fmt: skip
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "sa", "Running", timeout=90)  # the workers never wait for a spare

    def spare_waiting() -> dict[str, Any] | None:
        pods = pods_by_name(cluster, namespace, "sa")
        return pods if "sa-spare-0" in pods and not bound(pods["sa-spare-0"]) else None

    wait_for(spare_waiting, timeout=60, what="the spare created, waiting at the gate")
    status = job_status(cluster, namespace, "sa")
    assert status["phase"] == "Running" and status["spares"]["ready"] == 0, status
    assert "spare" not in str(status.get("admissionMessage") or "")
    private_nodes.add(1, gpus=1, prefix="sb")
    wait_for(lambda: bound(pods_by_name(cluster, namespace, "sa")["sa-spare-0"]), timeout=60,
             what="the spare admitted once room appears")  # fmt: skip
    pods = pods_by_name(cluster, namespace, "sa")
    assert sorted(pods) == ["sa-spare-0", "sa-worker-0", "sa-worker-1"] and all(
        bound(p) for p in pods.values()
    )
    assert len({p["spec"]["nodeName"] for p in pods.values()}) == 3  # the spare holds a GPU of its own
    spare = pods["sa-spare-0"]
    assert spare["metadata"]["labels"]["phalanx.dev/spare"] == "true"
    env = {e["name"]: e.get("value") for e in spare["spec"]["containers"][0]["env"]}
    assert env["PHALANX_SPARE"] == "true" and "NODE_RANK" not in env
    status = wait_for(lambda: spares_ready(cluster, namespace, "sa", 1), timeout=30, what="status.spares")
    assert status["spares"]["summary"] == "1/1" and status["spares"]["pods"] == ["sa-spare-0"]


@pytest.mark.usefixtures("stand_in_launcher")
def test_a_spare_takes_the_evicted_rank_in_place_and_a_new_spare_is_created(
    cluster: Cluster, namespace: str
) -> None:
    job = training_job("st", replicas=2, terminate_after="1s", spares=1, runPolicy=IN_PLACE)
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "st", "Running", timeout=60)
    wait_for(lambda: spares_ready(cluster, namespace, "st", 1), timeout=30, what="the spare ready")
    before = pods_by_name(cluster, namespace, "st")
    tokens = {p["metadata"]["annotations"]["phalanx.dev/control-token"]: n for n, p in before.items()}
    cluster.kubectl("delete", "pod", "st-worker-1", "-n", namespace, "--wait=false")

    def recovered() -> dict[str, Any] | None:
        status = job_status(cluster, namespace, "st")
        ok = status.get("attempt") == 1 and status.get("phase") == "Running"
        return status if ok and (status.get("spares") or {}).get("ready") == 1 else None

    status = wait_for(recovered, timeout=120, what="attempt 1 running with a new spare ready")
    assert status["restarts"]["preemptions"] == 1 and status["restarts"]["failures"] == 0
    assert status["lastRecovery"]["path"] == "InPlaceSpare"
    assert {"name": "st-spare-0", "uid": before["st-spare-0"]["metadata"]["uid"], "rank": 1} in status[
        "inPlace"
    ]["keptPods"]
    told = {tokens[token]: body for token, body in StandIn.posts if body["generation"] == 1}
    assert told["st-worker-0"]["env"] == {"PHALANX_ATTEMPT": "1"}
    assert told["st-spare-0"]["env"] == {
        "PHALANX_ATTEMPT": "1",
        "NODE_RANK": "1",
        "MASTER_ADDR": f"st-worker-0.st.{namespace}.svc.cluster.local",
    }
    wait_for(
        lambda: "st-worker-1" not in pods_by_name(cluster, namespace, "st"), timeout=60, what="worker-1 gone"
    )
    after = pods_by_name(cluster, namespace, "st")
    # The survivors keep their uid; no worker pod was created; one new spare.
    assert sorted(after) == ["st-spare-0", "st-spare-1", "st-worker-0"]
    for name in ("st-worker-0", "st-spare-0"):
        assert after[name]["metadata"]["uid"] == before[name]["metadata"]["uid"]
    labels = after["st-spare-0"]["metadata"]["labels"]
    assert labels["phalanx.dev/replica-index"] == "1" and "phalanx.dev/spare" not in labels
    assert after["st-spare-1"]["metadata"]["labels"]["phalanx.dev/spare"] == "true" and bound(
        after["st-spare-1"]
    )
    assert [e for e in events_of(cluster, namespace, "st") if e["reason"] == "InPlaceFallback"] == []


def test_an_idle_spare_lost_is_replaced_without_disturbing_training(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    # Nodes of its own: on the shared ones another test's waiting gang may hold the room the new
    # spare needs (a spare never delays a waiting gang), and the spare would wait past the timeout.
    private_nodes.add(2, gpus=2, prefix="si")
    job = training_job("si", replicas=2, terminate_after="1s", spares=1, runPolicy=IN_PLACE,
                       placement=private_nodes.placement())  # fmt: skip
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "si", "Running", timeout=60)
    wait_for(lambda: spares_ready(cluster, namespace, "si", 1), timeout=30, what="the spare ready")
    before = pods_by_name(cluster, namespace, "si")
    cluster.kubectl("delete", "pod", "si-spare-0", "-n", namespace, "--wait=false")

    def replaced() -> dict[str, Any] | None:
        pods = pods_by_name(cluster, namespace, "si")
        spare = pods.get("si-spare-1")
        return (
            pods
            if spare is not None and bound(spare) and (spare.get("status") or {}).get("phase") == "Running"
            else None
        )

    try:
        wait_for(replaced, timeout=60, what="a new spare running")
    except AssertionError as timed_out:  # a rare flake: say where the new spare stood
        raise AssertionError(f"{timed_out}\n{diagnosis(cluster, namespace, 'si', operator)}") from None
    status = wait_for(lambda: spares_ready(cluster, namespace, "si", 1), timeout=30, what="status.spares")
    assert status["attempt"] == 0 and status["phase"] == "Running" and "inPlace" not in status
    assert not any((status.get("restarts") or {}).values())  # no restart, no counter
    after = pods_by_name(cluster, namespace, "si")
    for name in ("si-worker-0", "si-worker-1"):
        assert after[name]["metadata"]["uid"] == before[name]["metadata"]["uid"]
    events = events_of(cluster, namespace, "si")
    replaced_events = [e for e in events if e["reason"] == "SpareReplaced"]
    assert len(replaced_events) == 1 and replaced_events[0]["type"] == "Normal"
    assert "si-spare-0" in replaced_events[0]["message"]
    assert not [e for e in events if e["type"] == "Warning"], [e["message"] for e in events]


def test_a_quota_sized_for_the_workers_runs_the_gang_and_says_the_spare_is_refused(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "two-pods"},
             "spec": {"hard": {"pods": "2"}}}  # fmt: skip
    cluster.apply(quota, namespace)
    job = training_job("sq", replicas=2, terminate_after="1s", spares=1, runPolicy=IN_PLACE)
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "sq", "Running", timeout=60)

    def refused() -> dict[str, Any] | None:
        status = job_status(cluster, namespace, "sq")
        return status if "refused" in str((status.get("spares") or {}).get("message")) else None

    status = wait_for(refused, timeout=60, what="status.spares saying the spare is refused")
    assert status["spares"]["failures"] >= 1 and status["spares"].get("nextCreateTime")
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    assert conditions.get("PodsCreated", {}).get("status") != "False", conditions
    assert sorted(pods_by_name(cluster, namespace, "sq")) == ["sq-worker-0", "sq-worker-1"]
    events = events_of(cluster, namespace, "sq")
    assert [e["reason"] for e in events if e["type"] == "Warning"] == ["SparesRefused"], events


def test_a_waiting_gang_takes_an_idle_spares_room_and_the_spares_job_trains_on(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    # Spares are best effort: a gang of the same priority waiting for room takes an idle spare's,
    # and the spare's job is not preempted. Before: no lower-priority victim, so the waiting gang
    # stayed Pending for as long as the spare stood by.
    private_nodes.add(3, gpus=1, prefix="sp")
    placement = private_nodes.placement()
    cluster.apply(training_job("sp", replicas=2, gpus=1, terminate_after="1s", placement=placement, spares=1,
                               runPolicy=IN_PLACE), namespace)  # fmt: skip
    wait_phase(cluster, namespace, "sp", "Running", timeout=90)
    wait_for(lambda: bound(pods_by_name(cluster, namespace, "sp").get("sp-spare-0") or {"spec": {}}),
             timeout=60, what="the spare bound on the third node")  # fmt: skip
    spare_uid = pods_by_name(cluster, namespace, "sp")["sp-spare-0"]["metadata"]["uid"]

    cluster.apply(training_job("head", replicas=1, gpus=1, placement=placement), namespace)
    wait_phase(cluster, namespace, "head", "Running", timeout=60)
    status = job_status(cluster, namespace, "sp")
    assert status["phase"] == "Running" and status["attempt"] == 0, status
    assert status["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}
    assert not any(x["type"] == "Preempted" for x in status.get("conditions") or []), status["conditions"]
    assert "failures" not in (status.get("spares") or {}), status["spares"]  # no failing spare booked
    pods = pods_by_name(cluster, namespace, "sp")
    assert all(bound(pods[f"sp-worker-{i}"]) and not pods[f"sp-worker-{i}"]["metadata"].get("deletionTimestamp")
               for i in (0, 1)), "the workers are untouched"  # fmt: skip
    old = pods.get("sp-spare-0")
    assert old is None or old["metadata"]["uid"] != spare_uid or old["metadata"].get("deletionTimestamp")
    reasons = [e["reason"] for e in events_of(cluster, namespace, "sp")]
    assert "SparePreempted" in reasons and "PreemptedByPriority" not in reasons, reasons
