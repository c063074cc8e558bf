"""torchrun's elastic settings (builders/torchrun_env.py), checked against torchrun's own parser."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from phalanx import constants as c
from phalanx.builders.torchrun_env import elastic_env

pytestmark = pytest.mark.unit

POD0 = "gpt-worker-0.gpt.team-a.svc.cluster.local"


def env_for(index: int, **overrides: Any) -> dict[str, str]:
    args: dict[str, Any] = {
        "replicas": 3,
        "procs_per_replica": 2,
        "master_addr": POD0,
        "port": 29500,
        "job_uid": "uid-1",
        "max_restarts": 4,
        "replica_index": index,
    }
    args.update(overrides)
    return elastic_env(**args)


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Parses a pod's env the way `torchrun script.py` does: PET_* are read when the parser is built."""
    from torch.distributed.run import config_from_args, get_args_parser

    def parse(env: dict[str, str]) -> Any:
        for name in [*c.TORCHRUN_ELASTIC_ENV_NAMES, c.ENV_PET_NNODES, c.ENV_PET_NPROC_PER_NODE]:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        args = get_args_parser().parse_args(["script.py"])
        config, _, _ = config_from_args(args)
        return config

    yield parse


def test_torchrun_reads_a_fixed_size_c10d_rendezvous_on_pod_0(torchrun_env: Any) -> None:
    config = torchrun_env(env_for(1))
    assert config.rdzv_backend == "c10d"
    assert config.rdzv_endpoint == f"{POD0}:29500"
    assert config.run_id == "uid-1"
    assert config.max_restarts == 4
    assert (config.min_nodes, config.max_nodes) == (3, 3)
    assert config.nproc_per_node == 2


def test_only_pod_0_hosts_the_rendezvous_store(torchrun_env: Any) -> None:
    hosts = [torchrun_env(env_for(i)).rdzv_configs["is_host"] for i in range(3)]
    assert hosts == ["true", "false", "false"]


def test_a_dead_agent_is_dropped_after_a_few_seconds_not_torchs_fifteen(torchrun_env: Any) -> None:
    conf = torchrun_env(env_for(0)).rdzv_configs
    dropped_after = int(conf["keep_alive_interval"]) * int(conf["keep_alive_max_attempt"])
    assert dropped_after <= 5


def test_the_join_timeout_is_passed_when_given(torchrun_env: Any) -> None:
    assert "join_timeout" not in torchrun_env(env_for(0)).rdzv_configs
    assert torchrun_env(env_for(0, join_timeout_seconds=120)).rdzv_configs["join_timeout"] == "120"


def test_restarted_workers_get_a_fresh_store_not_the_agents_long_lived_one() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    env = env_for(0)
    assert env[c.ENV_TORCH_DISABLE_SHARED_RDZV_STORE] == "1"
    # The handler reads it at call time: with it set, the agent tells workers not to use its store.
    handler = DynamicRendezvousHandler.__new__(DynamicRendezvousHandler)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(c.ENV_TORCH_DISABLE_SHARED_RDZV_STORE, env[c.ENV_TORCH_DISABLE_SHARED_RDZV_STORE])
        assert handler.use_agent_store is False


def test_local_addr_keeps_each_pods_own_name(torchrun_env: Any) -> None:
    own = "gpt-worker-2.gpt.team-a.svc.cluster.local"
    assert torchrun_env(env_for(2, local_addr=own)).local_addr == own
    assert c.ENV_PET_LOCAL_ADDR not in env_for(2)


def test_pod_0_sorts_first_so_it_stays_group_rank_0() -> None:
    # c10d ranks agents by their sorted addresses; pod 0 must stay rank 0 (it hosts the workers' store).
    names = [f"gpt-worker-{i}.gpt.team-a.svc.cluster.local" for i in range(12)]
    assert sorted(names)[0] == names[0]


def test_every_name_set_is_a_declared_constant() -> None:
    declared = {
        *c.TORCHRUN_ELASTIC_ENV_NAMES,
        c.ENV_PET_NNODES,
        c.ENV_PET_NPROC_PER_NODE,
        c.ENV_TORCH_DISABLE_SHARED_RDZV_STORE,
    }
    assert set(env_for(0, local_addr="x")) <= declared


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"replicas": 0}, "replicas"),
        ({"procs_per_replica": 0}, "procs_per_replica"),
        ({"replica_index": 3}, "replica_index"),
        ({"port": 0}, "port"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"job_uid": ""}, "job_uid"),
        ({"join_timeout_seconds": 0}, "join_timeout_seconds"),
    ],
)
def test_bad_input_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        env_for(0, **overrides)


def test_the_example_jobs_configmap_carries_the_example_script() -> None:
    from pathlib import Path

    import yaml

    examples = Path(__file__).resolve().parents[2] / "examples" / "torchrun"
    config_map, job = yaml.safe_load_all((examples / "trainingjob.yaml").read_text())
    assert config_map["data"]["train.py"] == (examples / "train.py").read_text()
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    assert trainer["command"] == ["torchrun", "/app/train.py"]  # plain torchrun, no flags
    assert job["spec"]["runPolicy"]["restartStrategy"] == "InPlace"
