"""The environment contract, the local launcher's exit code and the rendezvous wait (pure parts)."""

from __future__ import annotations

import pytest

from phalanx_trainer.distenv import (
    EnvError,
    RendezvousTimeout,
    needs_local_launch,
    read_dist_env,
    wait_for_rendezvous,
    worker_env,
)
from phalanx_trainer.launcher import as_exit_code
from phalanx_trainer.parallel_dims import ParallelDims
from phalanx_trainer.restart_policy import combine_exit_codes

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("codes", "expected"),
    [([0, 0], 0), ([75, 0], 75), ([75, 75], 75), ([0, 75, 3, 1], 3), ([137, 75], 137), ([], 0)],
)
def test_combined_exit_code(codes: list[int], expected: int) -> None:
    assert combine_exit_codes(codes) == expected


def test_death_by_signal_becomes_128_plus_signal() -> None:
    assert as_exit_code(-9) == 137
    assert as_exit_code(-15) == 143
    assert as_exit_code(75) == 75


def test_no_environment_is_a_single_process() -> None:
    env = read_dist_env({})
    assert (env.rank, env.local_rank, env.world_size, env.distributed) == (0, 0, 1, False)


def test_operator_environment_gives_the_global_rank() -> None:
    contract_env = {"NNODES": "2", "NPROC_PER_NODE": "2", "NODE_RANK": "1", "WORLD_SIZE": "4"}
    assert needs_local_launch(contract_env)
    child = worker_env(contract_env, local_rank=1)
    assert (child["RANK"], child["LOCAL_RANK"], child["WORLD_SIZE"]) == ("3", "1", "4")
    assert not needs_local_launch(child)  # the child trains instead of launching again
    env = read_dist_env(child)
    assert (env.rank, env.local_rank, env.world_size, env.node_rank) == (3, 1, 4, 1)


def test_torchrun_environment_is_used_as_is() -> None:
    torchrun = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "NPROC_PER_NODE": "4"}
    assert not needs_local_launch(torchrun)
    assert read_dist_env(torchrun).rank == 5


def test_bad_environment_values_are_clear_errors() -> None:
    with pytest.raises(EnvError, match="WORLD_SIZE='two'"):
        read_dist_env({"WORLD_SIZE": "two"})
    with pytest.raises(EnvError, match="RANK=4 is outside WORLD_SIZE=4"):
        read_dist_env({"RANK": "4", "WORLD_SIZE": "4"})


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_worker_waits_for_dns_then_the_port() -> None:
    env = read_dist_env(
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-worker-0.job", "MASTER_PORT": "29500"}
    )
    clock, lines = FakeClock(), []
    wait_for_rendezvous(
        env,
        log=lines.append,
        resolves=lambda host: clock.now >= 12,
        accepts=lambda host, port: clock.now >= 25,
        clock=clock,
        sleep=clock.sleep,
    )
    assert clock.now == pytest.approx(25.0, abs=0.5)  # found within one (slow, past 5 s) poll
    assert lines[0].startswith("waiting for job-worker-0.job to resolve")
    assert "job-worker-0.job:29500 to accept connections" in lines[-1]
    assert len(lines) == 2  # one line per 10 s, not per attempt


def test_a_peer_store_that_comes_up_within_a_restart_is_found_at_once_not_half_a_second_later() -> None:
    # A spare or a re-forked rank starts as rank 0's new store comes up: it used to sleep 0.5 s per try.
    env = read_dist_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-worker-0.job"})
    clock = FakeClock()
    wait_for_rendezvous(env, log=lambda line: None, resolves=lambda host: True,
                        accepts=lambda host, port: clock.now >= 0.3, clock=clock, sleep=clock.sleep)  # fmt: skip
    assert clock.now == pytest.approx(0.3, abs=0.06)


def test_rank_zero_does_not_wait_for_its_own_port() -> None:
    env = read_dist_env({"RANK": "0", "WORLD_SIZE": "2"})
    wait_for_rendezvous(env, log=print, resolves=lambda host: True, accepts=lambda host, port: False)


def test_rendezvous_times_out_with_a_clear_message() -> None:
    env = read_dist_env({"RANK": "1", "WORLD_SIZE": "2", "PHALANX_RENDEZVOUS_TIMEOUT_SECONDS": "30"})
    clock = FakeClock()
    with pytest.raises(
        RendezvousTimeout, match=r"rendezvous timed out after 30 s waiting for 127.0.0.1 to resolve"
    ):
        wait_for_rendezvous(
            env, log=lambda line: None, resolves=lambda h: False, clock=clock, sleep=clock.sleep
        )


def test_parallel_dims_coordinates_are_row_major_pp_dp_tp() -> None:
    dims = ParallelDims(dp=2, tp=2, pp=2, world_size=8, dp_mode="fsdp")
    assert [dims.coordinates(rank) for rank in range(8)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1),
    ]  # fmt: skip
