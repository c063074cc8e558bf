"""Restart in place with real resident launchers: two "pods" on localhost, gloo, one rank each.

Each pod is `python -m phalanx_trainer` with PHALANX_RESTART_IN_PLACE=true, NNODES=2 and its own
NODE_RANK and control port, as the operator will start it; the test plays the operator: it reads
GET /generation, POSTs the next generation, and starts a replacement (or assigns a spare). Global
rank 0 stays in pod 0, so pod 0's stdout holds the loss of every step across generations.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from phalanx.ports import free_port
from phalanx_trainer.checkpoint.store import parse_step_dir
from tests.event_lines import json_events

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
STEPS = 300
INTERVAL = 10
COLLECTIVE_TIMEOUT_S = 5
SMALL = [
    "job.torch_threads=1",
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=4",
    "model.seq_len=16",
    "data.batch_size=4",
    "metrics.log_every=1",
    "metrics.port=0",
    f"checkpoint.interval_steps={INTERVAL}",
]
START_TIMEOUT = 120.0  # a cold `import torch` takes 10-40 s on the loaded 2-core machine
# Rank 0 logs the all-reduced loss rounded to 5 decimals; the e2e tests allow one unit of the last
# digit (tests/e2e/test_training_e2e.py), and so does this file.
LOSS_TOLERANCE = 1.5e-5


@dataclass
class Pod:
    """One resident launcher process and what it printed."""

    name: str
    process: subprocess.Popen[bytes]
    control_port: int
    stdout: Path
    stderr: Path
    files: list[Any] = field(default_factory=list)

    def url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}/generation"

    def get(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url(), timeout=5) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def post(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            self.url(),
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def events(self) -> list[dict[str, Any]]:
        return json_events(self.stdout.read_text()) if self.stdout.exists() else []

    def last_step(self) -> int:
        steps = [e["step"] for e in self.events() if e["event"] == "progress"]
        return steps[-1] if steps else 0

    def log(self) -> str:
        return self.stderr.read_text()[-4000:] if self.stderr.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        for handle in self.files:
            handle.close()


class Gang:
    """The pods of one run, sharing a rendezvous port and a checkpoint folder."""

    def __init__(self, folder: Path, steps: int = STEPS) -> None:
        self.folder = folder
        self.steps = steps
        self.master_port = free_port()
        self.pods: list[Pod] = []

    def start(self, name: str, args: Sequence[str] = (), **env: str) -> Pod:
        control_port = free_port()
        full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        full_env.update(
            PYTHONPATH=str(REPO / "trainer-image"),
            GLOO_SOCKET_IFNAME="lo",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(self.master_port),
            NNODES="2",
            NPROC_PER_NODE="1",
            PHALANX_RESTART_IN_PLACE="true",
            PHALANX_CONTROL_PORT=str(control_port),
            PHALANX_CHECKPOINT_DIR=str(self.folder / "ckpt"),
            PHALANX_COLLECTIVE_TIMEOUT_SECONDS=str(COLLECTIVE_TIMEOUT_S),
            PHALANX_RENDEZVOUS_TIMEOUT_SECONDS="120",
        )
        full_env.update(env)
        stdout, stderr = self.folder / f"{name}.out", self.folder / f"{name}.err"
        out, err = stdout.open("wb"), stderr.open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "phalanx_trainer", *SMALL, f"job.steps={self.steps}", *args],
            env=full_env,
            stdout=out,
            stderr=err,
        )
        pod = Pod(name, process, control_port, stdout, stderr, [out, err])
        self.pods.append(pod)
        return pod

    def stop(self) -> None:
        for pod in self.pods:
            pod.stop()


@pytest.fixture
def gang(tmp_path: Path) -> Iterator[Gang]:
    started = Gang(tmp_path)
    yield started
    started.stop()


def wait_for(what: str, check: Callable[[], bool], timeout: float, pods: list[Pod]) -> float:
    """Polls `check` every 50 ms; returns the seconds it took."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if check():
                return time.monotonic() - began
        except OSError:
            pass  # the control server is not up yet
        time.sleep(0.05)
    logs = "\n".join(f"--- {pod.name} (exit {pod.process.poll()}):\n{pod.log()}" for pod in pods)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs}")


def state_of(pod: Pod) -> str:
    return str(pod.get()["state"])


def losses(pod: Pod) -> dict[int, float]:
    """Step -> loss from rank 0's log; a step logged twice (redone after a kill) keeps the last."""
    return {e["step"]: e["loss"] for e in pod.events() if e["event"] == "progress"}


def mismatches(run: dict[int, float], reference: dict[int, float]) -> dict[int, tuple[float, float | None]]:
    return {
        step: (loss, reference.get(step))
        for step, loss in run.items()
        if step not in reference or abs(loss - reference[step]) > LOSS_TOLERANCE
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The uninterrupted run: both pods in generation 0 from step 1 to the end."""
    run = Gang(tmp_path_factory.mktemp("reference"))
    try:
        pod0 = run.start("pod0", NODE_RANK="0")
        pod1 = run.start("pod1", NODE_RANK="1")
        assert pod0.process.wait(START_TIMEOUT + 120) == 0, pod0.log()
        assert pod1.process.wait(30) == 0, pod1.log()
    finally:
        run.stop()
    result = losses(pod0)
    assert sorted(result) == list(range(1, STEPS + 1))
    assert result[STEPS] < result[1]  # it learned something
    return result


def test_sigterm_to_one_pod_keeps_the_survivor_resident_and_generation_1_loses_no_step(
    gang: Gang, reference: dict[int, float]
) -> None:
    pod0 = gang.start("pod0", NODE_RANK="0")
    pod1 = gang.start("pod1", NODE_RANK="1")
    wait_for("step 30", lambda: pod0.last_step() >= 30, START_TIMEOUT, gang.pods)

    pod1.process.send_signal(signal.SIGTERM)
    assert pod1.process.wait(60) == 75, pod1.log()
    wait_for("pod 0 waiting", lambda: state_of(pod0) == "waiting", 30, gang.pods)
    status = pod0.get()
    assert pod0.process.poll() is None  # the same launcher process, still up
    assert status["generation"] == 0 and status["last_exit_codes"] == [75] and status["worker_pids"] == []

    new_port = str(free_port())  # a port per generation, the second fence
    code, answer = pod0.post({"generation": 1, "env": {"MASTER_PORT": new_port}})
    assert code == 202, answer
    replacement = gang.start("pod1-gen1", NODE_RANK="1", PHALANX_GENERATION="1", MASTER_PORT=new_port)
    assert pod0.process.wait(START_TIMEOUT + 60) == 0, pod0.log()
    assert replacement.process.wait(30) == 0, replacement.log()

    events = pod0.events()
    preempted = next(e["step"] for e in events if e["event"] == "preempted")
    resumed_event = next(e for e in events if e["event"] == "resumed")
    assert resumed_event["step"] == preempted  # the agreed stop's checkpoint: no step lost
    # Pod 0 kept its state in memory; the new pod 1 had none and received it from rank 0.
    assert resumed_event["source"] == "memory+peer"
    firsts = [(e["generation"], e["step"]) for e in events if e["event"] == "first_step"]
    assert firsts == [(0, 1), (1, preempted + 1)]
    run = losses(pod0)
    assert sorted(run) == list(range(1, STEPS + 1))
    assert mismatches(run, reference) == {}


def test_a_post_to_a_running_gang_stops_it_at_one_step_and_starts_the_new_generation_in_place(
    gang: Gang, reference: dict[int, float]
) -> None:
    pod0 = gang.start("pod0", NODE_RANK="0")
    pod1 = gang.start("pod1", NODE_RANK="1")
    wait_for("step 30", lambda: pod0.last_step() >= 30, START_TIMEOUT, gang.pods)
    pids = {pod.name: pod.get()["worker_pids"] for pod in (pod0, pod1)}

    for pod in (pod0, pod1):  # what the operator does when it moves a rank: both pods stay
        code, answer = pod.post({"generation": 1, "stop": "checkpoint"})
        assert code == 202 and answer["pending_generation"] == 1, answer
    assert pod0.process.wait(START_TIMEOUT) == 0, pod0.log()
    assert pod1.process.wait(30) == 0, pod1.log()

    events = pod0.events()
    preempted = next(e["step"] for e in events if e["event"] == "preempted")
    resumed_event = next(e for e in events if e["event"] == "resumed")
    assert resumed_event["step"] == preempted
    assert resumed_event["source"] == "memory"  # both pods stayed: no rank read checkpoint storage
    assert [e["generation"] for e in events if e["event"] == "first_step"] == [0, 1]
    started = [line for line in pod1.log().splitlines() if "launcher_generation_started" in line]
    assert len(started) == 2 and json.loads(started[1])["pids"] != pids["pod1"]  # new workers, same launcher
    run = losses(pod0)
    assert sorted(run) == list(range(1, STEPS + 1))
    assert mismatches(run, reference) == {}


def test_a_launcher_left_waiting_exits_with_its_workers_code_when_no_generation_comes(gang: Gang) -> None:
    gang.steps = 100_000
    pod0 = gang.start("pod0", NODE_RANK="0", PHALANX_GENERATION_WAIT_SECONDS="3")
    pod1 = gang.start("pod1", NODE_RANK="1")
    wait_for("step 10", lambda: pod0.last_step() >= 10, START_TIMEOUT, gang.pods)

    pod1.process.send_signal(signal.SIGTERM)
    assert pod1.process.wait(60) == 75, pod1.log()
    waited = wait_for("pod 0 to exit", lambda: pod0.process.poll() is not None, 30, gang.pods)
    assert pod0.process.returncode == 75  # the full gang restart takes over from the checkpoint
    assert 2 < waited < 15
    assert '"launcher_generation_wait_expired"' in pod0.log()


def test_each_generation_reports_its_own_startup_times_in_progress(gang: Gang) -> None:
    gang.steps = 100_000
    metrics_port = free_port()
    pod0 = gang.start("pod0", args=["metrics.port=-1"], NODE_RANK="0", PHALANX_METRICS_PORT=str(metrics_port))
    pod1 = gang.start("pod1", NODE_RANK="1")
    wait_for("step 10", lambda: pod0.last_step() >= 10, START_TIMEOUT, gang.pods)

    for pod in (pod0, pod1):
        code, answer = pod.post({"generation": 1})
        assert code == 202, answer
    accepted_at = min(pod.get()["accepted_at"] for pod in (pod0, pod1))

    def startup() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/progress", timeout=5) as response:
            times = json.loads(response.read()).get("startup", {})
        return {phase: datetime.fromisoformat(value).timestamp() for phase, value in times.items()}

    wait_for("generation 1's first step in /progress", lambda: "first_step" in startup() and
             startup()["first_step"] > accepted_at, 60, gang.pods)  # fmt: skip
    times = startup()
    # Generation 1's own start, not the resident launcher's (a fork inherits the parent's marks).
    assert (
        accepted_at
        <= times["started"]
        <= times["rendezvous_done"]
        <= times["restored"]
        <= times["first_step"]
    )
    for pod in (pod0, pod1):
        pod.process.send_signal(signal.SIGTERM)
    assert pod0.process.wait(60) == 75 and pod1.process.wait(60) == 75


def test_sigkill_of_one_worker_fails_the_peer_within_the_collective_timeout_and_resumes_in_place(
    gang: Gang, reference: dict[int, float]
) -> None:
    pod0 = gang.start("pod0", NODE_RANK="0")
    pod1 = gang.start("pod1", NODE_RANK="1")
    wait_for("step 25", lambda: pod0.last_step() >= 25, START_TIMEOUT, gang.pods)

    (worker,) = pod1.get()["worker_pids"]
    os.kill(worker, signal.SIGKILL)
    killed_at_step = pod0.last_step()
    noticed = wait_for("pod 0 waiting", lambda: state_of(pod0) == "waiting", 30, gang.pods)
    assert noticed < COLLECTIVE_TIMEOUT_S + 5  # seconds, not torch's default 30 minutes
    assert pod0.get()["last_exit_codes"] == [76]
    wait_for("pod 1 waiting", lambda: state_of(pod1) == "waiting", 10, gang.pods)
    assert pod1.get()["last_exit_codes"] == [128 + signal.SIGKILL]
    assert "restart generation failed" in pod0.log()

    # Both launchers survive; generation 1 reuses the same rendezvous port.
    newest = max(parse_step_dir(d.name) or 0 for d in (gang.folder / "ckpt").iterdir())
    for pod in (pod0, pod1):
        code, answer = pod.post({"generation": 1})
        assert code == 202, answer
    assert pod0.process.wait(START_TIMEOUT) == 0, pod0.log()
    assert pod1.process.wait(30) == 0, pod1.log()

    events = pod0.events()
    resumed = [e["step"] for e in events if e["event"] == "resumed"]
    # No agreed stop, so nothing was kept in memory: the periodic checkpoint from storage.
    assert [e["source"] for e in events if e["event"] == "resumed"] == ["storage"]
    # The newest periodic checkpoint committed when generation 1 started (an asynchronous save may
    # commit just after the kill, so the newest can be a step or two past what the test saw then).
    assert resumed == [newest] and newest % INTERVAL == 0 and 0 < newest <= killed_at_step + INTERVAL
    run = losses(pod0)
    assert sorted(run) == list(range(1, STEPS + 1))
    assert mismatches(run, reference) == {}


# A model hook that is the stock GPT, except that pod 1's worker of generation 1 dies (SIGKILL, as
# a lost node) while it builds its Trainer: pod 0's worker is then inside its own Trainer build.
DIE_WHILE_BUILDING = """
import os
import signal

from phalanx_trainer.models.gpt import GPT


def build(config):
    if os.environ.get("NODE_RANK") == "1" and os.environ.get("PHALANX_GENERATION") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return GPT(config)
"""


def test_a_peer_lost_while_a_generation_builds_its_trainer_fails_the_survivor_with_76_not_1(
    gang: Gang, tmp_path: Path
) -> None:
    gang.steps = 100_000
    (tmp_path / "die_while_building.py").write_text(DIE_WHILE_BUILDING)
    hook = ["model.kind=custom", "model.custom=die_while_building:build"]
    path = f"{REPO / 'trainer-image'}{os.pathsep}{tmp_path}"
    pod0 = gang.start("pod0", hook, NODE_RANK="0", PYTHONPATH=path)
    pod1 = gang.start("pod1", hook, NODE_RANK="1", PYTHONPATH=path)
    wait_for("step 3", lambda: pod0.last_step() >= 3, START_TIMEOUT, gang.pods)

    for pod in (pod0, pod1):
        code, answer = pod.post({"generation": 1, "stop": "now"})
        assert code == 202, answer
    wait_for("pod 1 waiting", lambda: state_of(pod1) == "waiting", 60, gang.pods)
    assert pod1.get()["last_exit_codes"] == [128 + signal.SIGKILL]
    wait_for(
        "pod 0 out of generation 1",
        lambda: pod0.process.poll() is not None or state_of(pod0) == "waiting",
        60,
        gang.pods,
    )
    assert pod0.process.poll() is None, f"pod 0's launcher exited {pod0.process.poll()}: {pod0.log()}"
    answer = pod0.get()
    assert answer["generation"] == 1 and answer["last_exit_codes"] == [76], pod0.log()
    assert "restart generation failed" in pod0.log()
    assert [e for e in pod0.events() if e["event"] == "first_step" and e.get("generation") == 1] == []


def test_a_hung_peer_ends_the_survivors_collective_at_the_collective_timeout(gang: Gang) -> None:
    gang.steps = 100_000
    pod0 = gang.start("pod0", NODE_RANK="0")
    pod1 = gang.start("pod1", NODE_RANK="1")
    wait_for("step 10", lambda: pod0.last_step() >= 10, START_TIMEOUT, gang.pods)

    (worker,) = pod1.get()["worker_pids"]
    os.kill(worker, signal.SIGSTOP)  # alive, connections open, never answering: no reset to notice
    noticed = wait_for("pod 0 waiting", lambda: state_of(pod0) == "waiting", 60, gang.pods)
    assert COLLECTIVE_TIMEOUT_S - 1 <= noticed < COLLECTIVE_TIMEOUT_S + 10
    assert pod0.get()["last_exit_codes"] == [76]
    assert pod0.process.poll() is None

    os.kill(worker, signal.SIGKILL)
    wait_for("pod 1 waiting", lambda: state_of(pod1) == "waiting", 10, gang.pods)
    for pod in (pod0, pod1):  # SIGTERM while waiting: exit at once with the workers' code
        pod.process.send_signal(signal.SIGTERM)
    assert pod0.process.wait(10) == 76 and pod1.process.wait(10) == 128 + signal.SIGKILL


def test_fencing_old_generations_get_409_and_a_stale_worker_cannot_join(gang: Gang) -> None:
    gang.steps = 100_000  # runs until stopped
    pod0 = gang.start("pod0", NODE_RANK="0", PHALANX_GENERATION="3")
    pod1 = gang.start("pod1", NODE_RANK="1", PHALANX_GENERATION="3")
    wait_for("step 5", lambda: pod0.last_step() >= 5, START_TIMEOUT, gang.pods)

    for generation in (3, 2, 0):
        code, answer = pod0.post({"generation": generation})
        assert code == 409, answer
        assert f"generation {generation} is not newer than the current 3" in answer["error"]
    code, answer = pod0.post({"generation": "4"})
    assert code == 400 and answer["error"].startswith("generation:")

    # A worker of generation 2 (its pod missed a generation) tries the generation-3 group's store.
    stale_env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK",)}
    stale_env.update(
        PYTHONPATH=str(REPO / "trainer-image"),
        GLOO_SOCKET_IFNAME="lo",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(gang.master_port),
        RANK="1",
        LOCAL_RANK="0",
        WORLD_SIZE="2",
        PHALANX_RESTART_IN_PLACE="true",
        PHALANX_GENERATION="2",
        PHALANX_CHECKPOINT_DIR=str(gang.folder / "ckpt"),
    )
    stale = subprocess.run(
        [sys.executable, "-m", "phalanx_trainer", *SMALL, "job.steps=100000"],
        env=stale_env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
    )
    assert stale.returncode == 76, stale.stderr[-3000:]
    assert "StaleGeneration: rank 1 is of restart generation 2 but the group" in stale.stderr
    assert "is at generation 3" in stale.stderr

    # The generation-3 group is unaffected: it trains on.
    before = pod0.last_step()
    wait_for("training to go on", lambda: pod0.last_step() >= before + 10, 30, gang.pods)
    assert state_of(pod0) == "running" and state_of(pod1) == "running"
    for pod in (pod0, pod1):
        pod.process.send_signal(signal.SIGTERM)
    assert pod0.process.wait(60) == 75 and pod1.process.wait(60) == 75


def test_a_spare_takes_over_rank_1_on_its_first_generation(gang: Gang, reference: dict[int, float]) -> None:
    pod0 = gang.start("pod0", NODE_RANK="0")
    pod1 = gang.start("pod1", NODE_RANK="1")
    spare = gang.start("spare", PHALANX_SPARE="true")
    wait_for("the spare", lambda: state_of(spare) == "spare", START_TIMEOUT, gang.pods)
    assert spare.get()["node_rank"] is None and spare.get()["worker_pids"] == []
    wait_for("step 30", lambda: pod0.last_step() >= 30, START_TIMEOUT, gang.pods)

    pod1.process.send_signal(signal.SIGTERM)
    assert pod1.process.wait(60) == 75, pod1.log()
    wait_for("pod 0 waiting", lambda: state_of(pod0) == "waiting", 30, gang.pods)
    code, answer = spare.post({"generation": 1})
    assert code == 400 and "env.NODE_RANK" in answer["error"]  # a spare must be told its rank
    for pod, body in ((spare, {"generation": 1, "env": {"NODE_RANK": "1"}}), (pod0, {"generation": 1})):
        code, answer = pod.post(body)
        assert code == 202, answer
    accepted_at = max(pod.get()["accepted_at"] for pod in (pod0, spare))
    wait_for("generation 1's first step", lambda: any(
        e["event"] == "first_step" and e["generation"] == 1 for e in pod0.events()), 60, gang.pods)  # fmt: skip
    assert spare.get()["state"] == "running" and spare.get()["node_rank"] == 1
    assert next(e["source"] for e in pod0.events() if e["event"] == "resumed") == "memory+peer"
    first = next(e for e in pod0.events() if e["event"] == "first_step" and e["generation"] == 1)
    takeover_seconds = first["unix_time"] - accepted_at
    print(f"spare takeover: generation 1 accepted -> first step in {takeover_seconds:.2f} s")
    # No cold start on either side: well under one `import torch` on this machine (10-40 s).
    assert 0 < takeover_seconds < 10
    assert pod0.process.wait(START_TIMEOUT) == 0, pod0.log()
    assert spare.process.wait(30) == 0, spare.log()
    run = losses(pod0)
    assert sorted(run) == list(range(1, STEPS + 1))
    assert mismatches(run, reference) == {}
