"""Real training through the operator on a dev node: finish, evict and resume, crash and resume, fail.

Every job is the demo job of examples/ (small GPT, 2 pods x 2 processes), shortened. The trainer is
deterministic, so a resumed run's losses must match the uninterrupted run's step for step.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phalanx.policy.recovery_timeline import PHASES, parse_time
from tests.conftest import Cluster, OperatorProcess, RealNode, create_namespace, wait_for
from tests.e2e.runs import (
    Run,
    evict,
    job_manifests,
    job_status,
    pod_uids,
    process_start_time,
    rank0_attempts,
    rank0_generations,
    restart_counts,
    running_processes_of,
    wait_for_generation_step,
    wait_for_step,
    wait_job_phase,
)

pytestmark = pytest.mark.e2e

STEPS = 160  # long enough for a few progress polls (1 s apart) even on an idle machine
INTERVAL = 20
RUN_TIMEOUT = 240.0  # a start costs 20-60 s of imports on a loaded 2-core machine


@pytest.fixture(scope="module")
def e2e_namespace(cluster: Cluster) -> Iterator[str]:
    name = create_namespace(cluster, f"e2e-{uuid.uuid4().hex[:6]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def uninterrupted(
    cluster: Cluster,
    e2e_namespace: str,
    real_node: RealNode,
    operator_process: OperatorProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Run:
    """The reference run; the operator is restarted half way, which must not disturb it."""
    operator_process.ensure_running()
    run = Run("plain", e2e_namespace)
    cluster.apply(job_manifests(run.name, real_node, tmp_path_factory.mktemp("ckpt"), steps=STEPS, interval=INTERVAL),
                  e2e_namespace)  # fmt: skip
    wait_for_step(real_node, e2e_namespace, run.name, 0, STEPS // 3, timeout=RUN_TIMEOUT)
    before = pod_uids(cluster, e2e_namespace, run.name)
    operator_process.stop()
    operator_process.start()
    samples = sample_status_until_finished(cluster, e2e_namespace, run.name, RUN_TIMEOUT)
    run.status = {
        **samples[-1],
        "pods_before_operator_restart": before,
        **job_times(cluster, e2e_namespace, run.name),
    }
    run.progress_seen = [s["progress"]["step"] for s in samples if "progress" in s]
    run.checkpoints_seen = [s["lastCheckpoint"]["step"] for s in samples if "lastCheckpoint" in s]
    run.status["pods_after"] = pod_uids(cluster, e2e_namespace, run.name)
    run.attempts = rank0_attempts(real_node, e2e_namespace, run.name)
    return run


def job_times(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return {
        "creationTimestamp": cluster.get_json("tj", name, "-n", namespace)["metadata"]["creationTimestamp"]
    }


def sample_status_until_finished(
    cluster: Cluster, namespace: str, name: str, timeout: float
) -> list[dict[str, Any]]:
    """status every second until the job finishes (the last sample is the final status)."""
    samples: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples.append(job_status(cluster, namespace, name))
        if samples[-1].get("phase") in ("Succeeded", "Failed"):
            return samples
        time.sleep(1.0)
    raise AssertionError(f"{name} did not finish in {timeout:.0f}s; last status: {samples[-1]}")


def test_an_uninterrupted_job_succeeds_with_its_final_loss(uninterrupted: Run) -> None:
    status = uninterrupted.status
    assert status["phase"] == "Succeeded", status
    assert len(uninterrupted.attempts) == 1 and uninterrupted.attempts[0].finished
    losses = uninterrupted.losses(0)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1]  # it learned something
    ledger = assert_goodput_books_every_second(status)
    assert device_seconds(ledger, "recovery") == 0 and device_seconds(ledger, "redoneSteps") == 0
    assert ledger["startupSeconds"] > 0  # imports and rendezvous before the first step


def device_seconds(ledger: dict[str, Any], cause: str) -> float:
    """The whole seconds shown and the fraction carried to the next booking."""
    return float(ledger[f"{cause}Seconds"]) + (ledger.get("remainderMilliseconds") or {}).get(cause, 0) / 1000


def assert_goodput_books_every_second(status: dict[str, Any]) -> dict[str, Any]:
    """Every device-second from creation to completion went to exactly one cause (within rounding
    and the 1 s resolution of the job's timestamps), and the ratio is the productive share."""
    ledger: dict[str, Any] = status["goodput"]
    devices = float(ledger["devices"])
    assert ledger["unit"] == "cpu" and devices > 0  # the dev node's pods ask for no accelerator
    causes = ("productive", "waitingForAdmission", "startup", "recovery", "redoneSteps", "checkpointStalls")
    booked = sum(device_seconds(ledger, cause) for cause in causes)
    wall = (parse_time(status["completionTime"]) or 0) - (parse_time(status["creationTimestamp"]) or 0)
    assert abs(booked - wall * devices) <= 2 * devices + len(causes), (ledger, wall)
    assert 0 < float(ledger["ratio"]) < 1
    # Spares standing by hold devices beside the gang's: they count against the ratio, not in `causes`.
    # Held up to the last booking (accountedTime, to the millisecond), not the completion time (to
    # the second), and the productive share with its carried fraction: for a 15 s run, a second of
    # rounding at both ends was 0.05 of the ratio, and one fresh-clone run failed on it.
    accounted = (parse_time(ledger["accountedTime"]) or 0) - (parse_time(status["creationTimestamp"]) or 0)
    held = accounted * devices + device_seconds(ledger, "standbySpares")
    assert float(ledger["ratio"]) == pytest.approx(device_seconds(ledger, "productive") / held, abs=0.01)
    return ledger


def test_progress_and_last_checkpoint_reach_the_status_while_training(uninterrupted: Run) -> None:
    assert uninterrupted.progress_seen, "status.progress never appeared during the run"
    assert uninterrupted.status["progress"]["totalSteps"] == STEPS
    assert all(0 < step <= STEPS for step in uninterrupted.progress_seen)
    assert uninterrupted.checkpoints_seen and all(
        step % INTERVAL == 0 for step in uninterrupted.checkpoints_seen
    )


def test_restarting_the_operator_mid_training_disturbs_nothing(uninterrupted: Run) -> None:
    status = uninterrupted.status
    assert status["phase"] == "Succeeded"
    assert status.get("attempt", 0) == 0
    assert status["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}
    # The same two pods before and after: none recreated, none duplicated.
    assert status["pods_after"] == status["pods_before_operator_restart"]
    assert sorted(status["pods_after"]) == ["plain-worker-0", "plain-worker-1"]


def test_an_evicted_job_resumes_from_checkpoint_with_the_same_losses(
    cluster: Cluster, e2e_namespace: str, real_node: RealNode, operator: OperatorProcess, uninterrupted: Run,
    tmp_path: Path,
) -> None:  # fmt: skip
    name = "evicted"
    cluster.apply(job_manifests(name, real_node, tmp_path, steps=STEPS, interval=INTERVAL), e2e_namespace)
    wait_for_step(real_node, e2e_namespace, name, 0, STEPS // 3, timeout=RUN_TIMEOUT)

    evict(cluster, e2e_namespace, f"{name}-worker-1")

    assert wait_job_phase(cluster, e2e_namespace, name, ("Succeeded", "Failed"), RUN_TIMEOUT) == "Succeeded"
    status = job_status(cluster, e2e_namespace, name)
    assert status["restarts"] == {"failures": 0, "preemptions": 1, "hangs": 0}
    first, second = rank0_attempts(real_node, e2e_namespace, name)
    assert first.preempted_at is not None, "rank 0 did not checkpoint on SIGTERM"
    assert second.resumed_from is not None and second.finished
    lost = first.last_step - second.resumed_from
    assert lost == 0  # the SIGTERM checkpoint fits the 30 s grace period: nothing is redone
    reference = uninterrupted.losses(0)
    resumed = {step: record.loss for step, record in second.steps.items()}
    assert sorted(resumed) == list(range(second.resumed_from + 1, STEPS + 1))
    # Rank 0 logs the all-reduced loss rounded to 5 decimals. Weights resume bitwise (the checkpoint
    # CLI tests compare every tensor), but the 4-rank gloo reduction of the loss can differ in its
    # last ulp between runs, which now and then flips the last logged digit: allow one unit of it.
    mismatched = {
        step: (loss, reference[step])
        for step, loss in resumed.items()
        if abs(loss - reference[step]) > 1.5e-5
    }
    assert mismatched == {}
    assert_recovery_timeline(cluster, e2e_namespace, name, status, attempt=1, reason="Preempted")
    print(f"\nfull-restart eviction recovery: {status['lastRecovery']['summary']}")
    ledger = assert_goodput_books_every_second({**status, **job_times(cluster, e2e_namespace, name)})
    assert ledger["recoverySeconds"] > 0 and device_seconds(ledger, "redoneSteps") == 0  # no step lost


def assert_recovery_timeline(
    cluster: Cluster, namespace: str, name: str, status: dict[str, Any], attempt: int, reason: str,
    path: str = "FullRestart",
) -> None:  # fmt: skip
    """status.lastRecovery holds every phase, in order, and a Recovered event tells the total."""
    recovery = status["lastRecovery"]
    assert (recovery["attempt"], recovery["reason"], recovery["path"]) == (attempt, reason, path)
    phases = recovery["phasesMilliseconds"]
    assert set(phases) == set(PHASES), recovery
    ordered = [phases[phase] for phase in PHASES]
    assert ordered == sorted(ordered) and ordered[0] >= 0 and ordered[-1] > 0, recovery
    assert recovery["summary"].startswith(f"recovered in {phases['firstStep'] / 1000:.1f}s ({reason}")
    events = cluster.get_json("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")
    assert recovery["summary"] in [e["message"] for e in events["items"] if e["reason"] == "Recovered"]


def test_a_sigkilled_worker_resumes_from_the_last_periodic_checkpoint(
    cluster: Cluster, e2e_namespace: str, real_node: RealNode, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = "killed"
    # A short grace period: the surviving pod cannot checkpoint with a dead peer and is killed after it.
    cluster.apply(
        # Twice the usual run: the kill comes after a checkpoint and a step the operator has read.
        job_manifests(name, real_node, tmp_path, steps=2 * STEPS, interval=INTERVAL, grace=5, procs=1),
        e2e_namespace,
    )
    wait_for_step(real_node, e2e_namespace, name, 0, INTERVAL + INTERVAL // 2, timeout=RUN_TIMEOUT)
    # Saves are asynchronous: on a loaded machine the first one may still be committing. The test is
    # about resuming from a committed checkpoint, so it kills once one exists.
    wait_for(lambda: any(tmp_path.glob("step-*")), timeout=RUN_TIMEOUT, what="a committed checkpoint")
    # The redone steps are booked from the last step the operator read: the kill waits for one (a
    # trainer took two minutes to start once, on a loaded machine; the poller's patience covers five).
    wait_for(lambda: isinstance((job_status(cluster, e2e_namespace, name).get("progress") or {}).get("step"), int),
             timeout=RUN_TIMEOUT, what="a step in status.progress")  # fmt: skip

    uid = pod_uids(cluster, e2e_namespace, name)[f"{name}-worker-1"]
    pgid = int((real_node.state_dir / "pods" / uid / "trainer.pid").read_text())
    os.killpg(pgid, signal.SIGKILL)  # the whole pod at once: no process lives to save anything
    committed_at_kill = max((int(d.name.removeprefix("step-")) for d in tmp_path.glob("step-*")), default=0)

    assert wait_job_phase(cluster, e2e_namespace, name, ("Succeeded", "Failed"), RUN_TIMEOUT) == "Succeeded"
    status = job_status(cluster, e2e_namespace, name)
    assert status["restarts"]["failures"] == 1
    first, second = rank0_attempts(real_node, e2e_namespace, name)[:2]
    assert first.preempted_at is None  # no checkpoint on the way out
    assert second.resumed_from is not None and second.resumed_from % INTERVAL == 0 and second.resumed_from > 0
    # Resume comes from the newest checkpoint complete when the pod died (or one committed just after,
    # if its save had finished on every rank). Saves are asynchronous with at most one in flight, so
    # that checkpoint is at most two intervals behind the last step trained.
    assert second.resumed_from >= committed_at_kill
    assert 0 <= first.last_step - second.resumed_from < 2 * INTERVAL
    assert_recovery_timeline(cluster, e2e_namespace, name, status, attempt=1, reason="FailureRestart")
    ledger = assert_goodput_books_every_second({**status, **job_times(cluster, e2e_namespace, name)})
    recovery = status["lastRecovery"]
    assert recovery["resumedFromStep"] == second.resumed_from
    # Steps reported before the kill and past the checkpoint resumed from were trained twice.
    # At the demo's pace (tens of milliseconds a step on one core) that is well under a device-second.
    redone = device_seconds(ledger, "redoneSteps")
    assert (redone > 0) == (recovery["stepAtDisruption"] > recovery["resumedFromStep"]), ledger


IN_PLACE = {"restartStrategy": "InPlace"}


def launcher_of(node: RealNode, pod_uid: str) -> tuple[int, int | None] | None:
    """The pid of the pod's trainer container (the resident launcher) and its start time; None
    once the dev node has removed the pod."""
    try:
        pid = int((node.state_dir / "pods" / pod_uid / "trainer.pid").read_text())
    except FileNotFoundError:
        return None
    return pid, process_start_time(pid)


# After a restart in place the first steps match the uninterrupted run to the logged digit (a restore
# that is off shows at once); later the run drifts in the last bits, growing slowly: measured one or
# two units of the logged 5th decimal from ~50 steps after the resume (in-place eviction, three runs
# of the seventh session), and four (5e-5, ~95 steps after the resume) in a spare takeover in a
# whole-suite run. Full restarts drift by one unit at 2 steps; two uninterrupted runs agree bitwise.
# The workers of a kept pod or a spare are forked from a warm launcher: their float arithmetic
# differs in the last bits somewhere (cause not found; thread counts ruled out). Open in the
# recovery issue.
EXACT_STEPS_AFTER_RESUME = 20
LOGGED_DIGIT = 1.5e-5
IN_PLACE_DRIFT = 1e-4


def resumed_mismatches(
    resumed: dict[int, float], reference: dict[int, float], resumed_from: int
) -> dict[int, tuple[float, float]]:
    """Steps whose loss is further from the uninterrupted run's than the tolerance above allows."""
    settled = resumed_from + EXACT_STEPS_AFTER_RESUME
    return {
        s: (loss, reference[s])
        for s, loss in resumed.items()
        if abs(loss - reference[s]) > (LOGGED_DIGIT if s <= settled else IN_PLACE_DRIFT)
    }


def assert_resumed_in_place_from_the_sigterm_checkpoint(
    real_node: RealNode, namespace: str, name: str, uninterrupted: Run
) -> None:
    """Rank 0 checkpointed on its peer's SIGTERM, its second generation resumed from that very step
    (nothing redone) and trained to the end with the uninterrupted run's losses: exact for the first
    steps (a restore that is off shows at once), then within the forked-worker drift (IN_PLACE_DRIFT;
    a spare's workers are forked from a warm launcher too, as a kept pod's are)."""
    first, second = rank0_generations(real_node, namespace, name)
    assert first.preempted_at is not None, "rank 0 did not checkpoint on the peer's SIGTERM"
    assert second.resumed_from == first.last_step and second.finished  # nothing redone
    resumed = {step: record.loss for step, record in second.steps.items()}
    assert sorted(resumed) == list(range(second.resumed_from + 1, STEPS + 1))
    assert resumed_mismatches(resumed, uninterrupted.losses(0), second.resumed_from) == {}


def pods_seen_until_finished(cluster: Cluster, namespace: str, name: str, timeout: float) -> set[str]:
    """The uid of every pod of the job seen, sampled every second until it finishes."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen |= set(pod_uids(cluster, namespace, name).values())
        if job_status(cluster, namespace, name).get("phase") in ("Succeeded", "Failed"):
            return seen
        time.sleep(1.0)
    raise AssertionError(f"{name} did not finish in {timeout:.0f}s; last status: "
                         f"{job_status(cluster, namespace, name)}")  # fmt: skip


def world_size_of(cluster: Cluster, namespace: str, pod: str) -> str:
    trainer = cluster.get_json("pod", pod, "-n", namespace)["spec"]["containers"][0]
    return str(next(e["value"] for e in trainer["env"] if e["name"] == "WORLD_SIZE"))


def test_an_evicted_worker_is_replaced_in_place_and_the_survivor_keeps_its_pod(
    cluster: Cluster, e2e_namespace: str, real_node: RealNode, operator: OperatorProcess, uninterrupted: Run,
    tmp_path: Path,
) -> None:  # fmt: skip
    """restartStrategy InPlace: only the evicted pod is replaced; worker-0 is the same pod, the same
    launcher process, and training resumes from the SIGTERM checkpoint with the same losses."""
    name = "inplace"
    cluster.apply(job_manifests(name, real_node, tmp_path, steps=STEPS, interval=INTERVAL, run_policy=IN_PLACE),
                  e2e_namespace)  # fmt: skip
    # What is compared after comes first: 160 steps take about 12 s, and on a loaded machine these
    # reads took long enough for the run to end before the eviction came.
    wait_for_step(real_node, e2e_namespace, name, 0, 1, timeout=RUN_TIMEOUT)
    before = pod_uids(cluster, e2e_namespace, name)
    world_size = world_size_of(cluster, e2e_namespace, f"{name}-worker-1")
    launcher = launcher_of(real_node, before[f"{name}-worker-0"])
    assert launcher is not None and launcher[1] is not None

    wait_for_step(real_node, e2e_namespace, name, 0, INTERVAL, timeout=RUN_TIMEOUT)
    evict(cluster, e2e_namespace, f"{name}-worker-1")
    wait_for_generation_step(real_node, e2e_namespace, name, 1, INTERVAL + 5, timeout=RUN_TIMEOUT)
    # The launcher that trained generation 0 forked generation 1: same pid, same start time.
    assert launcher_of(real_node, before[f"{name}-worker-0"]) == launcher, "worker-0's launcher is gone"
    seen = pods_seen_until_finished(cluster, e2e_namespace, name, RUN_TIMEOUT)

    status = job_status(cluster, e2e_namespace, name)
    assert status["phase"] == "Succeeded", status
    assert restart_counts(status) == {"failures": 0, "preemptions": 1, "hangs": 0}
    after = pod_uids(cluster, e2e_namespace, name)
    assert after[f"{name}-worker-0"] == before[f"{name}-worker-0"]  # the survivor was never deleted
    assert after[f"{name}-worker-1"] != before[f"{name}-worker-1"]
    assert seen | set(before.values()) == {*before.values(), after[f"{name}-worker-1"]}  # one new pod
    assert world_size_of(cluster, e2e_namespace, f"{name}-worker-1") == world_size
    assert_resumed_in_place_from_the_sigterm_checkpoint(real_node, e2e_namespace, name, uninterrupted)
    assert_recovery_timeline(
        cluster, e2e_namespace, name, status, attempt=1, reason="Preempted", path="InPlace"
    )
    print(f"\nin-place eviction recovery: {status['lastRecovery']['summary']}")


def test_a_sigkilled_worker_is_replaced_in_place_from_the_last_periodic_checkpoint(
    cluster: Cluster, e2e_namespace: str, real_node: RealNode, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = "inplace-killed"
    cluster.apply(
        job_manifests(name, real_node, tmp_path, steps=STEPS, interval=INTERVAL, grace=5, procs=1,
                      run_policy=IN_PLACE),
        e2e_namespace,
    )  # fmt: skip
    wait_for_step(real_node, e2e_namespace, name, 0, INTERVAL + INTERVAL // 2, timeout=RUN_TIMEOUT)
    wait_for(lambda: any(tmp_path.glob("step-*")), timeout=RUN_TIMEOUT, what="a committed checkpoint")
    before = pod_uids(cluster, e2e_namespace, name)
    launcher = launcher_of(real_node, before[f"{name}-worker-0"])
    assert launcher is not None and launcher[1] is not None

    pgid = int((real_node.state_dir / "pods" / before[f"{name}-worker-1"] / "trainer.pid").read_text())
    os.killpg(pgid, signal.SIGKILL)  # the whole pod at once: no process lives to save anything
    committed_at_kill = max((int(d.name.removeprefix("step-")) for d in tmp_path.glob("step-*")), default=0)
    wait_for_generation_step(real_node, e2e_namespace, name, 1, committed_at_kill + 1, timeout=RUN_TIMEOUT)
    assert launcher_of(real_node, before[f"{name}-worker-0"]) == launcher, "worker-0's launcher is gone"

    assert wait_job_phase(cluster, e2e_namespace, name, ("Succeeded", "Failed"), RUN_TIMEOUT) == "Succeeded"
    status = job_status(cluster, e2e_namespace, name)
    assert restart_counts(status) == {"failures": 1, "preemptions": 0, "hangs": 0}
    after = pod_uids(cluster, e2e_namespace, name)
    assert after[f"{name}-worker-0"] == before[f"{name}-worker-0"]
    assert after[f"{name}-worker-1"] != before[f"{name}-worker-1"]
    first, second = rank0_generations(real_node, e2e_namespace, name)[:2]
    assert first.preempted_at is None  # no checkpoint on the way out: the peer died mid-step
    assert second.resumed_from is not None and second.resumed_from % INTERVAL == 0 and second.resumed_from > 0
    assert second.resumed_from >= committed_at_kill and second.finished
    assert 0 <= first.last_step - second.resumed_from < 2 * INTERVAL
    assert_recovery_timeline(cluster, e2e_namespace, name, status, attempt=1, reason="FailureRestart",
                             path="InPlace")  # fmt: skip
    print(f"\nin-place SIGKILL recovery: {status['lastRecovery']['summary']}")


def launcher_state(cluster: Cluster, namespace: str, pod: str) -> str | None:
    """What the pod's resident launcher says it is doing (GET /generation), None when it does not
    answer (its imports are not done) or the pod does not exist yet."""
    import urllib.request

    found = cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        return None  # not created yet
    ip = (json.loads(found.stdout).get("status") or {}).get("podIP")
    if not ip:
        return None
    try:
        with urllib.request.urlopen(f"http://{ip}:9399/generation", timeout=2) as answer:
            return str(json.loads(answer.read())["state"])
    except OSError:
        return None


def wait_for_spare_created(cluster: Cluster, namespace: str, name: str) -> None:
    """Spares come once the workers are admitted (best effort), a moment after the gang."""
    wait_for(lambda: f"{name}-spare-0" in pod_uids(cluster, namespace, name), timeout=RUN_TIMEOUT, interval=0.5,
             what="the spare created once the workers are admitted")  # fmt: skip


def test_a_warm_spare_takes_the_evicted_rank_and_no_worker_pod_is_created(
    cluster: Cluster, e2e_namespace: str, real_node: RealNode, operator: OperatorProcess, uninterrupted: Run,
    tmp_path: Path,
) -> None:  # fmt: skip
    """spec.spares: 1. worker-1 is evicted; the spare standing by (imports done) takes rank 1 at
    once: worker-0 and the spare keep their pods (same uids), no worker pod is created, a new spare
    is, and training resumes from the SIGTERM checkpoint with the uninterrupted run's losses."""
    name = "spare"
    manifests = job_manifests(name, real_node, tmp_path, steps=STEPS, interval=INTERVAL, run_policy=IN_PLACE)
    manifests[1]["spec"]["spares"] = 1
    cluster.apply(manifests, e2e_namespace)
    wait_for_step(real_node, e2e_namespace, name, 0, 1, timeout=RUN_TIMEOUT)
    wait_for_spare_created(cluster, e2e_namespace, name)
    before = pod_uids(cluster, e2e_namespace, name)
    assert sorted(before) == [f"{name}-spare-0", f"{name}-worker-0", f"{name}-worker-1"]
    launcher = launcher_of(real_node, before[f"{name}-worker-0"])
    assert launcher is not None and launcher[1] is not None
    # The dev node runs no readiness probe (it reports a pod Ready once its processes start): the
    # test waits for the spare's launcher itself, as the probe would on a kubelet.
    wait_for(lambda: launcher_state(cluster, e2e_namespace, f"{name}-spare-0") == "spare", timeout=RUN_TIMEOUT,
             interval=0.5, what="the spare standing by, imports done")  # fmt: skip

    wait_for_step(real_node, e2e_namespace, name, 0, INTERVAL, timeout=RUN_TIMEOUT)
    evict(cluster, e2e_namespace, f"{name}-worker-1")
    wait_for_generation_step(real_node, e2e_namespace, name, 1, INTERVAL + 5, timeout=RUN_TIMEOUT)
    assert launcher_of(real_node, before[f"{name}-worker-0"]) == launcher, "worker-0's launcher is gone"
    seen = pods_seen_until_finished(cluster, e2e_namespace, name, RUN_TIMEOUT)

    status = job_status(cluster, e2e_namespace, name)
    assert status["phase"] == "Succeeded", status
    assert restart_counts(status) == {"failures": 0, "preemptions": 1, "hangs": 0}
    after = cluster.get_json("pods", "-n", e2e_namespace, "-l", f"phalanx.dev/job-name={name}")["items"]
    by_name = {p["metadata"]["name"]: p for p in after}
    for survivor in (f"{name}-worker-0", f"{name}-spare-0"):
        assert by_name[survivor]["metadata"]["uid"] == before[survivor], survivor  # never replaced
    assert by_name[f"{name}-spare-0"]["metadata"]["labels"]["phalanx.dev/replica-index"] == "1"
    assert by_name[f"{name}-spare-0"]["status"]["phase"] == "Succeeded"  # it trained rank 1 to the end
    # No worker pod was created: the only new pod was the spare made in the background.
    new = seen - set(before.values())
    assert len(new) == 1, new  # the new spare; worker-1 below is either gone or the evicted pod
    assert (
        f"{name}-worker-1" not in by_name
        or by_name[f"{name}-worker-1"]["metadata"]["uid"] == before[f"{name}-worker-1"]
    )
    spare_log = real_node.log(e2e_namespace, f"{name}-spare-0", "trainer")
    assert '"event": "launcher_spare"' in spare_log, spare_log[-2000:]
    assert_resumed_in_place_from_the_sigterm_checkpoint(real_node, e2e_namespace, name, uninterrupted)
    assert_recovery_timeline(
        cluster, e2e_namespace, name, status, attempt=1, reason="Preempted", path="InPlaceSpare"
    )
    print(f"\nspare takeover recovery: {status['lastRecovery']['summary']}")


def test_an_idle_spare_evicted_is_replaced_without_disturbing_training(
    cluster: Cluster, e2e_namespace: str, real_node: RealNode, operator: OperatorProcess, uninterrupted: Run,
    tmp_path: Path,
) -> None:  # fmt: skip
    """spec.spares: 1. The spare is evicted while it stands by: a new spare is created, and training
    goes on untouched: one attempt, one generation, no restart counted, the workers' pods and
    launchers unchanged, every loss equal to the uninterrupted run's."""
    name = "idlespare"
    manifests = job_manifests(name, real_node, tmp_path, steps=STEPS, interval=INTERVAL, run_policy=IN_PLACE)
    manifests[1]["spec"]["spares"] = 1
    # 0.15 s of sleep before each forward of rank 0 (a test hook that changes no number): the 160
    # steps last long enough for the spare's imports, its eviction and its successor's admission.
    trainer = manifests[1]["spec"]["template"]["spec"]["containers"][0]
    trainer.setdefault("env", []).append({"name": "PHALANX_FAULT_SLOW_RANK", "value": "0:0.15"})
    cluster.apply(manifests, e2e_namespace)
    wait_for_step(real_node, e2e_namespace, name, 0, 1, timeout=RUN_TIMEOUT)
    wait_for_spare_created(cluster, e2e_namespace, name)
    before = pod_uids(cluster, e2e_namespace, name)
    launcher = launcher_of(real_node, before[f"{name}-worker-0"])
    assert launcher is not None
    wait_for(lambda: launcher_state(cluster, e2e_namespace, f"{name}-spare-0") == "spare", timeout=RUN_TIMEOUT,
             interval=0.5, what="the spare standing by, imports done")  # fmt: skip
    assert job_status(cluster, e2e_namespace, name).get("phase") == "Running"
    evict(cluster, e2e_namespace, f"{name}-spare-0")

    def successor_admitted() -> bool:
        """A new spare (its number may be the evicted one's again once that pod is gone) is admitted."""
        spares = cluster.get_json(
            "pods", "-n", e2e_namespace, "-l", f"phalanx.dev/job-name={name},phalanx.dev/spare=true"
        )
        return any(
            p["metadata"]["uid"] not in before.values() and p["spec"].get("nodeName") for p in spares["items"]
        )

    wait_for(successor_admitted, timeout=60, interval=0.5, what="a new spare admitted")
    assert job_status(cluster, e2e_namespace, name).get("phase") == "Running"  # training went on meanwhile
    assert launcher_of(real_node, before[f"{name}-worker-0"]) == launcher  # the same launcher process
    seen = pods_seen_until_finished(cluster, e2e_namespace, name, RUN_TIMEOUT)

    status = job_status(cluster, e2e_namespace, name)
    assert status["phase"] == "Succeeded" and status["attempt"] == 0, status
    assert restart_counts(status) == {"failures": 0, "preemptions": 0, "hangs": 0}
    assert "lastRecovery" not in status and "inPlace" not in status
    ledger = assert_goodput_books_every_second({**status, **job_times(cluster, e2e_namespace, name)})
    assert device_seconds(ledger, "standbySpares") > 0, ledger  # the spares' devices, held, not trained
    after = pod_uids(cluster, e2e_namespace, name)
    for worker in (f"{name}-worker-0", f"{name}-worker-1"):
        assert after[worker] == before[worker], worker
    assert len(seen - set(before.values())) == 1  # the new spare, nothing else
    selector = f"involvedObject.kind=TrainingJob,involvedObject.name={name}"  # not its Service's
    events = cluster.get_json("events", "-n", e2e_namespace, "--field-selector", selector)
    reasons = [(e["type"], e["reason"]) for e in events["items"]]
    # Straggler: rank 0, slowed on purpose above, is one; any other warning would be a disturbance.
    warnings = [r for r in reasons if r[0] == "Warning" and r[1] != "Straggler"]
    assert ("Normal", "SpareReplaced") in reasons and not warnings, reasons
    [only] = rank0_generations(real_node, e2e_namespace, name)  # one generation, never restarted
    assert only.finished and only.resumed_from in (None, 0)
    reference = uninterrupted.losses(0)
    losses = {step: record.loss for step, record in only.steps.items()}
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert {s: (loss, reference[s]) for s, loss in losses.items() if abs(loss - reference[s]) > 1.5e-5} == {}


def test_a_job_whose_command_exits_1_fails_after_its_backoff_limit(
    cluster: Cluster, e2e_namespace: str, real_node: RealNode, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = "broken"
    command = ["python", "-c", "import sys; print('bad config'); sys.exit(1)"]
    manifests = job_manifests(name, real_node, tmp_path, command=command, backoff_limit=1, procs=1,
                              run_policy={"retryableExitCodes": [1]})  # fmt: skip
    cluster.apply(manifests, e2e_namespace)

    assert wait_job_phase(cluster, e2e_namespace, name, ("Succeeded", "Failed"), timeout=120) == "Failed"
    status = job_status(cluster, e2e_namespace, name)
    assert status["restarts"]["failures"] == 1  # backoffLimit restarts, then the verdict
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and "exited with code 1" in failed["message"]
    assert "bad config" in real_node.log(e2e_namespace, f"{name}-worker-0", "trainer")
    time.sleep(2)  # let the agent reap whatever a leak would leave
    assert running_processes_of(real_node, e2e_namespace, name) == []
    phases = cluster.get_json("pods", "-n", e2e_namespace, "-l", f"phalanx.dev/job-name={name}")["items"]
    assert all(p["status"].get("phase") in ("Succeeded", "Failed") for p in phases)
