"""Telling kept pods their restart generation (controller/generations.py): what counts as taken,
and the publisher against a stand-in for the launcher's control server on 127.0.0.1 (the
launcher's own side is tests/unit/test_resident_launcher.py and tests/trainer)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from phalanx import constants as c
from phalanx.builders.names import master_addr
from phalanx.controller import generations
from phalanx.controller.generations import GenerationPublisher, judge_answer
from phalanx.controller.queue import WorkQueue

pytestmark = pytest.mark.unit


def test_202_and_a_409_at_or_past_the_generation_are_taken() -> None:
    assert judge_answer(202, {}, 3).taken
    assert judge_answer(409, {"generation": 3, "error": "not newer"}, 3).taken  # told before a restart
    assert judge_answer(409, {"generation": 2, "pending_generation": 4}, 3).taken


def test_a_409_below_the_generation_and_other_answers_are_refusals_with_the_launchers_words() -> None:
    refused = judge_answer(409, {"generation": 2, "error": "the launcher is exiting"}, 3)
    assert not refused.taken and refused.why == "HTTP 409: the launcher is exiting"
    assert judge_answer(400, {"error": "generation: expected an integer"}, 3).why.startswith("HTTP 400")
    assert not judge_answer(409, {"generation": True}, 3).taken  # a boolean is no generation


class Launcher(BaseHTTPRequestHandler):
    """Answers as the resident launcher does: 202 once per newer generation, else 409."""

    generation = 0
    bodies: list[dict[str, Any]] = []
    authorizations: list[str | None] = []
    exiting = False

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Launcher.bodies.append(body)
        Launcher.authorizations.append(self.headers.get("Authorization"))
        if Launcher.exiting or body["generation"] <= Launcher.generation:
            code, answer = 409, {"error": "refused", "generation": Launcher.generation}
        else:
            Launcher.generation = body["generation"]
            code, answer = 202, {"generation": body["generation"], "state": "running"}
        raw = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


class Recorded(WorkQueue):
    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []

    def enqueue_threadsafe(self, key: str) -> None:
        self.keys.append(key)


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Launcher)
    monkeypatch.setattr(c, "DEFAULT_CONTROL_PORT", server.server_address[1])
    monkeypatch.setattr(generations, "GENERATION_RETRY_SECONDS", 0.05)
    Launcher.generation, Launcher.bodies, Launcher.exiting = 0, [], False
    Launcher.authorizations = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield
    server.shutdown()
    server.server_close()


def kept_pod(ip: str = "127.0.0.1") -> dict[str, Any]:
    annotations = {c.ANNOTATION_RESIDENT_LAUNCHER: "true"}  # built with the trainer's resident launcher
    return {
        "metadata": {"name": "j-worker-0", "uid": "u0", "annotations": annotations},
        "status": {"podIP": ip},
    }


STATUS = {"attempt": 1, "phase": "Restarting", "inPlace": {"attempt": 1, "keptPods": [{"name": "j-worker-0", "uid": "u0"}]}}  # fmt: skip


def settle(publisher: GenerationPublisher) -> None:
    publisher.pool.shutdown(wait=True)


@pytest.mark.usefixtures("launcher")
def test_each_kept_pod_is_told_once_its_generation_and_attempt() -> None:
    publisher = GenerationPublisher(Recorded())
    publisher.publish("ns/j", "job-uid", [kept_pod()], STATUS)
    publisher.publish("ns/j", "job-uid", [kept_pod()], STATUS)  # the next reconcile: not again
    settle(publisher)
    assert Launcher.bodies == [{"generation": 1, "env": {"PHALANX_ATTEMPT": "1"}, "stop": "checkpoint"}]
    assert publisher.refusals("ns/j", "job-uid", 1) == {}


@pytest.mark.usefixtures("launcher")
def test_a_gang_broken_by_a_failure_is_told_to_stop_now_not_to_agree_a_checkpoint() -> None:
    # From the in-place review (M6): after a crash or SIGKILL the lost rank can agree on nothing;
    # asking the kept ranks for a checkpoint only waits out their stop deadline (a rank stuck in a
    # collective never reaches the step boundary). The state comes from the newest checkpoint.
    status = {**STATUS, "inPlace": {**STATUS["inPlace"], "stop": "now"}}
    publisher = GenerationPublisher(Recorded())
    publisher.publish("ns/j", "job-uid", [kept_pod()], status)
    settle(publisher)
    assert [b["stop"] for b in Launcher.bodies] == ["now"]


@pytest.mark.usefixtures("launcher")
def test_after_an_operator_restart_the_repeat_is_answered_409_and_counts_as_done() -> None:
    Launcher.generation = 1
    publisher = GenerationPublisher(Recorded())
    publisher.publish("ns/j", "job-uid", [kept_pod()], STATUS)
    settle(publisher)
    assert len(Launcher.bodies) == 1 and publisher.refusals("ns/j", "job-uid", 1) == {}


@pytest.mark.usefixtures("launcher")
def test_a_refusal_is_kept_for_the_next_reconcile_of_that_job_and_attempt() -> None:
    Launcher.exiting = True
    work = Recorded()
    publisher = GenerationPublisher(work)
    publisher.publish("ns/j", "job-uid", [kept_pod()], STATUS)
    settle(publisher)
    assert publisher.refusals("ns/j", "job-uid", 1) == {"j-worker-0": "HTTP 409: refused"}
    assert publisher.refusals("ns/j", "job-uid", 2) == {} and publisher.refusals("ns/j", "other", 1) == {}
    assert work.keys == ["ns/j"]  # looked at again at once


@pytest.mark.usefixtures("launcher")
def test_an_unreachable_launcher_is_tried_a_few_times_then_reported() -> None:
    publisher = GenerationPublisher(Recorded())
    started = time.monotonic()
    publisher.publish("ns/j", "job-uid", [kept_pod("127.0.0.2")], STATUS)  # nothing listens there
    settle(publisher)
    [why] = publisher.refusals("ns/j", "job-uid", 1).values()
    assert why.startswith("unreachable at 127.0.0.2:") and time.monotonic() - started < 10


@pytest.mark.usefixtures("launcher")
def test_nothing_is_sent_without_kept_pods_or_for_a_replaced_pod() -> None:
    publisher = GenerationPublisher(Recorded())
    publisher.publish("ns/j", "job-uid", [kept_pod()], {"attempt": 1, "phase": "Running"})
    stranger = {**kept_pod(), "metadata": {"name": "j-worker-0", "uid": "other"}}
    publisher.publish("ns/j", "job-uid", [stranger], STATUS)
    settle(publisher)
    assert Launcher.bodies == []


@pytest.mark.usefixtures("launcher")
def test_the_pods_control_token_goes_with_its_post_and_no_other_pods() -> None:
    publisher = GenerationPublisher(Recorded())
    pod = kept_pod()
    pod["metadata"]["annotations"][c.ANNOTATION_CONTROL_TOKEN] = "tok-of-worker-0"
    publisher.publish("ns/j", "job-uid", [pod], STATUS)
    settle(publisher)
    assert Launcher.authorizations == ["Bearer tok-of-worker-0"]


@pytest.mark.usefixtures("launcher")
def test_a_torchrun_pod_kept_in_place_is_told_nothing() -> None:
    publisher = GenerationPublisher(Recorded())
    pod = kept_pod()
    pod["metadata"]["annotations"][c.ANNOTATION_RESIDENT_LAUNCHER] = c.RESIDENT_TORCHRUN
    publisher.publish("ns/j", "job-uid", [pod], STATUS)
    settle(publisher)
    assert Launcher.bodies == []


@pytest.mark.usefixtures("launcher")
def test_a_spare_taking_a_rank_is_told_the_rank_and_rank_0s_address_with_its_generation() -> None:
    spare = {
        "metadata": {"name": "j-spare-0", "uid": "s0", "annotations": {c.ANNOTATION_RESIDENT_LAUNCHER: "true"},
                     "labels": {c.LABEL_SPARE: "true", c.LABEL_ATTEMPT: "0"}},
        "status": {"podIP": "127.0.0.1"},
    }  # fmt: skip
    rank0 = kept_pod()
    rank0["metadata"]["labels"] = {c.LABEL_REPLICA_INDEX: "0", c.LABEL_ATTEMPT: "0"}
    kept = [{"name": "j-worker-0", "uid": "u0"}, {"name": "j-spare-0", "uid": "s0", "rank": 1}]
    status = {**STATUS, "inPlace": {"attempt": 1, "keptPods": kept}}
    publisher = GenerationPublisher(Recorded(), cluster_domain="example.org")
    # Rank 0 not seen yet (the store lags): the spare is not told (nor marked told) without it.
    publisher.publish("ns/j", "job-uid", [spare], status)
    assert publisher.pool._work_queue.empty() and Launcher.bodies == []
    publisher.publish("ns/j", "job-uid", [rank0, spare], status)
    settle(publisher)
    told = next(b for b in Launcher.bodies if "NODE_RANK" in b["env"])
    assert told["env"] == {"PHALANX_ATTEMPT": "1", "NODE_RANK": "1",
                           "MASTER_ADDR": "j-worker-0.j.ns.svc.example.org"}  # fmt: skip
    assert {"PHALANX_ATTEMPT": "1"} in [b["env"] for b in Launcher.bodies]  # a survivor keeps its rank
    assert len(Launcher.bodies) == 2


def test_master_addr_is_one_helper_for_the_contract_and_the_spares_post() -> None:
    assert master_addr("j", "ns", "example.org") == "j-worker-0.j.ns.svc.example.org"
    assert master_addr("j", "ns", "example.org", attempt=3) == "j-worker-0-a3.j.ns.svc.example.org"
