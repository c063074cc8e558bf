"""The global batch policy (global_batch.py), its config checks, and the data position across a resize.

Pure: no process group. The multi-rank resize runs are in test_elastic_resize.py.
"""

from __future__ import annotations

import pytest
import torch

from phalanx_trainer.config import ConfigError, DataConfig, load_config
from phalanx_trainer.dataset import DataPositionError, DataStream, SyntheticSource, resume_micro_batch
from phalanx_trainer.global_batch import (
    GlobalBatchError,
    plan_batch,
    resume_batch_warnings,
    small_micro_batch_warning,
    working_dp_sizes,
)

pytestmark = pytest.mark.unit


def plan(global_batch: int, batch: int, dp: int, **options: int | bool) -> tuple[int, int]:
    made = plan_batch(
        global_batch_size=global_batch, batch_size=batch, grad_accumulation_steps=1, dp=dp, **options
    )
    assert made.micro_batch_size * made.dp * made.grad_accumulation_steps == made.global_batch_size
    return made.micro_batch_size, made.grad_accumulation_steps


def test_accumulation_follows_the_world_size_and_the_global_batch_stays() -> None:
    assert plan(16, 4, dp=1) == (4, 4)
    assert plan(16, 4, dp=2) == (4, 2)
    assert plan(16, 4, dp=4) == (4, 1)


def test_off_keeps_the_configured_accumulation() -> None:
    made = plan_batch(global_batch_size=0, batch_size=4, grad_accumulation_steps=3, dp=2)
    assert (made.micro_batch_size, made.grad_accumulation_steps, made.global_batch_size) == (4, 3, 24)
    assert not made.derived


def test_the_micro_batch_shrinks_only_when_allowed() -> None:
    with pytest.raises(GlobalBatchError) as refused:
        plan(12, 4, dp=2)
    message = str(refused.value)
    assert "data.global_batch_size = 12" in message and "data.batch_size = 4" in message
    assert "data.adjust_batch_size = true" in message
    assert "world size that works (1, 3)" in message  # dp 1 and 3 split 12 into micro-batches of 4
    # Allowed: the fewest accumulation steps whose micro-batch fits under batch_size (6 -> 2 x 3).
    assert plan(12, 4, dp=2, adjust_batch_size=True) == (3, 2)
    assert plan(12, 4, dp=1, adjust_batch_size=True) == (4, 3)


def test_an_adjusted_micro_batch_stays_divisible_by_the_pipeline_microbatches() -> None:
    # 18 per rank under a ceiling of 10: 2 steps of 9 alone; 9 does not cut into 2 pipeline
    # micro-batches, so 3 steps of 6; no divisor of 18 cuts into 4.
    assert plan(18, 10, dp=1, adjust_batch_size=True) == (9, 2)
    assert plan(18, 10, dp=1, pp_microbatches=2, adjust_batch_size=True) == (6, 3)
    with pytest.raises(GlobalBatchError, match="parallelism.pp_microbatches = 4"):
        plan(18, 10, dp=1, pp_microbatches=4, adjust_batch_size=True)


def test_a_global_batch_that_dp_does_not_divide_names_the_sizes_that_work() -> None:
    with pytest.raises(GlobalBatchError) as refused:
        plan(16, 2, dp=3, model_parallel=2, adjust_batch_size=True)
    # The divisors of 16 work (micro-batches of 1 at dp 16); with tp x pp = 2, twice the world size.
    assert "world size that works (2, 4, 8, 16, 32)" in str(refused.value)
    assert "tp x pp = 2" in str(refused.value)
    assert working_dp_sizes(16, 2, 1, adjust=True) == [1, 2, 4, 8, 16]
    assert working_dp_sizes(16, 2, 1, adjust=False) == [1, 2, 4, 8]


def test_config_rejects_a_global_batch_this_launch_cannot_split() -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["data.global_batch_size=12", "data.batch_size=4"], world_size=2)
    assert any("data.global_batch_size = 12" in problem for problem in refused.value.problems)
    load_config(None, ["data.global_batch_size=12", "data.batch_size=4"], world_size=3)


def test_config_refuses_explicit_accumulation_beside_a_global_batch() -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["data.global_batch_size=16", "parallelism.grad_accumulation_steps=2"], 1)
    assert any("set one or the other" in problem for problem in refused.value.problems)
    with pytest.raises(ConfigError, match="needs data.global_batch_size"):
        load_config(None, ["data.adjust_batch_size=true"], 1)


def stream_indices(stream: DataStream, micro_batches: int) -> list[int]:
    seen: list[int] = []
    for _ in range(micro_batches):
        inputs, _ = stream.next_batch()
        # SyntheticSource's first token is a pure function of the index: recover the index from it.
        seen.extend(int(row[0]) for row in inputs)
    return seen


def test_the_data_position_survives_a_change_of_dp_and_micro_batch() -> None:
    # Synthetic indices read back as the first token: vocab large enough that they never wrap.
    class Indexed(SyntheticSource):
        def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            window = torch.full((self.seq_len + 1,), index, dtype=torch.int64)
            return window[:-1], window[1:]

    source = Indexed(10_000, 4, seed=0)
    cpu = torch.device("cpu")
    # Two ranks, micro-batch 3, two micro-batches each: samples 0..11 between them.
    two = [DataStream(source, DataConfig(batch_size=3), rank, 2, cpu) for rank in range(2)]
    seen = sorted(stream_indices(two[0], 2) + stream_indices(two[1], 2))
    assert seen == list(range(12))
    state = two[1].state_dict()
    assert state["consumed_samples"] == 12
    # One rank with micro-batches of 4 continues at sample 12, exactly.
    one = DataStream(source, DataConfig(batch_size=4), 0, 1, cpu)
    one.load_state_dict(state)
    assert stream_indices(one, 3) == list(range(12, 24))
    # Back to two ranks of 3: sample 24 on.
    back = [DataStream(source, DataConfig(batch_size=3), rank, 2, cpu) for rank in range(2)]
    for stream in back:
        stream.load_state_dict(one.state_dict())
    assert sorted(stream_indices(back[0], 1) + stream_indices(back[1], 1)) == list(range(24, 30))


def test_a_position_inside_a_row_repeats_the_rest_of_that_row_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 3 micro-batches of 4 on one rank = 12 samples; rows of 2 x 5 = 10: continue at row 1 (sample 10).
    state = {"consumed_micro_batches": 3, "dp_size": 1, "batch_size": 4, "consumed_samples": 12}
    assert resume_micro_batch(state, dp_size=2, batch_size=5) == 1
    assert "2 samples are trained on again" in caplog.text


def test_an_old_checkpoint_without_a_sample_position_resumes_only_at_its_own_layout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # From before consumed_samples was saved: the position is known in this layout's micro-batches only.
    old = {"consumed_micro_batches": 6, "dp_size": 1}
    with pytest.raises(DataPositionError) as refused:
        resume_micro_batch(old, dp_size=2, batch_size=4)
    message = str(refused.value)
    assert "consumed_samples" in message and "dp = 1" in message and "dp = 2" in message
    assert "resume at the writer's" in message
    with pytest.raises(DataPositionError, match="micro-batch 4"):
        resume_micro_batch({**old, "batch_size": 4}, dp_size=1, batch_size=3)
    # Same dp, no recorded batch size: taken to be this run's, and said so.
    assert resume_micro_batch(old, dp_size=1, batch_size=4) == 6
    assert "assumed" in caplog.text
    assert resume_micro_batch({**old, "batch_size": 4}, dp_size=1, batch_size=4) == 6


def test_a_resume_that_changes_the_global_batch_warns_with_both_sizes_and_the_fix() -> None:
    [changed] = resume_batch_warnings(written_global_batch=8, global_batch=4, consumed_samples=16)
    assert changed["reason"] == "global_batch_changed"
    assert (changed["from_global_batch_size"], changed["global_batch_size"]) == (8, 4)
    assert "8" in changed["message"] and "4" in changed["message"]
    assert "data.global_batch_size = 8" in changed["message"]


def test_a_resume_position_off_the_step_boundary_warns() -> None:
    warnings = resume_batch_warnings(written_global_batch=8, global_batch=3, consumed_samples=8)
    assert [w["reason"] for w in warnings] == ["global_batch_changed", "data_position_off_step_boundary"]
    off = warnings[1]
    assert (off["consumed_samples"], off["global_batch_size"]) == (8, 3)
    assert "data.global_batch_size" in off["message"]


def test_a_resume_with_the_writers_batch_at_a_step_boundary_is_quiet() -> None:
    assert resume_batch_warnings(written_global_batch=16, global_batch=16, consumed_samples=32) == []
    # Checkpoints from before the batch was recorded: only the position can be checked.
    assert resume_batch_warnings(written_global_batch=None, global_batch=16, consumed_samples=32) == []
    assert resume_batch_warnings(written_global_batch=16, global_batch=16, consumed_samples=None) == []


def test_an_adjusted_micro_batch_under_half_the_batch_size_warns() -> None:
    # 22 over 2 ranks is 11 each, a prime above 8: 11 micro-batches of 1.
    tiny = plan_batch(
        global_batch_size=22, batch_size=8, grad_accumulation_steps=1, dp=2, adjust_batch_size=True
    )
    assert (tiny.micro_batch_size, tiny.grad_accumulation_steps) == (1, 11)
    warning = small_micro_batch_warning(tiny, batch_size=8)
    assert warning is not None and warning["reason"] == "micro_batch_small"
    assert (warning["micro_batch_size"], warning["batch_size"]) == (1, 8)
    assert "data.global_batch_size" in warning["message"] and "16" in warning["message"]
    # Half or more is a fair trade for the resize: no warning; nor without adjustment.
    half = plan_batch(
        global_batch_size=8, batch_size=8, grad_accumulation_steps=1, dp=2, adjust_batch_size=True
    )
    assert half.micro_batch_size == 4 and small_micro_batch_warning(half, batch_size=8) is None
    plain = plan_batch(global_batch_size=16, batch_size=8, grad_accumulation_steps=1, dp=2)
    assert small_micro_batch_warning(plain, batch_size=8) is None
