"""Deterministic names: a handler that runs twice finds what the first run created."""

from __future__ import annotations

DNS_LABEL_MAX = 63


def worker_pod_name(job_name: str, index: int, attempt: int | None = None) -> str:
    """<job>-worker-<index>; with `attempt`, <job>-worker-<index>-a<attempt>: the names of an attempt
    started while pods of an earlier one linger on a lost node (policy/node_loss.py)."""
    plain = f"{job_name}-worker-{index}"
    return plain if attempt is None else f"{plain}-a{attempt}"


def worker_hostname(job_name: str, index: int, attempt: int | None = None) -> str:
    """The pod's DNS label under the job's Service: its name, shortened to fit 63 characters (unique
    within that Service, the job's own)."""
    name = worker_pod_name(job_name, index, attempt)
    return name if len(name) <= DNS_LABEL_MAX else f"worker-{index}-a{attempt}"


def spare_pod_name(job_name: str, number: int) -> str:
    """<job>-spare-<number>: a warm spare (spec.spares). Numbers are never reused while a pod holds
    one, so a spare that took a rank keeps its name beside its successor's (policy/spares.py)."""
    return f"{job_name}-spare-{number}"


def service_name(job_name: str) -> str:
    return job_name


def worker_fqdn(
    job_name: str,
    namespace: str,
    index: int,
    cluster_domain: str = "cluster.local",
    attempt: int | None = None,
) -> str:
    host = worker_hostname(job_name, index, attempt)
    return f"{host}.{service_name(job_name)}.{namespace}.svc.{cluster_domain}"


def master_addr(
    job_name: str, namespace: str, cluster_domain: str = "cluster.local", attempt: int | None = None
) -> str:
    """MASTER_ADDR: rank 0's DNS name, `attempt` when the attempt's pods carry it in their names.
    The one derivation for the pods' contract (builders/pods.contract_env) and for a warm spare told
    its rank (controller/generations.py)."""
    return worker_fqdn(job_name, namespace, 0, cluster_domain, attempt)


def master_addr_of(job_name: str, namespace: str, rank0: str, attempt: int, cluster_domain: str) -> str:
    """MASTER_ADDR from rank 0's pod name `rank0` in `attempt`: its name says whether the attempt
    took `-a<attempt>` names."""
    plain = rank0 == worker_pod_name(job_name, 0)
    return master_addr(job_name, namespace, cluster_domain, None if plain else attempt)


def podgroup_name(job_name: str) -> str:
    return job_name
