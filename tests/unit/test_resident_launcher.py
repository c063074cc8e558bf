"""The resident launcher (restart in place) with fake workers and a fake clock, and how a worker's
failure becomes its exit code."""

from __future__ import annotations

import dataclasses
import traceback

import pytest
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

import phalanx_trainer.train
from phalanx_trainer import contract
from phalanx_trainer.__main__ import run_worker
from phalanx_trainer.config import load_config
from phalanx_trainer.distenv import read_dist_env
from phalanx_trainer.generation import StaleGeneration

pytestmark = pytest.mark.unit


# ---- a worker's failure -> 76 (the generation broke) or 1 (the code did) -----------------------


def _wrapped(err: BaseException) -> tuple[BaseException, traceback.StackSummary]:
    return err, traceback.StackSummary()


LOST_PEER_ERRORS: list[BaseException] = [
    dist.DistError("store: connection lost"),
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError("generation 1: 1 of 2 ranks arrived within 30 s"),
    StaleGeneration("rank 1 is of restart generation 1 but the group is at generation 2"),
    # DCP gathers every rank's failure into one BaseException (not an Exception).
    CheckpointException(
        "save failed", {1: _wrapped(RuntimeError("gloo/transport/tcp: Connection reset by peer"))}
    ),
]

CODE_ERRORS: list[BaseException] = [
    KeyError("model"),
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x4)"),
    CheckpointException("save failed", {0: _wrapped(ValueError("bad state_dict key"))}),
]


def _run_worker_whose_trainer_raises(monkeypatch: pytest.MonkeyPatch, err: BaseException) -> int:
    def broken_trainer(*args: object, **kwargs: object) -> None:
        raise err

    monkeypatch.setattr(phalanx_trainer.train, "Trainer", broken_trainer)
    dist_env = dataclasses.replace(read_dist_env({}), restart_in_place=True, generation=1)
    return run_worker(load_config(None, [], 1), dist_env, {})


@pytest.mark.parametrize("err", LOST_PEER_ERRORS, ids=lambda e: type(e).__name__)
def test_a_peer_lost_while_the_trainer_is_built_exits_76(
    monkeypatch: pytest.MonkeyPatch, err: BaseException
) -> None:
    assert _run_worker_whose_trainer_raises(monkeypatch, err) == contract.EXIT_GENERATION_FAILED


@pytest.mark.parametrize("err", CODE_ERRORS, ids=lambda e: type(e).__name__)
def test_a_code_error_while_the_trainer_is_built_is_not_a_lost_peer(
    monkeypatch: pytest.MonkeyPatch, err: BaseException
) -> None:
    with pytest.raises(type(err)):
        _run_worker_whose_trainer_raises(monkeypatch, err)
