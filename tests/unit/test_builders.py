"""Worker pod, Service and PodGroup manifests (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.podgroups import build_podgroup
from phalanx.builders.pods import JobRef, build_headless_service, build_spare_pod, build_worker_pod

pytestmark = pytest.mark.unit

JOB = JobRef("gpt", "team-a", "uid-1")


def spec(**overrides: Any) -> TrainingJobSpec:
    raw: dict[str, Any] = {
        "replicas": 2,
        "resources": {"gpus": 4},
        "template": {
            "spec": {"containers": [{"name": "trainer", "image": "t"}, {"name": "sidecar", "image": "s"}]}
        },
    }
    raw.update(overrides)
    return parse(TrainingJobSpec, raw)


def trainer_of(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in trainer_of(pod)["env"]}


def test_world_size_counts_processes_and_defaults_procs_to_gpus() -> None:
    s = spec()
    assert s.effective_procs_per_replica == 4 and s.world_size == 8
    pod = build_worker_pod(JOB, s, 1, 0, {"spec": {"containers": [{"name": "trainer"}]}})
    env = env_of(pod)
    assert env["WORLD_SIZE"] == "8" and env["NPROC_PER_NODE"] == "4" and env["NODE_RANK"] == "1"
    assert env["MASTER_ADDR"] == "gpt-worker-0.gpt.team-a.svc.cluster.local"


def test_only_the_trainer_container_gets_env_and_accelerators() -> None:
    s = spec()
    pod = build_worker_pod(JOB, s, 0, 3, {"spec": {"containers": [{"name": "trainer"}, {"name": "sidecar"}]}})
    sidecar = next(c for c in pod["spec"]["containers"] if c["name"] == "sidecar")
    assert "env" not in sidecar and "resources" not in sidecar
    assert trainer_of(pod)["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert env_of(pod)["PHALANX_ATTEMPT"] == "3"
    assert pod["metadata"]["labels"]["phalanx.dev/attempt"] == "3"


def test_builtin_provider_gates_pods_and_others_do_not() -> None:
    gated = build_worker_pod(JOB, spec(), 0, 0, {"spec": {"containers": [{"name": "trainer"}]}})
    assert gated["spec"]["schedulingGates"] == [{"name": "phalanx.dev/gang"}]
    plain = build_worker_pod(
        JOB, spec(scheduling={"provider": "none"}), 0, 0, {"spec": {"containers": [{"name": "trainer"}]}}
    )
    assert "schedulingGates" not in plain["spec"]
    volcano = build_worker_pod(
        JOB, spec(scheduling={"provider": "volcano"}), 0, 0, {"spec": {"containers": [{"name": "trainer"}]}}
    )
    assert volcano["spec"]["schedulerName"] == "volcano"
    assert volcano["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "gpt"


def test_user_template_is_not_mutated_and_user_labels_survive() -> None:
    template = {
        "metadata": {"labels": {"team": "a"}},
        "spec": {"containers": [{"name": "trainer", "env": []}]},
    }
    pod = build_worker_pod(JOB, spec(), 0, 0, template)
    assert template["spec"]["containers"][0]["env"] == []
    assert pod["metadata"]["labels"]["team"] == "a"
    assert pod["metadata"]["labels"]["phalanx.dev/job-name"] == "gpt"


def test_user_env_overrides_nccl_defaults_without_duplicates() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": "trainer", "env": [{"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "3"}]}
            ]
        }
    }
    names = [e["name"] for e in trainer_of(build_worker_pod(JOB, spec(), 0, 0, template))["env"]]
    assert names.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 1
    assert env_of(build_worker_pod(JOB, spec(), 0, 0, template))["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


def test_mig_request_and_gpu_toleration() -> None:
    pod = build_worker_pod(JOB, spec(resources={"mig": {"profile": "1g.10gb", "count": 2}}), 0, 0,
                           {"spec": {"containers": [{"name": "trainer"}]}})  # fmt: skip
    assert trainer_of(pod)["resources"]["requests"] == {"nvidia.com/mig-1g.10gb": "2"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]


def test_cpu_only_job_has_no_accelerator_limits_or_gpu_toleration() -> None:
    pod = build_worker_pod(JOB, spec(resources={}), 0, 0, {"spec": {"containers": [{"name": "trainer"}]}})
    assert "resources" not in trainer_of(pod)
    assert "tolerations" not in pod["spec"]


def test_headless_service_publishes_not_ready_addresses() -> None:
    svc = build_headless_service(JOB, spec(rendezvous={"port": 29600}))
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["ports"][0]["port"] == 29600
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_podgroups_for_volcano_and_coscheduling() -> None:
    volcano = build_podgroup(
        JOB, spec(scheduling={"provider": "volcano", "queue": "q", "gang": {"minAvailable": 2}})
    )
    assert volcano is not None and volcano["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert volcano["spec"]["minMember"] == 2 and volcano["spec"]["queue"] == "q"
    assert volcano["spec"]["minResources"] == {"nvidia.com/gpu": "8"}
    cosched = build_podgroup(JOB, spec(scheduling={"provider": "coscheduling"}))
    assert cosched is not None and cosched["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert cosched["spec"]["minMember"] == 2
    assert build_podgroup(JOB, spec()) is None


def test_every_variable_the_contract_sets_is_reserved() -> None:
    """A template may not set what the operator sets (only the NCCL defaults are the user's to change)."""
    from phalanx import constants as c
    from phalanx.builders.pods import contract_env

    with_checkpoints = spec(checkpoint={"path": "/ckpt", "intervalSteps": 10,
                                        "volume": {"emptyDir": {}}})  # fmt: skip
    names = {item["name"] for item in contract_env(JOB, with_checkpoints, 0, 0)}
    assert names - set(c.NCCL_DEFAULTS) - set(c.RESERVED_ENV_NAMES) == set()


def test_in_place_pods_run_a_resident_launcher_at_the_attempts_generation() -> None:
    template = {"spec": {"containers": [{"name": "trainer"}]}}
    pod = build_worker_pod(JOB, spec(runPolicy={"restartStrategy": "InPlace"}), 1, 3, template)
    env = env_of(pod)
    assert (env["PHALANX_RESTART_IN_PLACE"], env["PHALANX_GENERATION"], env["PHALANX_ATTEMPT"]) == (
        "true",
        "3",
        "3",
    )
    assert env["PHALANX_CONTROL_PORT"] == "9399"
    assert {"name": "control", "containerPort": 9399, "protocol": "TCP"} in trainer_of(pod)["ports"]
    assert pod["metadata"]["annotations"]["phalanx.dev/resident-launcher"] == "true"


def test_full_restart_is_the_default_and_sets_no_launcher_env() -> None:
    s = spec()
    assert s.run_policy.restart_strategy == "FullRestart"
    env = env_of(build_worker_pod(JOB, s, 1, 3, {"spec": {"containers": [{"name": "trainer"}]}}))
    assert not {"PHALANX_RESTART_IN_PLACE", "PHALANX_GENERATION", "PHALANX_CONTROL_PORT"} & set(env)
    pod = build_worker_pod(JOB, s, 1, 3, {"spec": {"containers": [{"name": "trainer"}]}})
    assert "phalanx.dev/resident-launcher" not in pod["metadata"]["annotations"]


def test_a_hang_bound_in_the_spec_sets_the_trainers_collective_timeout_above_it() -> None:
    from phalanx import constants as c
    from phalanx.builders.pods import contract_env

    env = {e["name"]: e["value"] for e in contract_env(JOB, spec(runPolicy={"hangTimeoutSeconds": 45}), 0, 0)}
    assert env[c.ENV_COLLECTIVE_TIMEOUT] == str(c.HANG_COLLECTIVE_FLOOR_SECONDS)  # a restore may take longer
    env = {
        e["name"]: e["value"] for e in contract_env(JOB, spec(runPolicy={"hangTimeoutSeconds": 3600}), 0, 0)
    }
    assert env[c.ENV_COLLECTIVE_TIMEOUT] == str(3600 + c.HANG_COLLECTIVE_MARGIN_SECONDS)
    # Unset, the trainer keeps its own default (torch's, or 30 s with restart in place).
    assert c.ENV_COLLECTIVE_TIMEOUT not in {e["name"] for e in contract_env(JOB, spec(), 0, 0)}


def test_an_in_place_pod_carries_its_control_token_in_an_annotation_the_launcher_reads() -> None:
    from phalanx import constants as c
    from phalanx.builders.pods import build_worker_pod

    in_place = spec(runPolicy={"restartStrategy": "InPlace"})
    template = {"spec": {"containers": [{"name": "trainer", "image": "t"}]}}
    pod = build_worker_pod(JOB, in_place, 0, 0, template, control_token="tok")
    assert pod["metadata"]["annotations"][c.ANNOTATION_CONTROL_TOKEN] == "tok"
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    source = env[c.ENV_CONTROL_TOKEN]["valueFrom"]["fieldRef"]["fieldPath"]
    assert (
        source == f"metadata.annotations['{c.ANNOTATION_CONTROL_TOKEN}']"
        and "value" not in env[c.ENV_CONTROL_TOKEN]
    )
    # A full restart's pods run no control server: no token.
    plain = build_worker_pod(JOB, spec(), 0, 0, template, control_token="tok")
    assert c.ANNOTATION_CONTROL_TOKEN not in (plain["metadata"].get("annotations") or {})


def test_a_torchrun_in_place_pod_gets_torchruns_elastic_settings_and_no_control_server() -> None:
    from phalanx import constants as c
    from phalanx.builders.pods import build_worker_pod
    from phalanx.policy.in_place import runs_resident_launcher, takes_generations

    torchrun = spec(
        runPolicy={"restartStrategy": "InPlace", "inPlaceLauncher": "Torchrun", "backoffLimit": 4}
    )
    template = {"spec": {"containers": [{"name": "trainer", "image": "t", "command": ["torchrun", "x.py"]}]}}
    pod = build_worker_pod(JOB, torchrun, 1, 0, template, control_token="tok")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    # The operator keeps the budget (preemptions free): the agents get one they never reach.
    assert env[c.ENV_PET_RDZV_BACKEND] == "c10d" and env[c.ENV_PET_MAX_RESTARTS] == str(
        c.TORCHRUN_IN_PLACE_MAX_RESTARTS
    )
    assert "join_timeout=" in env[c.ENV_PET_RDZV_CONF]
    assert env[c.ENV_PET_RDZV_ID] == JOB.uid and env[c.ENV_PET_LOCAL_ADDR].startswith(f"{JOB.name}-worker-1.")
    assert c.ENV_RESTART_IN_PLACE not in env and c.ENV_CONTROL_TOKEN not in env
    assert not any(
        p["containerPort"] == c.DEFAULT_CONTROL_PORT for p in pod["spec"]["containers"][0]["ports"]
    )
    assert runs_resident_launcher(pod) and not takes_generations(pod)  # kept in place, never POSTed


def test_kept_ranks_wait_at_the_rendezvous_as_long_as_a_replacement_may_take_to_arrive() -> None:
    # From the in-place review (M3): a kept pod's workers start waiting for the replacement the
    # moment the generation is posted; the lost pod's grace period, admission and the gang timeout
    # may all pass before it arrives. A rendezvous timeout shorter than that ended the generation
    # (exit 76) before the replacement came, every time the timeout was set short.
    from phalanx import constants as c
    from phalanx.builders.pods import build_worker_pod

    runs = {"restartStrategy": "InPlace", "terminationGracePeriodSeconds": 30}
    short = spec(
        runPolicy=runs, rendezvous={"timeoutSeconds": 60}, scheduling={"gang": {"timeoutSeconds": 120}}
    )
    template = {"spec": {"containers": [{"name": "trainer", "image": "t"}]}}
    env = env_of(build_worker_pod(JOB, short, 1, 0, template))
    assert int(env[c.ENV_RENDEZVOUS_TIMEOUT]) >= 30 + 120 + 60
    # A full restart's rendezvous is the spec's, as set.
    full = spec(rendezvous={"timeoutSeconds": 60}, scheduling={"gang": {"timeoutSeconds": 120}})
    assert env_of(build_worker_pod(JOB, full, 1, 0, template))[c.ENV_RENDEZVOUS_TIMEOUT] == "60"


def test_every_pod_carries_its_attempts_size_as_a_label() -> None:
    pod = build_worker_pod(JOB, spec(), 1, 0, {"spec": {"containers": [{"name": "trainer"}]}})
    assert pod["metadata"]["labels"]["phalanx.dev/gang-size"] == "2"


def test_a_spare_is_a_worker_in_all_but_its_rank() -> None:
    template = {
        "spec": {"containers": [{"name": "trainer", "image": "t"}, {"name": "sidecar", "image": "s"}]}
    }
    in_place = spec(runPolicy={"restartStrategy": "InPlace"}, spares=1)
    worker = build_worker_pod(JOB, in_place, 1, 2, template, control_token="w")
    spare = build_spare_pod(JOB, in_place, 0, 2, template, control_token="s")
    assert spare["metadata"]["name"] == "gpt-spare-0" and spare["spec"]["hostname"] == "gpt-spare-0"
    labels = spare["metadata"]["labels"]
    assert labels["phalanx.dev/spare"] == "true" and "phalanx.dev/replica-index" not in labels
    assert labels["phalanx.dev/attempt"] == "2" and labels["phalanx.dev/gang-size"] == "2"
    env = env_of(spare)
    assert env["PHALANX_SPARE"] == "true" and env["PHALANX_RESTART_IN_PLACE"] == "true"
    assert "NODE_RANK" not in env and "PET_NODE_RANK" not in env  # its first generation says which
    assert (
        env["WORLD_SIZE"] == env_of(worker)["WORLD_SIZE"]
        and env["MASTER_ADDR"] == env_of(worker)["MASTER_ADDR"]
    )
    assert trainer_of(spare)["resources"] == trainer_of(worker)["resources"]  # counted as a worker is
    assert spare["spec"]["schedulingGates"] == worker["spec"]["schedulingGates"]
    assert spare["metadata"]["annotations"]["phalanx.dev/control-token"] == "s"
    assert spare["metadata"]["annotations"]["phalanx.dev/resident-launcher"] == "true"
    probe = trainer_of(spare)["readinessProbe"]  # Ready once its launcher answers: imports done
    assert probe["httpGet"] == {"path": "/generation", "port": 9399}
    assert "readinessProbe" not in trainer_of(worker)


def test_a_spare_has_no_liveness_or_startup_probe_it_has_no_worker_to_probe() -> None:
    probe = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10}
    trainer = {"name": "trainer", "image": "t", "livenessProbe": probe, "startupProbe": probe}
    template = {"spec": {"containers": [trainer, {"name": "sidecar", "image": "s", "livenessProbe": probe}]}}
    in_place = spec(runPolicy={"restartStrategy": "InPlace"}, spares=1)
    spare = build_spare_pod(JOB, in_place, 0, 0, template)
    assert "livenessProbe" not in trainer_of(spare) and "startupProbe" not in trainer_of(spare)
    sidecar = next(c for c in spare["spec"]["containers"] if c["name"] == "sidecar")
    assert sidecar["livenessProbe"] == probe  # not the trainer's: the sidecar runs as on a worker
    assert trainer_of(build_worker_pod(JOB, in_place, 0, 0, template))["livenessProbe"] == probe
