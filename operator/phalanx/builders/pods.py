"""Worker pods and the headless Service of a TrainingJob (pure: dicts in, dicts out)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from phalanx import constants as c
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.names import (
    DNS_LABEL_MAX,
    master_addr,
    service_name,
    spare_pod_name,
    worker_fqdn,
    worker_hostname,
    worker_pod_name,
)
from phalanx.builders.torchrun_env import elastic_env
from phalanx.pod_facts import NODE_NAME_FIELD
from phalanx.providers import provider_for

SHM_VOLUME = "phalanx-dshm"
CHECKPOINT_VOLUME = "phalanx-checkpoints"


@dataclass(frozen=True)
class JobRef:
    """The identity of the owning TrainingJob."""

    name: str
    namespace: str
    uid: str

    @staticmethod
    def of(job: dict[str, Any]) -> JobRef:
        meta = job["metadata"]
        return JobRef(meta["name"], meta["namespace"], meta["uid"])

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def selector_labels(job: JobRef) -> dict[str, str]:
    return {c.LABEL_JOB_NAME: job.name}


def common_labels(job: JobRef) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "phalanx-trainer",
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/part-of": "phalanx",
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        **selector_labels(job),
    }


def accelerator_limits(spec: TrainingJobSpec) -> dict[str, str]:
    if spec.resources.mig is not None:
        mig = spec.resources.mig
        return {f"{c.MIG_RESOURCE_PREFIX}{mig.profile}": str(mig.count)}
    if spec.resources.gpus:
        return {c.GPU_RESOURCE: str(spec.resources.gpus)}
    return {}


def torchrun_in_place(spec: TrainingJobSpec) -> bool:
    """Restart in place through torchrun's elastic agent (spec.runPolicy.inPlaceLauncher Torchrun)."""
    policy = spec.run_policy
    return policy.restart_strategy == c.RESTART_STRATEGY_IN_PLACE and (
        policy.in_place_launcher == c.IN_PLACE_LAUNCHER_TORCHRUN
    )


def rendezvous_timeout_seconds(spec: TrainingJobSpec) -> int:
    """How long a rank waits for its peers. Restarting in place, the kept ranks start waiting for
    the replacement when the generation is posted, and the lost pod's grace period, admission and
    the gang timeout may all pass before it arrives: they wait that long, or the spec's when longer."""
    timeout = spec.rendezvous.timeout_seconds
    if spec.run_policy.restart_strategy != c.RESTART_STRATEGY_IN_PLACE:
        return timeout
    arrival = spec.run_policy.termination_grace_period_seconds + spec.scheduling.gang.timeout_seconds
    return max(timeout, arrival + c.REPLACEMENT_START_MARGIN_SECONDS)


def contract_env(
    job: JobRef,
    spec: TrainingJobSpec,
    index: int,
    attempt: int,
    cluster_domain: str = "cluster.local",
    attempt_in_name: bool = False,
) -> list[dict[str, str]]:
    """The environment contract of docs/environment.md for replica `index`."""
    master = master_addr(job.name, job.namespace, cluster_domain, attempt if attempt_in_name else None)
    port = str(spec.rendezvous.port)
    nnodes, nproc = str(spec.replicas), str(spec.effective_procs_per_replica)
    values: dict[str, str] = {
        c.ENV_MASTER_ADDR: master,
        c.ENV_MASTER_PORT: port,
        c.ENV_WORLD_SIZE: str(spec.world_size),
        c.ENV_NNODES: nnodes,
        c.ENV_NODE_RANK: str(index),
        c.ENV_NPROC_PER_NODE: nproc,
        c.ENV_PET_NNODES: nnodes,
        c.ENV_PET_NPROC_PER_NODE: nproc,
        c.ENV_PET_NODE_RANK: str(index),
        c.ENV_PET_MASTER_ADDR: master,
        c.ENV_PET_MASTER_PORT: port,
        c.ENV_JOB_NAME: job.name,
        c.ENV_JOB_UID: job.uid,
        c.ENV_ATTEMPT: str(attempt),
        c.ENV_CHECKPOINT_DIR: spec.checkpoint.path,
        c.ENV_CHECKPOINT_KEEP: str(spec.checkpoint.keep),
        c.ENV_METRICS_PORT: str(c.DEFAULT_METRICS_PORT),
        c.ENV_RENDEZVOUS_TIMEOUT: str(rendezvous_timeout_seconds(spec)),
        c.ENV_PREEMPTION_EXIT_CODE: str(c.EXIT_CHECKPOINTED_ON_PREEMPTION),
        c.ENV_GRACE_PERIOD: str(spec.run_policy.termination_grace_period_seconds),
    }
    if torchrun_in_place(spec):
        # torchrun's elastic agent keeps the pod's processes and re-forms the gang by itself.
        local = worker_fqdn(
            job.name, job.namespace, index, cluster_domain, attempt if attempt_in_name else None
        )
        values.update(elastic_env(
            spec.replicas, spec.effective_procs_per_replica, master, spec.rendezvous.port, job.uid,
            c.TORCHRUN_IN_PLACE_MAX_RESTARTS, replica_index=index, local_addr=local,
            join_timeout_seconds=rendezvous_timeout_seconds(spec),
        ))  # fmt: skip
    elif spec.run_policy.restart_strategy == c.RESTART_STRATEGY_IN_PLACE:
        # A resident launcher (docs/trainer.md, "Restart in place"): the restart generation is the
        # attempt, so a replacement pod joins the generation its kept peers are told to start.
        values[c.ENV_RESTART_IN_PLACE] = "true"
        values[c.ENV_GENERATION] = str(attempt)
        values[c.ENV_CONTROL_PORT] = str(c.DEFAULT_CONTROL_PORT)
    if spec.checkpoint.interval_steps:
        values[c.ENV_CHECKPOINT_INTERVAL] = str(spec.checkpoint.interval_steps)
    if spec.run_policy.hang_timeout_seconds is not None:
        hang_timeout = spec.run_policy.hang_timeout_seconds + c.HANG_COLLECTIVE_MARGIN_SECONDS
        values[c.ENV_COLLECTIVE_TIMEOUT] = str(max(hang_timeout, c.HANG_COLLECTIVE_FLOOR_SECONDS))
    if spec.nccl is not None:
        if spec.nccl.debug:
            values["NCCL_DEBUG"] = spec.nccl.debug
        if spec.nccl.socket_ifname:
            values["NCCL_SOCKET_IFNAME"] = spec.nccl.socket_ifname
        if spec.nccl.ib_disable is not None:
            values["NCCL_IB_DISABLE"] = "1" if spec.nccl.ib_disable else "0"
    return [{"name": k, "value": v} for k, v in values.items()]


def _merge_env(contract: list[dict[str, str]], user: list[dict[str, Any]]) -> list[dict[str, Any]]:
    user_names = {e["name"] for e in user}
    defaults = [{"name": k, "value": v} for k, v in c.NCCL_DEFAULTS.items() if k not in user_names]
    # The contract comes first and the user's env after it, so `$(MASTER_ADDR)` expansions work.
    return [*contract, *defaults, *user]


def _add_limits(container: dict[str, Any], limits: dict[str, str]) -> None:
    if not limits:
        return
    resources = container.setdefault("resources", {})
    resources.setdefault("limits", {}).update(limits)
    resources.setdefault("requests", {}).update(limits)  # extended resources: requests = limits


def build_worker_pod(
    job: JobRef,
    spec: TrainingJobSpec,
    index: int,
    attempt: int,
    template: dict[str, Any],
    *,
    cluster_domain: str = "cluster.local",
    attempt_in_name: bool = False,
    avoid_nodes: Sequence[str] = (),
    control_token: str | None = None,
) -> dict[str, Any]:
    """Pod `<job>-worker-<index>` of `attempt` (`<job>-worker-<index>-a<attempt>` with attempt_in_name,
    see policy/node_loss.py), kept off `avoid_nodes` (lost nodes where the previous attempt's pods
    linger). `template` is spec.template as the user wrote it."""
    template = copy.deepcopy(template)
    meta_in = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template.get("spec") or {}
    named_attempt = attempt if attempt_in_name else None
    name = worker_pod_name(job.name, index, named_attempt)
    labels = {
        **(meta_in.get("labels") or {}),
        **common_labels(job),
        c.LABEL_REPLICA_INDEX: str(index),
        c.LABEL_ATTEMPT: str(attempt),
        c.LABEL_GANG_SIZE: str(spec.replicas),
    }
    annotations = dict(meta_in.get("annotations") or {})
    if torchrun_in_place(spec):
        annotations[c.ANNOTATION_RESIDENT_LAUNCHER] = c.RESIDENT_TORCHRUN
    elif spec.run_policy.restart_strategy == c.RESTART_STRATEGY_IN_PLACE:
        annotations[c.ANNOTATION_RESIDENT_LAUNCHER] = "true"
        if control_token:
            annotations[c.ANNOTATION_CONTROL_TOKEN] = control_token

    pod_spec["hostname"] = worker_hostname(job.name, index, named_attempt)
    annotations.pop(c.ANNOTATION_AVOIDED_NODES, None)  # the operator's alone: a template's copy would loop
    if avoid_nodes:
        avoid = {"key": NODE_NAME_FIELD, "operator": "NotIn", "values": sorted(avoid_nodes)}
        pod_spec["affinity"] = _narrowed_affinity(pod_spec.get("affinity"), avoid)
        annotations[c.ANNOTATION_AVOIDED_NODES] = ",".join(sorted(avoid_nodes))  # as built: rules/creation.py
    pod_spec["subdomain"] = service_name(job.name)
    pod_spec["restartPolicy"] = "Never"
    pod_spec["terminationGracePeriodSeconds"] = spec.run_policy.termination_grace_period_seconds
    pod_spec.setdefault("automountServiceAccountToken", False)
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name

    provider_for(spec).shape_pod(pod_spec, labels, annotations, group=job.name)

    limits = accelerator_limits(spec)
    if limits:
        tolerations = pod_spec.setdefault("tolerations", [])
        if not any(t.get("key") == c.GPU_RESOURCE for t in tolerations):
            tolerations.append({"key": c.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})

    volumes = pod_spec.setdefault("volumes", [])
    volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}})
    mounts = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    if spec.checkpoint.volume is not None:
        from phalanx.api.schema import to_json

        volumes.append({"name": CHECKPOINT_VOLUME, **to_json(spec.checkpoint.volume)})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.path})

    for container in pod_spec.get("containers", []):
        if container.get("name") != c.TRAINER_CONTAINER:
            continue
        container["env"] = _merge_env(
            contract_env(job, spec, index, attempt, cluster_domain, attempt_in_name),
            container.get("env") or [],
        )
        if c.ANNOTATION_CONTROL_TOKEN in annotations:
            # From the pod's own annotation, not a literal: the operator reads it back from its
            # pod store (which keeps metadata, not the containers' env) to authenticate its POSTs.
            path = f"metadata.annotations['{c.ANNOTATION_CONTROL_TOKEN}']"
            container["env"].insert(
                0, {"name": c.ENV_CONTROL_TOKEN, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            )
        _add_limits(container, limits)
        # A trainer that dies of a device error prints it last: with this the kubelet puts the log's
        # tail in the termination message, where pod_outcome.device_error looks for it.
        container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
        container["volumeMounts"] = [*(container.get("volumeMounts") or []), *mounts]
        ports = container.setdefault("ports", [])
        if not any(p.get("name") == "metrics" for p in ports):
            ports.append({"name": "metrics", "containerPort": c.DEFAULT_METRICS_PORT, "protocol": "TCP"})
        in_place = spec.run_policy.restart_strategy == c.RESTART_STRATEGY_IN_PLACE and not torchrun_in_place(
            spec
        )
        if in_place and not any(p.get("containerPort") == c.DEFAULT_CONTROL_PORT for p in ports):
            ports.append({"name": "control", "containerPort": c.DEFAULT_CONTROL_PORT, "protocol": "TCP"})
        if not any(p.get("containerPort") == spec.rendezvous.port for p in ports):
            ports.append({"name": "rendezvous", "containerPort": spec.rendezvous.port, "protocol": "TCP"})

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [job.owner_reference()],
        },
        "spec": pod_spec,
    }


def build_spare_pod(
    job: JobRef,
    spec: TrainingJobSpec,
    number: int,
    attempt: int,
    template: dict[str, Any],
    *,
    cluster_domain: str = "cluster.local",
    attempt_in_name: bool = False,
    avoid_nodes: Sequence[str] = (),
    control_token: str | None = None,
) -> dict[str, Any]:
    """Warm spare `<job>-spare-<number>` (spec.spares): a worker pod in all but its rank. Same
    resources, template and contract, PHALANX_SPARE=true and no NODE_RANK: its resident launcher does
    its imports and starts no worker until its first POST /generation assigns it a rank
    (docs/trainer.md, "Restart in place"). Labelled spare instead of a replica index (pod_facts.is_spare),
    and Ready only once its launcher's control server answers (its readiness probe)."""
    pod = build_worker_pod(job, spec, 0, attempt, template, cluster_domain=cluster_domain,
                           attempt_in_name=attempt_in_name, avoid_nodes=avoid_nodes,
                           control_token=control_token)  # fmt: skip
    name = spare_pod_name(job.name, number)
    pod["metadata"]["name"] = name
    labels = pod["metadata"]["labels"]
    labels.pop(c.LABEL_REPLICA_INDEX, None)
    labels[c.LABEL_SPARE] = "true"
    pod["spec"]["hostname"] = name if len(name) <= DNS_LABEL_MAX else f"spare-{number}"
    no_rank = (c.ENV_NODE_RANK, c.ENV_PET_NODE_RANK)
    for container in pod["spec"].get("containers", []):
        if container.get("name") != c.TRAINER_CONTAINER:
            continue
        env = [e for e in container.get("env") or [] if e.get("name") not in no_rank]
        container["env"] = [{"name": c.ENV_SPARE, "value": "true"}, *env]
        # Ready once its launcher answers, which is once its imports are done: a spare that is not
        # warm yet is not given a rank (policy/spares.py). The template's probe is not the spare's:
        # it has no worker to probe.
        # Nor are its liveness and startup probes: they would kill an idle spare every period.
        container.pop("livenessProbe", None)
        container.pop("startupProbe", None)
        container["readinessProbe"] = {
            "httpGet": {"path": c.GENERATION_PATH, "port": c.DEFAULT_CONTROL_PORT},
            "periodSeconds": c.SPARE_READINESS_PERIOD_SECONDS,
            "failureThreshold": 1,
        }
    return pod


def build_headless_service(job: JobRef, spec: TrainingJobSpec) -> dict[str, Any]:
    """Gives every worker the DNS name <pod>.<job>.<ns>.svc, resolvable before the pod is Ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job.name),
            "namespace": job.namespace,
            "labels": common_labels(job),
            "ownerReferences": [job.owner_reference()],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(job),
            "ports": [
                {"name": "rendezvous", "port": spec.rendezvous.port, "targetPort": spec.rendezvous.port}
            ],
        },
    }


def admitted_pod(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """The worker pod as gang admission leaves it: pinned to its planned node, gang gate gone.

    Used when a gang is admitted at creation (nothing waits and it fits): creating the pod this way
    saves the gate-lifting write per pod, and the pod is the same as one admitted a moment later.

    The pin names the node itself (matchFields on metadata.name, as the DaemonSet controller pins),
    not its kubernetes.io/hostname label: that label differs from the node's name on clusters with
    hostname overrides and on some clouds. A gated pod's required node affinity may only narrow, so
    the field is added to every term the template has (the node matched one of them when admitted).
    """
    spec = dict(pod["spec"])
    spec["affinity"] = _pinned_affinity(spec.get("affinity"), node)
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != c.GANG_SCHEDULING_GATE]
    if gates:
        spec["schedulingGates"] = gates
    else:
        spec.pop("schedulingGates", None)
    return {**pod, "spec": spec}


def _pinned_affinity(affinity: dict[str, Any] | None, node: str) -> dict[str, Any]:
    return _narrowed_affinity(affinity, {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]})


def _narrowed_affinity(affinity: dict[str, Any] | None, field: dict[str, Any]) -> dict[str, Any]:
    """The affinity with a matchFields requirement added to every required node selector term."""
    affinity = copy.deepcopy(affinity or {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), field]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {**required, "nodeSelectorTerms": terms}
    return affinity
