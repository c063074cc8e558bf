"""`python -m phalanx_trainer` as the operator runs it: local launcher, /progress, SIGTERM -> 75."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from phalanx.ports import free_port

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "job.torch_threads=1",
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=4",
    "model.seq_len=16",
    "data.batch_size=4",
    "metrics.log_every=1",
]


def trainer_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(
        PYTHONPATH=str(REPO / "trainer-image"), MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", **extra
    )
    return env


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_launcher_serves_progress_and_stops_with_75_on_sigterm() -> None:
    metrics_port = free_port(consecutive=2)  # local ranks 0 and 1
    process = subprocess.Popen(
        [sys.executable, "-m", "phalanx_trainer", *SMALL, "job.steps=100000", "metrics.port=-1"],
        env=trainer_env(
            NPROC_PER_NODE="2",
            NNODES="1",
            NODE_RANK="0",
            MASTER_PORT=str(free_port()),
            PHALANX_METRICS_PORT=str(metrics_port),
            PHALANX_ATTEMPT="2",
        ),  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        progress: dict[str, Any] = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and progress.get("step", 0) < 3:
            time.sleep(0.5)
            try:
                progress = get_json(f"http://127.0.0.1:{metrics_port}/progress")
            except OSError:
                assert process.poll() is None, process.communicate()
        assert progress.get("step", 0) >= 3, progress
        assert progress["total_steps"] == 100000
        assert progress["attempt"] == 2
        assert progress["tokens_per_second"] > 0 and progress["eta_seconds"] > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port + 1}/metrics", timeout=5) as response:
            assert "phalanx_trainer_tokens_total" in response.read().decode()  # local rank 1: port + 1
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 75, stderr[-3000:]
    events = [json.loads(line)["event"] for line in stdout.splitlines() if line.startswith("{")]
    assert events[0] == "start" and events[-1] == "preempted"


def test_single_process_without_environment_finishes_with_zero(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[job]\nsteps = 3\n[metrics]\nport = 0\n")
    env = {k: v for k, v in trainer_env().items() if not k.startswith(("NPROC", "NNODES", "MASTER_"))}
    done = subprocess.run(
        [sys.executable, "-m", "phalanx_trainer", "--config", str(config), *SMALL],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last == {"time": last["time"], "event": "finished", "step": 3}


def test_unreachable_rendezvous_exits_1_with_one_clear_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "phalanx_trainer", *SMALL, "job.steps=1", "metrics.port=0"],
        env=trainer_env(
            RANK="1",
            LOCAL_RANK="0",
            WORLD_SIZE="2",
            MASTER_PORT=str(free_port()),
            PHALANX_RENDEZVOUS_TIMEOUT_SECONDS="1",
        ),  # fmt: skip
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "phalanx-trainer: error: rendezvous timed out after 1 s waiting for 127.0.0.1:" in done.stderr


def test_metrics_port_taken_by_another_program_warns_and_trains_on(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", free_port()))
        holder.listen()
        taken = holder.getsockname()[1]
        env = {k: v for k, v in trainer_env().items() if not k.startswith(("NPROC", "NNODES", "MASTER_"))}
        done = subprocess.run(
            [sys.executable, "-m", "phalanx_trainer", *SMALL, "job.steps=2", "metrics.port=-1"],
            env={**env, "PHALANX_METRICS_PORT": str(taken)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"cannot serve metrics on port {taken}" in done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["event"] == "finished"
