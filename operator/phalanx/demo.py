"""`make demo`: a real training job through the operator, preempted half way and recovered.

Brings up the local control plane with one dev node (pods run as local processes), installs the CRD,
starts the operator, submits examples/demo-trainingjob.yaml, shows live progress, evicts a worker
through the Eviction API about half way, shows the gang restart and the resume from checkpoint,
prints a summary and writes a loss curve with the preemption marked. docs/demo.md walks through it.

The first half of this file is pure (reading the trainer's log, summarising a run); the e2e tests
and bench/recovery_bench.py use it too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from phalanx.devnode.preflight import PreflightError
from phalanx.ports import free_port

ATTEMPT_HEADER = "--- pod uid "  # the dev node writes one before each container start
REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_JOB = REPO_ROOT / "examples" / "demo-trainingjob.yaml"


# -- reading a run (pure) ----------------------------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    step: int
    loss: float
    tokens_per_second: float
    eta_seconds: float
    step_seconds: float  # data wait + forward/backward + optimizer, as the trainer measured it
    logged_at: float | None = None  # the progress line's time (epoch seconds, ms resolution)


@dataclass
class Attempt:
    """One start of rank 0's container: the steps it ran and how it began and ended."""

    steps: dict[int, StepRecord] = field(default_factory=dict)
    resumed_from: int | None = None
    preempted_at: int | None = None
    finished: bool = False

    @property
    def last_step(self) -> int:
        return max(self.steps, default=self.resumed_from or 0)

    @property
    def first_step(self) -> int | None:
        return min(self.steps, default=None)


def _epoch_seconds(stamp: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return None


def parse_trainer_log(text: str) -> list[Attempt]:
    """Rank 0's JSON events, split into attempts at the dev node's container-start headers."""
    attempts: list[Attempt] = []
    for line in text.splitlines():
        if line.startswith(ATTEMPT_HEADER):
            attempts.append(Attempt())
            continue
        if not line.startswith("{") or not attempts:
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        current = attempts[-1]
        kind = event.get("event")
        if kind == "progress":
            step = int(event["step"])
            step_seconds = sum(
                float(event.get(k, 0.0)) for k in ("data_wait_s", "forward_backward_s", "optimizer_s")
            )
            current.steps[step] = StepRecord(
                step,
                float(event["loss"]),
                float(event.get("tokens_per_second", 0.0)),
                float(event.get("eta_seconds", 0.0)),
                step_seconds,
                _epoch_seconds(event.get("time")),
            )
        elif kind == "resumed":
            current.resumed_from = int(event["step"])
        elif kind == "preempted":
            current.preempted_at = int(event["step"])
        elif kind == "finished":
            current.finished = True
    return attempts


def lost_steps(attempts: Sequence[Attempt]) -> list[int]:
    """Per restart: steps the earlier attempt ran that the next one had to run again."""
    lost = []
    for before, after in zip(attempts, attempts[1:], strict=False):
        resumed = after.resumed_from or 0
        lost.append(max(0, before.last_step - resumed))
    return lost


def kept_steps(attempts: Sequence[Attempt]) -> dict[int, StepRecord]:
    """The steps the final model is made of: where attempts overlap, the later one's."""
    kept: dict[int, StepRecord] = {}
    for attempt in attempts:
        resumed = attempt.resumed_from or 0
        for step in [s for s in kept if s > resumed]:
            del kept[step]
        kept.update(attempt.steps)
    return kept


@dataclass(frozen=True)
class RunSummary:
    steps: int
    final_loss: float | None
    restarts: int
    lost_steps: list[int]
    recover_seconds: list[float]
    elapsed_seconds: float
    useful_seconds: float

    @property
    def goodput(self) -> float:
        return self.useful_seconds / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "final_loss": self.final_loss,
            "restarts": self.restarts,
            "lost_steps": self.lost_steps,
            "recover_seconds": [round(s, 2) for s in self.recover_seconds],
            "elapsed_seconds": round(self.elapsed_seconds, 2),
            "useful_seconds": round(self.useful_seconds, 2),
            "goodput": round(self.goodput, 4),
        }


def summarize(
    attempts: Sequence[Attempt], elapsed_seconds: float, recover_seconds: Sequence[float]
) -> RunSummary:
    """Goodput counts only the step time of kept steps as useful: waiting, restarts and redone work are not."""
    kept = kept_steps(attempts)
    final = kept[max(kept)].loss if kept else None
    return RunSummary(
        steps=max(kept, default=0),
        final_loss=final,
        restarts=max(0, len(attempts) - 1),
        lost_steps=lost_steps(attempts),
        recover_seconds=list(recover_seconds),
        elapsed_seconds=elapsed_seconds,
        useful_seconds=sum(record.step_seconds for record in kept.values()),
    )


def format_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def progress_line(
    phase: str, attempt: int, record: StepRecord | None, total: int, checkpoint: int | None
) -> str:
    if record is None:
        return f"[{phase:<10}] attempt {attempt}: waiting for the first step"
    percent = 100 * record.step // max(total, 1)
    bar = "#" * (percent // 5) + "." * (20 - percent // 5)
    saved = f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint yet"
    return (
        f"[{phase:<10}] attempt {attempt} [{bar}] step {record.step}/{total} loss {record.loss:.4f} "
        f"{record.tokens_per_second:,.0f} tok/s ETA {format_eta(record.eta_seconds)} | {saved}"
    )


# -- running the demo (I/O) --------------------------------------------------------------------

NAMESPACE = "phalanx-demo"
JOB = "demo-gpt"
EVICTED_POD = f"{JOB}-worker-1"


def newest_checkpoint_on_disk(directory: Path) -> int | None:
    """The trainer's step-NNNNNNNN directories, read while the operator has not reported one yet."""
    steps = [int(p.name[5:]) for p in directory.glob("step-*") if p.name[5:].isdigit()]
    return max(steps, default=None)


class Demo:
    def __init__(
        self, out_dir: Path, state_dir: Path, print_line: Callable[[str], None], namespace: str = NAMESPACE
    ) -> None:
        from phalanx.devcluster.cluster import LocalCluster

        self.namespace = namespace
        self.log_offset = 0
        self.out_dir = out_dir
        self.cluster = LocalCluster(state_dir, log=lambda msg: None)
        self.say = print_line
        self.operator: subprocess.Popen[bytes] | None = None
        self.kubectl: list[str] = []
        self.api: Any = None
        self.evicted_steps: list[int] = []  # rank 0's step at each eviction, for the plot

    # -- set-up and tear-down ------------------------------------------------------------------
    def up(self) -> None:
        from kubernetes import config

        from phalanx.devcluster.crds import wait_established
        from phalanx.devcluster.realnode import (
            check_real_node_preflight,
            start_real_nodes,
            stop_real_nodes,
            wait_real_nodes_ready,
        )

        check_real_node_preflight()  # before the control plane: a node that cannot resolve names is useless
        if self.cluster.running_components():
            self.say("a demo cluster from an earlier run is still up: stopping it first")
            stop_real_nodes(self.cluster.state_dir)
            self.cluster.down(quiet=True)
        began = time.monotonic()
        kubeconfig = self.cluster.up(pools=())
        state = self.cluster.state()
        assert state is not None
        self.kubectl = [str(Path(state.bin_dir) / "kubectl"), f"--kubeconfig={kubeconfig}"]
        names = start_real_nodes(self.cluster.state_dir, kubeconfig, 1, workdir=REPO_ROOT)
        wait_real_nodes_ready(self.kubectl, names)
        self.api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self._run("apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
        wait_established(self.kubectl, ["trainingjobs.phalanx.dev"])
        log = (self.out_dir / "operator.log").open("wb")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        # The demo's checkpoints live in a hostPath on the one dev node: allowed here, off in the chart.
        argv = [sys.executable, "-m", "phalanx.cli", "operator", "--metrics-port", "0", "--health-port", "0",
                "--allow-host-path-checkpoints"]  # fmt: skip
        self.operator = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.say(
            f"cluster up in {time.monotonic() - began:.0f}s: control plane, dev node {names[0]} "
            f"(pods run as local processes), CRD, operator (log: {self.out_dir / 'operator.log'})"
        )
        self.say(f"  kubectl --kubeconfig {kubeconfig} get tj,pods -n {self.namespace}")

    def down(self) -> None:
        from phalanx.devcluster.realnode import stop_real_nodes

        if self.operator is not None and self.operator.poll() is None:
            self.operator.terminate()
            try:
                self.operator.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.operator.kill()
        stop_real_nodes(self.cluster.state_dir)
        self.cluster.down(quiet=True)

    def _run(self, *args: str, input: str | None = None) -> str:
        out = subprocess.run([*self.kubectl, *args], input=input, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    # -- the job -------------------------------------------------------------------------------
    def submit(
        self,
        steps: int | None = None,
        run_policy: dict[str, Any] | None = None,
        spares: int = 0,
        checkpoint_interval_steps: int | None = None,
    ) -> int:
        """Applies the example with the checkpoint directory moved under the output directory (and
        `run_policy` merged into spec.runPolicy, `spares` as spec.spares when not 0,
        `checkpoint_interval_steps` as spec.checkpoint.intervalSteps when given)."""
        import yaml

        documents = list(yaml.safe_load_all(DEMO_JOB.read_text()))
        checkpoints = self.out_dir / "checkpoints"
        shutil.rmtree(checkpoints, ignore_errors=True)
        job = next(d for d in documents if d["kind"] == "TrainingJob")
        job["spec"]["checkpoint"]["volume"] = {
            "hostPath": {"path": str(checkpoints), "type": "DirectoryOrCreate"}
        }
        if checkpoint_interval_steps is not None:
            job["spec"]["checkpoint"]["intervalSteps"] = checkpoint_interval_steps
        job["spec"]["rendezvous"]["port"] = free_port()
        job["spec"]["runPolicy"] = {**job["spec"].get("runPolicy", {}), **(run_policy or {})}
        if spares:
            job["spec"]["spares"] = spares
        config_map = next(d for d in documents if d["kind"] == "ConfigMap")
        total = int(yaml.safe_load(config_map["data"]["trainer.yaml"])["job"]["steps"])
        if steps is not None:
            trainer = job["spec"]["template"]["spec"]["containers"][0]
            trainer["args"] = [*trainer["args"], f"job.steps={steps}"]
            total = steps
        self.log_offset = len(self.rank0_log(whole=True))  # an earlier run's pods may share the log file
        self._run("create", "namespace", self.namespace)
        self._run("apply", "-n", self.namespace, "-f", "-", input=json.dumps({"kind": "List", "apiVersion": "v1",
                                                                          "items": documents}))  # fmt: skip
        self.say(
            f"submitted TrainingJob {self.namespace}/{JOB}: {job['spec']['replicas']} pods x "
            f"{job['spec']['procsPerReplica']} processes, {total} steps, checkpoint every "
            f"{job['spec']['checkpoint']['intervalSteps']} steps"
        )
        return total

    def job_status(self) -> dict[str, Any]:
        from kubernetes import client

        custom: Any = client.CustomObjectsApi(self.api)
        response = custom.get_namespaced_custom_object(
            "phalanx.dev", "v1alpha1", self.namespace, "trainingjobs", JOB, _preload_content=False
        )
        status: dict[str, Any] = json.loads(response.data).get("status") or {}
        return status

    def evict(self, pod: str) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=self.namespace))
        core.create_namespaced_pod_eviction(pod, self.namespace, body)

    def rank0_log(self, whole: bool = False) -> str:
        """Rank 0's log since this run's submission (the dev node appends across pods of one name)."""
        from phalanx.devcluster.realnode import agent_state_dir, real_node_names

        path = agent_state_dir(self.cluster.state_dir, real_node_names(1)[0]) / "logs"
        log_file = path / f"{self.namespace}_{JOB}-worker-0_trainer.log"
        text = log_file.read_text(errors="replace") if log_file.exists() else ""
        return text if whole else text[self.log_offset :]

    def follow(
        self, total: int, evict_at: float, timeout: float
    ) -> tuple[str, list[Attempt], float, list[float]]:
        """Shows progress until the job finishes; evicts a worker once rank 0 passed `evict_at` x total."""
        began = time.monotonic()
        evicted_at: float | None = None
        recover_seconds: list[float] = []
        last_phase, last_printed, shown_resume = "", 0.0, False
        live = sys.stdout.isatty()
        while time.monotonic() - began < timeout:
            status = self.job_status()
            phase = status.get("phase", "Pending")
            attempts = parse_trainer_log(self.rank0_log())
            if phase != last_phase:
                self._newline(live)
                restarts = status.get("restarts") or {}
                self.say(f"phase {phase} (attempt {status.get('attempt', 0)}, restarts {restarts}) "
                         f"{status.get('message', '')}")  # fmt: skip
                last_phase = phase
            if phase in ("Succeeded", "Failed"):
                self._newline(live)
                return phase, attempts, time.monotonic() - began, recover_seconds
            current = attempts[-1] if attempts else None
            if evicted_at is None and current is not None and current.last_step >= evict_at * total:
                self._newline(live)
                self.say(f">>> step {current.last_step}: evicting {EVICTED_POD} through the Eviction API "
                         "(as a drain or a spot reclaim would)")  # fmt: skip
                self.evict(EVICTED_POD)
                evicted_at = time.monotonic()
                self.evicted_steps.append(current.last_step)
            if evicted_at is not None and len(attempts) >= 2 and attempts[-1].steps and not shown_resume:
                recover_seconds.append(time.monotonic() - evicted_at)
                lost = lost_steps(attempts)[-1]
                self._newline(live)
                self.say(f">>> resumed from the checkpoint at step {attempts[-1].resumed_from}; every rank training "
                         f"again {recover_seconds[-1]:.1f}s after the eviction; lost steps: {lost}")  # fmt: skip
                shown_resume = True
            record = current.steps[current.last_step] if current and current.steps else None
            checkpoint = (status.get("lastCheckpoint") or {}).get("step") or newest_checkpoint_on_disk(
                self.out_dir / "checkpoints"
            )
            line = progress_line(phase, int(status.get("attempt", 0)), record, total, checkpoint)
            if live:
                print("\r" + line[:160].ljust(160), end="", flush=True)
            elif time.monotonic() - last_printed >= 5:
                self.say(line)
                last_printed = time.monotonic()
            time.sleep(0.5)
        raise TimeoutError(f"the demo job did not finish within {timeout:.0f}s")

    @staticmethod
    def _newline(live: bool) -> None:
        if live:
            print(flush=True)


@dataclass(frozen=True)
class PlotMark:
    step: int
    label: str
    kind: str  # "eviction" or "resume"


def disruption_marks(attempts: Sequence[Attempt], evicted_steps: Sequence[int]) -> list[PlotMark]:
    """Where each disruption came and where training picked up again, as two marks per restart.

    The eviction step is rank 0's step when the pod was evicted (`evicted_steps`, one per restart,
    when known); the trainer keeps training through its grace period and saves at SIGTERM, so the
    resume step is later than the eviction, or earlier when it resumed from a periodic checkpoint.
    """
    marks = []
    for index, (before, after) in enumerate(zip(attempts, attempts[1:], strict=False)):
        evicted = (
            evicted_steps[index] if index < len(evicted_steps) else before.preempted_at or before.last_step
        )
        marks.append(PlotMark(evicted, f"evicted at step {evicted}", "eviction"))
        resumed = after.resumed_from or 0
        saved_at_sigterm = before.preempted_at is not None and before.preempted_at == resumed
        source = "its SIGTERM checkpoint" if saved_at_sigterm else "the newest checkpoint"
        marks.append(PlotMark(resumed, f"resumed from {source} at step {resumed}", "resume"))
    return marks


def plot_losses(
    attempts: Sequence[Attempt], out: Path, title: str, evicted_steps: Sequence[int] = ()
) -> None:
    """The loss curve, one colour per attempt, the eviction and the resume step marked apart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5))
    for index, attempt in enumerate(attempts):
        steps = sorted(attempt.steps)
        label = f"attempt {index}" + (
            f" (resumed at step {attempt.resumed_from})" if attempt.resumed_from else ""
        )
        axes.plot(steps, [attempt.steps[s].loss for s in steps], label=label, linewidth=1.2)
    styles = {"eviction": ("red", "--", -30), "resume": ("green", ":", -60)}
    for mark in disruption_marks(attempts, evicted_steps):
        color, linestyle, offset = styles[mark.kind]
        axes.axvline(mark.step, color=color, linestyle=linestyle, linewidth=1)
        axes.annotate(
            mark.label,
            xy=(mark.step, axes.get_ylim()[1]),
            xytext=(5, offset),
            textcoords="offset points",
            color=color,
            fontsize=9,
        )
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phalanx.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "demo-output", help="PNG, summary and logs")
    parser.add_argument(
        "--name", default="demo", help="local cluster name (state in ~/.local/state/phalanx/NAME)"
    )
    parser.add_argument("--evict-at", type=float, default=0.5, help="fraction of the steps at which to evict")
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds the job may take")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    args = parser.parse_args(argv)

    from phalanx.devcluster.cluster import default_state_dir

    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    demo = Demo(out_dir, default_state_dir(args.name), lambda line: print(line, flush=True))
    began = time.monotonic()
    try:
        demo.up()
        total = demo.submit()
        phase, attempts, elapsed, recover = demo.follow(total, args.evict_at, args.timeout)
        summary = summarize(attempts, elapsed, recover)
        (out_dir / "summary.json").write_text(
            json.dumps({"phase": phase, **summary.to_dict()}, indent=2) + "\n"
        )
        timeline = (demo.job_status().get("lastRecovery") or {}).get("summary") or "-"
        (out_dir / "rank0.log").write_text(demo.rank0_log())
        plot_losses(
            attempts,
            out_dir / "loss.png",
            f"{JOB}: {summary.steps} steps, evicted once, {phase}",
            demo.evicted_steps,
        )
        print(
            f"\n== {JOB} {phase} ==\n"
            f"  steps            {summary.steps} (final loss {summary.final_loss})\n"
            f"  gang restarts    {summary.restarts}\n"
            f"  lost steps       {summary.lost_steps} (redone after the restart)\n"
            f"  recovery         {', '.join(f'{s:.1f}s' for s in summary.recover_seconds) or '-'} "
            "(eviction -> every rank training again)\n"
            f"  status.lastRecovery  {timeline}\n"
            f"  goodput          {summary.goodput:.1%} (step time of kept steps / {elapsed:.0f}s from submit)\n"
            f"  loss curve       {out_dir / 'loss.png'}\n"
            f"  summary          {out_dir / 'summary.json'}\n"
            f"  whole demo       {time.monotonic() - began:.0f}s",
            flush=True,
        )
        return 0 if phase == "Succeeded" else 1
    except PreflightError as exc:
        print(f"make demo: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if args.keep:
            print(f"cluster kept: kubectl --kubeconfig {demo.cluster.kubeconfig} get tj -A; "
                  f"`phalanx dev --name {args.name} down` stops it (dev nodes: see docs/demo.md)")  # fmt: skip
        else:
            demo.down()


if __name__ == "__main__":
    sys.exit(main())
