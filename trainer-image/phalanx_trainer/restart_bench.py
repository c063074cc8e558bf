"""Restart-in-place benchmark (not a test):
`python -m phalanx_trainer.restart_bench [--compare start-method|memory] [--pairs 5] [--out FILE]`.

How long from "generation N accepted" to "first step of generation N", for two arms:
- `--compare start-method` (default): how the resident launcher starts its workers: `fork` from the
  warm parent (torch and the trainer imported once) against `subprocess` (a cold
  `python -m phalanx_trainer` per worker, the baseline);
- `--compare memory`: both forked; `memory` keeps each rank's state in its pod's memory at the agreed
  stop and restores from there (checkpoint.keep_in_memory, the default) against `storage`, which
  restores the agreed stop's checkpoint from checkpoint storage (keep_in_memory=false).

Two gangs of two resident-launcher pods (NNODES=2, one gloo rank each, the tiny GPT of the tests)
run side by side on localhost, one per start method. Only one is awake at a time: the other's
processes are stopped with SIGSTOP, so the two never share the CPU while one is measured. Each pair
restarts one gang and then the other (the order alternates between pairs), each time by POSTing
generation N with stop "checkpoint" to both pods: the workers agree on a step, save, exit 75, and
the launchers start generation N, which restores that checkpoint and steps. The time runs from the
later of the two pods' acceptances to rank 0's `first_step` event of generation N.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

# name -> (start method, extra trainer arguments), per comparison; the first arm is the divisor.
COMPARISONS: dict[str, dict[str, tuple[str, list[str]]]] = {
    "start-method": {"fork": ("fork", []), "subprocess": ("subprocess", [])},
    "memory": {
        "memory": ("fork", ["checkpoint.keep_in_memory=true"]),
        "storage": ("fork", ["checkpoint.keep_in_memory=false"]),
    },
}
TRAINER_ARGS = [
    "job.torch_threads=1",
    "job.steps=1000000",
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=4",
    "model.seq_len=16",
    "data.batch_size=4",
    "metrics.log_every=1",
    "metrics.port=0",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _request(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


class BenchGang:
    def __init__(self, method: str, folder: Path, start_method: str, extra_args: list[str]) -> None:
        self.method = method
        self.folder = folder
        self.generation = 0
        self.sources: list[str] = []  # where each generation's restore read its state
        master_port = _free_port()
        self.pods: list[tuple[subprocess.Popen[bytes], int, Path]] = []
        for node_rank in (0, 1):
            control = _free_port()
            stdout = folder / f"pod{node_rank}.out"
            env = {
                **os.environ,
                "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                "GLOO_SOCKET_IFNAME": "lo",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master_port),
                "NNODES": "2",
                "NPROC_PER_NODE": "1",
                "NODE_RANK": str(node_rank),
                "PHALANX_RESTART_IN_PLACE": "true",
                "PHALANX_CONTROL_PORT": str(control),
                "PHALANX_CHECKPOINT_DIR": str(folder / "ckpt"),
                "PHALANX_GENERATION_WAIT_SECONDS": "3600",
                "PHALANX_LAUNCHER_START_METHOD": start_method,
            }
            with stdout.open("wb") as out, (folder / f"pod{node_rank}.err").open("wb") as err:
                process = subprocess.Popen(
                    [sys.executable, "-m", "phalanx_trainer", *TRAINER_ARGS, *extra_args],
                    env=env,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # its own process group, so SIGSTOP reaches the workers too
                )
            self.pods.append((process, control, stdout))

    def first_step(self, generation: int) -> float | None:
        for line in self.pods[0][2].read_text().splitlines():
            if line.startswith("{") and '"first_step"' in line:
                event = json.loads(line)
                if event.get("generation") == generation:
                    return float(event["unix_time"])
        return None

    def phases(self, generation: int, accepted: float) -> dict[str, float]:
        """The recovery's split: stop (old workers out), start (new ones in their group), Trainer build + checkpoint restore, step."""
        started = 0.0
        for _, _, stdout in self.pods:  # the launcher's lines are on stderr, beside the trainer's stdout
            for line in stdout.with_suffix(".err").read_text().splitlines():
                if '"launcher_generation_started"' in line and json.loads(line)["generation"] == generation:
                    started = max(started, float(json.loads(line)["time"]))
        marks = {"group_ready": 0.0, "resumed": 0.0, "first_step": 0.0}
        for line in self.pods[0][2].read_text().splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            kind = event.get("event")
            if kind in marks and "unix_time" in event and float(event["unix_time"]) >= started:
                marks[kind] = marks[kind] or float(event["unix_time"])
                if kind == "resumed" and len(self.sources) < generation:
                    self.sources.append(str(event.get("source")))
        return {
            "stop": started - accepted,
            "start_and_rendezvous": marks["group_ready"] - started,
            "build_and_restore": marks["resumed"] - marks["group_ready"],
            "first_step": marks["first_step"] - marks["resumed"],
        }

    def wait_first_step(self, generation: int, timeout: float = 300.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.first_step(generation)
            if found is not None:
                return found
            for process, _, _ in self.pods:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{self.method} gang: a pod exited with {process.returncode}; see {self.folder}"
                    )
            time.sleep(0.05)
        raise RuntimeError(f"{self.method} gang: no first step of generation {generation} in {timeout:.0f} s")

    def restart(self) -> tuple[float, dict[str, float]]:
        """POST the next generation to both pods; seconds from acceptance to its first step, and phases."""
        self.generation += 1
        accepted = [
            float(
                _request(f"http://127.0.0.1:{control}/generation", {"generation": self.generation})[
                    "accepted_at"
                ]
            )
            for _, control, _ in self.pods
        ]
        total = self.wait_first_step(self.generation) - max(accepted)
        return total, self.phases(self.generation, max(accepted))

    def signal(self, signum: int) -> None:
        for process, _, _ in self.pods:
            os.killpg(process.pid, signum)

    def close(self) -> None:
        for process, _, _ in self.pods:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGCONT)
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="start-method")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    arms = COMPARISONS[args.compare]
    METHODS = tuple(arms)  # noqa: N806 - the arms, first the divisor
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as tmp:
        for method in METHODS:
            (Path(tmp) / method).mkdir()
        gangs = {method: BenchGang(method, Path(tmp) / method, *arms[method]) for method in METHODS}
        try:
            for gang in gangs.values():
                gang.wait_first_step(0)
            gangs[METHODS[1]].signal(signal.SIGSTOP)
            awake = METHODS[0]
            samples: dict[str, list[float]] = {method: [] for method in METHODS}
            phase_samples: dict[str, dict[str, list[float]]] = {method: {} for method in METHODS}
            for pair in range(args.pairs):
                order = METHODS if pair % 2 == 0 else METHODS[::-1]
                for method in order:
                    if method != awake:
                        gangs[awake].signal(signal.SIGSTOP)
                        gangs[method].signal(signal.SIGCONT)
                        awake = method
                    time.sleep(1.0)  # a few steps of the woken gang before the restart
                    seconds, split = gangs[method].restart()
                    samples[method].append(seconds)
                    for phase, value in split.items():
                        phase_samples[method].setdefault(phase, []).append(value)
                    shown = ", ".join(f"{phase} {value:.2f}" for phase, value in split.items())
                    print(f"pair {pair + 1} {method}: {seconds:.3f} s ({shown})", flush=True)
        finally:
            for gang in gangs.values():
                gang.close()
    first, second = METHODS
    ratios = [b / a for a, b in zip(samples[first], samples[second], strict=True)]
    result = {
        "what": "seconds from generation N accepted to the first step of generation N (stop: checkpoint)",
        "compare": args.compare,
        "pairs": args.pairs,
        "samples": samples,
        **{method: summary(values) for method, values in samples.items()},
        f"{second}_over_{first}": summary(ratios),
        "phases_median": {
            method: {phase: round(statistics.median(values), 3) for phase, values in split.items()}
            for method, split in phase_samples.items()
        },
        "restore_sources": {method: sorted(set(gang.sources)) for method, gang in gangs.items()},
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    if args.compare == "memory" and result["restore_sources"] != {
        "memory": ["memory"],
        "storage": ["storage"],
    }:
        print(f"error: the arms did not restore as named: {result['restore_sources']}", file=sys.stderr)
        return 1
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
