"""Runs the operator: metrics server, kopf's liveness endpoint, and the handlers."""

from __future__ import annotations

import asyncio
import logging
import os


def run_operator(namespaces: list[str], metrics_port: int, health_port: int, verbose: bool) -> None:
    import kopf

    import phalanx.handlers  # noqa: F401  (registers the handlers)
    from phalanx import metrics

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kopf's own per-object logs are noisy at INFO for a busy cluster.
    logging.getLogger("kopf").setLevel(logging.DEBUG if verbose else logging.WARNING)
    os.environ["PHALANX_NAMESPACES"] = ",".join(namespaces)
    if metrics_port:
        metrics.start_metrics_server(metrics_port)
    liveness = f"http://0.0.0.0:{health_port}/healthz" if health_port else None
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            liveness_endpoint=liveness,
        )
    )
