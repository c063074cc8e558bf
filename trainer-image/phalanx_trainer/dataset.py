"""Data: a memory-mapped byte-level text source, a synthetic source, and per-rank resumable loading.

Sample `i` of the global stream is a pure function of (seed, i). Data-parallel rank r of dp takes, for
its c-th micro-batch, global samples ((c x dp) + r) x B ... + B - 1, so one process with batch dp x B
sees exactly the union of what dp processes with batch B see, and a restart at micro-batch c is exact.
The checkpoint keeps the position in the global stream (samples consumed), so a resume with another
dp or batch size continues at the same sample (`resume_micro_batch`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from phalanx_trainer.config import DataConfig, ModelConfig
from phalanx_trainer.models import load_object

log = logging.getLogger(__name__)

SHIPPED_TEXT = Path(__file__).parent / "data" / "phalanx_prose.txt"


class SampleSource(Protocol):
    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), both int64 of shape (seq_len,)."""
        ...


class TextSource:
    """Byte-level text, memory-mapped; non-overlapping windows in a fresh random order each epoch."""

    def __init__(self, path: Path, seq_len: int, seed: int) -> None:
        self.path, self.seq_len, self.seed = path, seq_len, seed
        size = path.stat().st_size
        self.windows = (size - 1) // seq_len
        if self.windows < 1:
            raise ValueError(f"{path} has {size} bytes, fewer than seq_len + 1 = {seq_len + 1}")
        self._bytes: np.memmap[Any, np.dtype[np.uint8]] | None = None
        self._order_epoch = -1
        self._order: np.ndarray[Any, np.dtype[np.int64]] = np.arange(0)

    def _map(self) -> np.memmap[Any, np.dtype[np.uint8]]:
        # Opened lazily so a DataLoader worker maps the file itself instead of receiving a pickle.
        if self._bytes is None:
            self._bytes = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._bytes

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_bytes": None}

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, position = divmod(index, self.windows)
        if epoch != self._order_epoch:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.windows)
            self._order_epoch = epoch
        start = int(self._order[position]) * self.seq_len
        window = torch.from_numpy(np.array(self._map()[start : start + self.seq_len + 1], dtype=np.int64))
        return window[:-1], window[1:]


class SyntheticSource:
    """Arithmetic sequences modulo the vocabulary: learnable, unbounded, no file needed."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, index])
        start, stride = int(rng.integers(self.vocab_size)), int(rng.integers(1, 4))
        tokens = (start + stride * np.arange(self.seq_len + 1)) % self.vocab_size
        window = torch.from_numpy(tokens.astype(np.int64))
        return window[:-1], window[1:]


def build_source(data: DataConfig, model: ModelConfig, seed: int) -> SampleSource:
    if data.source == "text":
        return TextSource(Path(data.path) if data.path else SHIPPED_TEXT, model.seq_len, seed)
    if data.source == "synthetic":
        return SyntheticSource(model.vocab_size, model.seq_len, seed)
    source: SampleSource = load_object(data.custom)(data, model)
    return source


class _Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, source: SampleSource) -> None:
        self.source = source

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.source.sample(index)


class RankBatchSampler(Sampler[list[int]]):
    """Endless micro-batches of global sample indices for one data-parallel rank."""

    def __init__(self, batch_size: int, dp_rank: int, dp_size: int, start_micro_batch: int) -> None:
        self.batch_size, self.dp_rank, self.dp_size = batch_size, dp_rank, dp_size
        self.start = start_micro_batch

    def __iter__(self) -> Iterator[list[int]]:
        counter = self.start
        while True:
            first = (counter * self.dp_size + self.dp_rank) * self.batch_size
            yield list(range(first, first + self.batch_size))
            counter += 1


def rank_sample_indices(micro_batch: int, batch_size: int, dp_rank: int, dp_size: int) -> list[int]:
    first = (micro_batch * dp_size + dp_rank) * batch_size
    return list(range(first, first + batch_size))


class DataStream:
    """This rank's batches with an exact resume position and the time spent waiting for data.

    Stateful for the checkpoint manager: the position counts micro-batches handed to the loop, not
    batches a worker prefetched, so a restore continues with the first batch not yet trained on.
    """

    def __init__(
        self, source: SampleSource, config: DataConfig, dp_rank: int, dp_size: int, device: torch.device
    ) -> None:
        self.source, self.config = source, config
        self.dp_rank, self.dp_size, self.device = dp_rank, dp_size, device
        self.consumed = 0
        self.restored_position: int | None = None  # the checkpoint's consumed_samples, after a resume
        self.wait_seconds = 0.0  # since the last take_wait_seconds()
        self._iterator: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None

    def _loader(self) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        sampler = RankBatchSampler(self.config.batch_size, self.dp_rank, self.dp_size, self.consumed)
        workers = self.config.num_workers
        return DataLoader(
            _Samples(self.source),
            batch_sampler=sampler,
            num_workers=workers,
            pin_memory=self.config.pin_memory and self.device.type == "cuda",
            prefetch_factor=self.config.prefetch_factor if workers else None,
            persistent_workers=self.config.persistent_workers if workers else False,
            # Its own generator: seeding the workers must not draw from the global RNG, or a resumed
            # run's RNG stream would be one draw ahead of the uninterrupted one.
            generator=torch.Generator().manual_seed(1_000_003 * (self.dp_rank + 1) + self.consumed),
        )

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        began = time.perf_counter()
        if self._iterator is None:
            self._iterator = iter(self._loader())
        inputs, targets = next(self._iterator)
        non_blocking = self.device.type == "cuda"
        inputs = inputs.to(self.device, non_blocking=non_blocking)
        targets = targets.to(self.device, non_blocking=non_blocking)
        self.consumed += 1
        self.wait_seconds += time.perf_counter() - began
        return inputs, targets

    def take_wait_seconds(self) -> float:
        waited, self.wait_seconds = self.wait_seconds, 0.0
        return waited

    def state_dict(self) -> dict[str, Any]:
        return {
            "consumed_micro_batches": self.consumed,
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
            "batch_size": self.config.batch_size,
            # The position in the global stream: every sample before it was trained on by some rank.
            "consumed_samples": self.consumed * self.dp_size * self.config.batch_size,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.consumed = resume_micro_batch(state_dict, self.dp_size, self.config.batch_size)
        saved = state_dict.get("consumed_samples")
        self.restored_position = int(saved) if saved is not None else None
        self._iterator = None


class DataPositionError(ValueError):
    """The checkpoint's data position cannot be carried over to this launch's layout exactly."""


def _position_of_an_old_checkpoint(
    state_dict: dict[str, Any], consumed: int, dp_size: int, batch_size: int
) -> int:
    """Samples consumed, from a data state saved before consumed_samples was (micro-batches only).

    Exact only at the writer's layout: elsewhere the micro-batch count means other samples, so a
    guess would silently repeat or skip data.
    """
    saved_dp = int(state_dict.get("dp_size", dp_size))
    saved_batch = state_dict.get("batch_size")
    if saved_dp != dp_size or (saved_batch is not None and int(saved_batch) != batch_size):
        writer = f"dp = {saved_dp}" + (f", micro-batch {int(saved_batch)}" if saved_batch is not None else "")
        raise DataPositionError(
            f"the checkpoint's data state has no consumed_samples (an older trainer wrote it at {writer}) "
            f"and this launch has dp = {dp_size}, micro-batch {batch_size}: its position in samples is "
            "unknown here; resume at the writer's dp and micro-batch (world size and data.batch_size) "
            "until this trainer has written a checkpoint, then resize"
        )
    if saved_batch is None:
        log.warning(
            "the checkpoint's data state records neither consumed_samples nor batch_size (an older "
            "trainer); its micro-batch is assumed to be this run's (%d): keep data.batch_size as it was",
            batch_size,
        )
    return consumed * dp_size * batch_size


def resume_micro_batch(state_dict: dict[str, Any], dp_size: int, batch_size: int) -> int:
    """This layout's micro-batch counter that continues right after the saved global position.

    Exact whenever the position is a whole number of this layout's micro-batch rows (dp x batch_size
    samples): always at a step boundary with data.global_batch_size, since every step is
    global_batch_size samples. Otherwise the run continues at the row that holds the position, so the
    samples before it in that row are trained on again, with a warning saying how many.
    """
    consumed = int(state_dict["consumed_micro_batches"])
    if "consumed_samples" in state_dict:
        position = int(state_dict["consumed_samples"])
    else:
        position = _position_of_an_old_checkpoint(state_dict, consumed, dp_size, batch_size)
    row = dp_size * batch_size
    micro_batch, left_over = divmod(position, row)
    if left_over:
        log.warning(
            "data position %d samples is not a whole number of micro-batch rows of dp x batch_size = "
            "%d x %d: %d samples are trained on again; set data.global_batch_size to keep resizes exact",
            position,
            dp_size,
            batch_size,
            left_over,
        )
    return micro_batch
