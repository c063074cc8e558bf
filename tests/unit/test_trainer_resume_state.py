"""Restoring the optimizer's non-tensor values (LAMB's per-parameter step) after a layout change.

DCP reshards tensors; the plain values sit in per-rank files. After a resize a rank may hold
parameters whose state another rank of the writer saved, so the optimizer part is merged by FQN.
"""

from __future__ import annotations

from typing import Any

import pytest

from phalanx_trainer.checkpoint.rng import new_rank_seed
from phalanx_trainer.checkpoint.state import (
    TENSOR_MARK,
    merge_optimizer_state,
    optimizer_state_without_saved_values,
    overlay_plain_values,
)

pytestmark = pytest.mark.unit


def skeleton(steps: dict[str, int]) -> dict[str, Any]:
    """A sharded skeleton as split_tensors writes it: LAMB's step is a plain int, the moments markers."""
    return {
        "model": {fqn: {TENSOR_MARK: f"model/{fqn}"} for fqn in steps},
        "optimizer": {
            "state": {
                fqn: {"step": step, "exp_avg": {TENSOR_MARK: f"optimizer/state/{fqn}/exp_avg"}}
                for fqn, step in steps.items()
            },
            "param_groups": [{"lr": 0.1, "params": sorted(steps)}],
        },
    }


def test_merge_takes_each_parameters_state_from_the_rank_file_that_holds_it() -> None:
    own = skeleton({"a": 2})
    merged = merge_optimizer_state(own, [skeleton({"b": 5}), skeleton({"a": 9, "c": 7})])
    assert {fqn: state["step"] for fqn, state in merged["optimizer"]["state"].items()} == {
        "a": 2,  # this rank's own file first
        "b": 5,
        "c": 7,
    }
    assert merged["optimizer"]["param_groups"] == own["optimizer"]["param_groups"]
    assert own["optimizer"]["state"].keys() == {"a"}, "the input is not changed"


def test_after_a_merge_every_live_parameter_gets_its_saved_step() -> None:
    live = skeleton({"a": 1, "b": 1})  # the probe step torch's get_state_dict took
    merged = merge_optimizer_state(skeleton({"a": 2}), [skeleton({"b": 2})])
    assert optimizer_state_without_saved_values(live, merged) == []
    restored = overlay_plain_values(live, merged)
    assert {fqn: state["step"] for fqn, state in restored["optimizer"]["state"].items()} == {"a": 2, "b": 2}


def test_a_live_parameter_without_a_saved_value_is_named() -> None:
    live = skeleton({"a": 1, "b": 1})
    saved = skeleton({"a": 2})
    assert optimizer_state_without_saved_values(live, saved) == ["b/step"]
    saved["optimizer"]["state"]["b"] = {"exp_avg": {TENSOR_MARK: "optimizer/state/b/exp_avg"}}
    assert optimizer_state_without_saved_values(live, saved) == ["b/step"]


def test_tensor_only_state_needs_no_saved_plain_value() -> None:
    live = {"optimizer": {"state": {"a": {"exp_avg": {TENSOR_MARK: "x"}}}, "param_groups": []}}
    assert optimizer_state_without_saved_values(live, {"optimizer": {"state": {}}}) == []


def test_a_new_ranks_seed_is_its_own_and_repeatable() -> None:
    seeds = {new_rank_seed(1234, rank, step) for rank in range(1, 9) for step in (10, 11)}
    assert len(seeds) == 16
    assert new_rank_seed(1234, 3, 10) == new_rank_seed(1234, 3, 10)
    assert all(0 <= seed < 2**63 for seed in seeds)


def test_a_live_plain_value_saved_as_a_tensor_is_not_a_saved_value() -> None:
    # AdamW's step is a tensor; LAMB's, a Python int: the overlay would keep the live (probe) value.
    live = skeleton({"a": 1})
    saved = skeleton({"a": 2})
    saved["optimizer"]["state"]["a"]["step"] = {TENSOR_MARK: "optimizer/state/a/step"}
    assert optimizer_state_without_saved_values(live, saved) == ["a/step"]
