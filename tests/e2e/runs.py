"""Real training jobs on the dev node for the e2e tests: manifests, waiting, evicting, reading logs."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from phalanx.demo import ATTEMPT_HEADER, Attempt, parse_trainer_log
from phalanx.ports import free_port
from tests.conftest import Cluster, RealNode, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINER_CONFIG = REPO_ROOT / "examples" / "demo-trainer.yaml"
DEMO_JOB = REPO_ROOT / "examples" / "demo-trainingjob.yaml"
POD_CPU = 0.5  # what each of the demo job's pods asks for (examples/demo-trainingjob.yaml)


def job_manifests(
    name: str,
    node: RealNode,
    checkpoint_dir: Path,
    *,
    steps: int = 100,
    interval: int = 20,
    replicas: int = 2,
    procs: int = 2,
    grace: int = 30,
    backoff_limit: int = 2,
    command: list[str] | None = None,
    run_policy: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The demo job of examples/, shortened and pinned to this session's dev node."""
    config_map, job = copy.deepcopy(list(yaml.safe_load_all(DEMO_JOB.read_text())))
    config_map["metadata"]["name"] = f"{name}-config"
    config_map["data"] = {"trainer.yaml": TRAINER_CONFIG.read_text()}
    spec = job["spec"]
    job["metadata"]["name"] = name
    spec["replicas"], spec["procsPerReplica"] = replicas, procs
    spec["checkpoint"]["volume"] = {"hostPath": {"path": str(checkpoint_dir), "type": "DirectoryOrCreate"}}
    spec["checkpoint"]["intervalSteps"] = interval
    spec["rendezvous"]["port"] = free_port()  # 29500 may be taken by any other program on the machine
    spec["runPolicy"] = {
        "backoffLimit": backoff_limit,
        "terminationGracePeriodSeconds": grace,
        **(run_policy or {}),
    }
    pod_spec = spec["template"]["spec"]
    pod_spec.update(node.placement())
    pod_spec["volumes"][0]["configMap"]["name"] = config_map["metadata"]["name"]
    trainer = pod_spec["containers"][0]
    trainer["args"] = [*trainer["args"], f"job.steps={steps}"]
    if command is not None:
        trainer["command"], trainer["args"] = command, []
    return [config_map, job]


def job_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = cluster.get_json("trainingjob", name, "-n", namespace).get("status") or {}
    return status


def restart_counts(status: dict[str, Any]) -> dict[str, int]:
    """status.restarts with every cause, a missing one as 0 (the API server defaults new ones)."""
    restarts = status.get("restarts") or {}
    return {cause: int(restarts.get(cause) or 0) for cause in ("failures", "preemptions", "hangs")}


def wait_job_phase(
    cluster: Cluster, namespace: str, name: str, phases: tuple[str, ...], timeout: float
) -> str:
    phase: str = wait_for(
        lambda: (p := job_status(cluster, namespace, name).get("phase")) in phases and p,
        timeout=timeout,
        interval=1.0,
        what=f"TrainingJob {name} in {phases}",
    )
    return phase


def rank0_attempts(node: RealNode, namespace: str, job: str) -> list[Attempt]:
    return parse_trainer_log(node.log(namespace, f"{job}-worker-0", "trainer"))


def rank0_generations(node: RealNode, namespace: str, job: str) -> list[Attempt]:
    """Rank 0's runs, one per restart generation: a pod kept in place (restartStrategy InPlace)
    starts no new container, its launcher forks new workers, whose rank 0 logs `group_ready` first."""
    lines: list[str] = []
    started = False  # whether the run being read has logged anything after its start
    for line in node.log(namespace, f"{job}-worker-0", "trainer").splitlines():
        if line.startswith(ATTEMPT_HEADER):
            started = False
        elif '"event": "group_ready"' in line and started:
            lines.append(f"{ATTEMPT_HEADER}(same pod: next restart generation)")
            started = False
        elif line.startswith("{"):
            started = started or '"event": "progress"' in line or '"event": "resumed"' in line
        lines.append(line)
    return parse_trainer_log("\n".join(lines))


def wait_for_generation_step(
    node: RealNode, namespace: str, job: str, generation: int, step: int, timeout: float
) -> None:
    """Waits until rank 0 of restart `generation` logged `step` or later."""

    def reached() -> bool:
        runs = rank0_generations(node, namespace, job)
        return len(runs) > generation and runs[generation].last_step >= step and bool(runs[generation].steps)

    wait_for(reached, timeout=timeout, interval=0.5, what=f"{job} generation {generation} at step {step}")


def process_start_time(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (/proc/<pid>/stat), None if gone:
    the same pid and start time is the same process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def wait_for_step(node: RealNode, namespace: str, job: str, attempt: int, step: int, timeout: float) -> float:
    """Waits until rank 0 of `attempt` logged `step` or later; returns the monotonic time it was seen."""

    def reached() -> bool:
        attempts = rank0_attempts(node, namespace, job)
        return (
            len(attempts) > attempt and attempts[attempt].last_step >= step and bool(attempts[attempt].steps)
        )

    wait_for(reached, timeout=timeout, interval=0.2, what=f"{job} attempt {attempt} at step {step}")
    return time.monotonic()


def evict(cluster: Cluster, namespace: str, pod: str) -> None:
    """The Eviction API, as `kubectl drain` and cluster autoscalers use it (PodDisruptionBudgets apply)."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    core.create_namespaced_pod_eviction(pod, namespace, body)


def pod_uids(cluster: Cluster, namespace: str, job: str) -> dict[str, str]:
    pods = cluster.get_json("pods", "-n", namespace, "-l", f"phalanx.dev/job-name={job}")["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def running_processes_of(node: RealNode, namespace: str, job: str) -> list[int]:
    """Pids whose environment names one of the job's pods (what a leak would leave behind)."""
    marker = f"PHALANX_JOB_NAME={job}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ and f"NSS_WRAPPER_HOSTS={node.state_dir / 'hosts'}".encode() in environ:
            found.append(int(proc.name))
    return found


@dataclass
class Run:
    """What a test observed of one job."""

    name: str
    namespace: str
    attempts: list[Attempt] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    progress_seen: list[int] = field(default_factory=list)  # status.progress.step, sampled while running
    checkpoints_seen: list[int] = field(default_factory=list)  # status.lastCheckpoint.step, likewise

    def losses(self, attempt: int) -> dict[int, float]:
        return {step: record.loss for step, record in self.attempts[attempt].steps.items()}


def millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def unfinished_pods(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    """The pods bound to `node` that still hold their requests: any phase but Succeeded or Failed,
    terminating ones included (the scheduler counts them until they are gone)."""
    pods: list[dict[str, Any]] = cluster.get_json("pods", "-A", "--field-selector", f"spec.nodeName={node}")[
        "items"
    ]
    return [p for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]


def free_millicores(cluster: Cluster, node: str) -> int:
    allocatable = millicores(cluster.get_json("node", node)["status"]["allocatable"]["cpu"])
    asked = sum(
        millicores(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
        for p in unfinished_pods(cluster, node)
        for c in p["spec"]["containers"]
    )
    return allocatable - asked


def wait_node_free_of_others(cluster: Cluster, node: str, namespace: str, timeout: float = 120.0) -> None:
    """Until no pod outside `namespace` holds room on `node`: the pods of an earlier test, still
    terminating, would free their room later and make room sized now too large."""

    def others() -> list[str]:
        return [
            f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for p in unfinished_pods(cluster, node)
            if p["metadata"]["namespace"] != namespace
        ]

    try:
        wait_for(lambda: not others(), timeout=timeout, what=f"no other test's pod left on {node}")
    except AssertionError as err:
        raise AssertionError(f"{err}; still there: {others()}") from None


def blocker(node: RealNode, cpu_millicores: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "blocker"},
        "spec": {
            **node.placement(),
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "sleep", "image": "python",
                "command": ["python", "-c", "import time; time.sleep(3600)"],
                "resources": {"requests": {"cpu": f"{cpu_millicores}m", "memory": "16Mi"}},
            }],
        },
    }  # fmt: skip
