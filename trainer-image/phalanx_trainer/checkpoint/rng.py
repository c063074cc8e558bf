"""A Stateful for every random generator a training step touches, per rank, loadable with weights_only."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch


class RngState:
    """Python, NumPy, torch CPU and (when present) every CUDA device's generator."""

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = random.getstate()
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state: dict[str, Any] = {
            "python": [version, list(internal), gauss],
            "numpy": [
                str(kind),
                torch.from_numpy(np.asarray(keys).copy()),
                int(pos),
                int(has_gauss),
                float(cached),
            ],
            "torch_cpu": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["torch_cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        version, internal, gauss = state_dict["python"]
        random.setstate((int(version), tuple(int(x) for x in internal), gauss))
        kind, keys, pos, has_gauss, cached = state_dict["numpy"]
        np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
        torch.set_rng_state(state_dict["torch_cpu"])
        cuda_states = state_dict.get("torch_cuda")
        if cuda_states is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])


def new_rank_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a rank the checkpoint's writer did not have (a grow): its own per-rank file does
    not exist, and rank 0's generators would give it rank 0's stream (the same dropout masks on
    every new data-parallel rank). Deterministic, so a rerun of the same resize draws the same."""
    digest = hashlib.sha256(f"phalanx-new-rank/{seed}/{rank}/{step}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # 63 bits: torch.manual_seed takes a signed int64
