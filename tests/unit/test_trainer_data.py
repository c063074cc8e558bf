"""Data sharding, exact resume and the loss scaler's arithmetic."""

from __future__ import annotations

import pytest
import torch

from phalanx_trainer.config import DataConfig, ModelConfig, PrecisionConfig
from phalanx_trainer.dataset import SHIPPED_TEXT, DataStream, SyntheticSource, TextSource, rank_sample_indices
from phalanx_trainer.precision import DynamicLossScaler

pytestmark = pytest.mark.unit


def test_data_parallel_ranks_split_exactly_one_process_batch() -> None:
    for micro_batch in range(3):
        one_process = rank_sample_indices(micro_batch, batch_size=8, dp_rank=0, dp_size=1)
        split = rank_sample_indices(micro_batch, 4, 0, 2) + rank_sample_indices(micro_batch, 4, 1, 2)
        assert split == one_process


def test_text_windows_are_targets_shifted_by_one_and_cover_each_epoch_once() -> None:
    source = TextSource(SHIPPED_TEXT, seq_len=32, seed=0)
    inputs, targets = source.sample(5)
    assert torch.equal(inputs[1:], targets[:-1])
    starts = {tuple(source.sample(i)[0].tolist()) for i in range(source.windows)}
    assert len(starts) == source.windows  # a permutation: every window once per epoch


def test_shipped_text_is_a_few_kilobytes_of_ascii() -> None:
    data = SHIPPED_TEXT.read_bytes()
    assert len(data) > 8000
    assert data.isascii()


def test_synthetic_source_is_deterministic_and_learnable() -> None:
    a, b = SyntheticSource(256, 16, seed=1), SyntheticSource(256, 16, seed=1)
    inputs, targets = a.sample(7)
    assert torch.equal(inputs, b.sample(7)[0])
    steps = (targets - inputs) % 256
    assert len(set(steps.tolist())) == 1  # one stride per sequence: predictable from context


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_resumes_at_the_exact_next_batch(workers: int) -> None:
    config = DataConfig(batch_size=4, num_workers=workers)
    source = TextSource(SHIPPED_TEXT, seq_len=16, seed=3)
    first = DataStream(source, config, dp_rank=1, dp_size=2, device=torch.device("cpu"))
    for _ in range(3):
        first.next_batch()
    state = first.state_dict()
    expected = first.next_batch()

    resumed = DataStream(source, config, dp_rank=1, dp_size=2, device=torch.device("cpu"))
    resumed.load_state_dict(state)
    got = resumed.next_batch()
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert state["consumed_micro_batches"] == 3
    assert resumed.take_wait_seconds() > 0


def test_model_config_default_vocab_is_bytes() -> None:
    assert ModelConfig().vocab_size == 256


def test_loss_scaler_backs_off_on_overflow_and_grows_after_the_interval() -> None:
    scaler = DynamicLossScaler(PrecisionConfig(dtype="fp16", initial_scale=1024.0, growth_interval=2))
    scaler.update(found_overflow=True)
    assert (scaler.scale, scaler.skipped_steps) == (512.0, 1)
    scaler.update(False)
    assert scaler.scale == 512.0
    scaler.update(False)
    assert scaler.scale == 1024.0
    restored = DynamicLossScaler(PrecisionConfig(dtype="fp16"))
    restored.load_state_dict(scaler.state_dict())
    assert restored.state_dict() == scaler.state_dict()


def test_loss_scaler_unscales_and_detects_inf() -> None:
    scaler = DynamicLossScaler(PrecisionConfig(dtype="fp16", initial_scale=4.0))
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.tensor([4.0, 8.0])
    assert scaler.unscale_and_check([param]) is False
    assert param.grad.tolist() == [1.0, 2.0]
    param.grad = torch.tensor([float("inf"), 1.0])
    assert scaler.unscale_and_check([param]) is True


def test_loss_scaler_is_off_for_bf16() -> None:
    scaler = DynamicLossScaler(PrecisionConfig(dtype="bf16"))
    loss = torch.tensor(2.0)
    assert scaler.scale_loss(loss) is loss
    assert scaler.unscale_and_check([]) is False
