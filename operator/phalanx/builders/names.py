"""Deterministic names: a handler that runs twice finds what the first run created."""

from __future__ import annotations


def worker_pod_name(job_name: str, index: int) -> str:
    return f"{job_name}-worker-{index}"


def service_name(job_name: str) -> str:
    return job_name


def worker_fqdn(job_name: str, namespace: str, index: int, cluster_domain: str = "cluster.local") -> str:
    return f"{worker_pod_name(job_name, index)}.{service_name(job_name)}.{namespace}.svc.{cluster_domain}"


def podgroup_name(job_name: str) -> str:
    return job_name
