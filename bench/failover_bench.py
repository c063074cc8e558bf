"""`make bench-failover`: how long the operator is without a leader when the leader dies.

Two operators run against a local control plane with the default lease (15 s, renewals every 2 s).
Each round SIGKILLs the leader (no release, as a crash or a partitioned node) and measures the time
until the standby says it leads; the killed one then comes back as the next standby. A second set
of rounds stops the leader with SIGTERM, which releases the lease. Results go to
bench/results/failover.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from phalanx.devcluster.cluster import LocalCluster, down_on_sigterm
from phalanx.devcluster.crds import wait_established

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "failover.json"
LEADING = "leading: reconciles, admission and progress polls start"


class Candidate:
    def __init__(self, kubeconfig: Path, log_dir: Path, index: int) -> None:
        self.kubeconfig, self.log_dir, self.index = kubeconfig, log_dir, index
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None

    def start(self) -> None:
        self.starts += 1
        self.log = self.log_dir / f"op{self.index}-{self.starts}.log"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        argv = [sys.executable, "-m", "phalanx.cli", "operator", "--metrics-port", "0", "--health-port", "0"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def leads(self) -> bool:
        return self.log is not None and LEADING in self.log.read_text(errors="replace")

    def stop(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_leader(candidates: list[Candidate], timeout: float) -> Candidate:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for candidate in candidates:
            if candidate.proc is not None and candidate.proc.poll() is None and candidate.leads():
                return candidate
        time.sleep(0.05)
    raise TimeoutError("no operator leads")


def rounds(candidates: list[Candidate], count: int, sig: int, label: str) -> list[float]:
    times = []
    for index in range(count):
        leader = wait_leader(candidates, 60)
        standby = next(c for c in candidates if c is not leader)
        time.sleep(4)  # the standby has seen a few renewals
        began = time.monotonic()
        leader.stop(sig)
        wait_leader([standby], 60)
        times.append(time.monotonic() - began)
        print(
            f"[failover] {label} round {index + 1}/{count}: standby leads after {times[-1]:.1f}s", flush=True
        )
        leader.start()  # back as the next standby
    return times


def summary(times: list[float]) -> dict[str, Any]:
    return {"seconds": [round(t, 2) for t in times], "median": round(statistics.median(times), 2),
            "worst": round(max(times), 2), "best": round(min(times), 2)}  # fmt: skip


def main() -> int:
    down_on_sigterm()  # a killed run tears its cluster down
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="phalanx-failover-") as scratch:
        cluster = LocalCluster(
            Path(scratch) / "cluster", log=lambda msg: print(f"[failover] {msg}", flush=True)
        )
        kubeconfig = cluster.up(pools=())
        candidates = [Candidate(kubeconfig, Path(scratch), i) for i in range(2)]
        try:
            cluster.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
            wait_established(cluster.kubectl_argv(), ["trainingjobs.phalanx.dev"])
            for candidate in candidates:
                candidate.start()
            killed = rounds(candidates, args.rounds, signal.SIGKILL, "SIGKILL")
            released = rounds(candidates, args.rounds, signal.SIGTERM, "SIGTERM")
        finally:
            for candidate in candidates:
                candidate.stop(signal.SIGTERM)
            cluster.down(quiet=True)
    result = {
        "lease_duration_seconds": 15,
        "retry_period_seconds": 2,
        "leader_killed": summary(killed),
        "leader_stopped_releases_lease": summary(released),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| leader | median | worst | best | rounds |\n|---|---|---|---|---|")
    for label, key in (("SIGKILL (lease expires)", "leader_killed"), ("SIGTERM (lease released)",
                                                                     "leader_stopped_releases_lease")):  # fmt: skip
        row = result[key]
        print(f"| {label} | {row['median']} s | {row['worst']} s | {row['best']} s | {len(row['seconds'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
