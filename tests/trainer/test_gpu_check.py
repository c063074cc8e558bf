"""`make gpu-check` cannot rot: its script runs here as a dry run (CPU, gloo, 2 ranks, tiny model)
through the same code paths as on a GPU (all-reduce check, the FSDP run of gpt-125m-gpu.toml with
its overrides, MFU, the result document), and never writes the GPU's bench/results/gpu.json."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.py"
GPU_RESULT = REPO / "bench" / "results" / "gpu.json"


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )


def test_dry_run_checks_all_reduce_and_trains_the_fsdp_config(tmp_path: Path) -> None:
    before = GPU_RESULT.stat().st_mtime_ns if GPU_RESULT.exists() else None
    out = tmp_path / "gpu.json"
    done = run_script("--dry-run", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["dry_run"] is True and document["world_size"] == 2
    assert document["all_reduce"]["correct"] is True
    assert document["all_reduce"]["busbw_gbps"] > 0
    fsdp = document["fsdp"]
    assert fsdp["config"].endswith("configs/gpt-125m-gpu.toml")
    assert len(fsdp["losses"]) == fsdp["warmup_steps"] + fsdp["timed_steps"]
    assert all(math.isfinite(loss) for loss in fsdp["losses"])
    assert fsdp["tokens_per_second"] > 0 and fsdp["seconds_per_step"] > 0
    assert fsdp["mfu"] == 0.0 and fsdp["peak_flops_per_device"] == 0.0  # a CPU is not in the table
    assert "step 3/3" in done.stdout and "MFU" in done.stdout  # progress is printed
    after = GPU_RESULT.stat().st_mtime_ns if GPU_RESULT.exists() else None
    assert after == before


def test_dry_run_refuses_to_write_the_gpu_result() -> None:
    for args in (["--dry-run"], ["--dry-run", "--out", str(GPU_RESULT)]):
        done = run_script(*args)
        assert done.returncode == 2
        assert "bench/results/gpu.json" in done.stderr
