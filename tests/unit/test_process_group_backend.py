"""The process group the trainer runs under has a CPU backend beside NCCL: Trainer.reduce_loss
all-reduces a CPU tensor, so an NCCL-only group fails the first step on 2+ GPUs. The entry point and
bench/gpu_check.py take the backend from one helper so they cannot drift."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from phalanx_trainer import distenv

pytestmark = pytest.mark.unit

GPU_CHECK = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def load_gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cuda_backend_has_gloo_for_cpu_tensors_and_nccl_for_cuda() -> None:
    assert distenv.process_group_backend(use_cuda=True) == "cpu:gloo,cuda:nccl"
    assert distenv.process_group_backend(use_cuda=False) == "gloo"


def test_gpu_check_on_gpus_uses_a_backend_with_a_cpu_part() -> None:
    gpu_check = load_gpu_check()
    backend = gpu_check.process_group_backend_for(dry_run=False)
    assert "cpu:gloo" in backend and "cuda:nccl" in backend
    assert gpu_check.process_group_backend_for(dry_run=True) == "gloo"
