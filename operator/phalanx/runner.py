"""Runs the operator: metrics server, and the handlers (which serve /healthz and /readyz)."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import sys

from phalanx.settings import OperatorSettings

GLIBC_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)
MALLOC_ARENAS = 2


def limit_malloc_arenas(count: int = MALLOC_ARENAS) -> bool:
    """glibc gives threads that allocate at once separate arenas (up to 8 per core) and keeps what
    is freed in each. The operator's threads mostly wait on sockets, so two arenas cost nothing in
    speed and keep the resident set from growing with every burst. Must run before threads start;
    a no-op off glibc (MALLOC_ARENA_MAX in the environment does the same there)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(GLIBC_M_ARENA_MAX, count))
    except (OSError, AttributeError):
        return False


def keep_kubernetes_package_out() -> bool:
    """kopf imports the kubernetes package whenever it is installed (it is: the developer tools use
    it), only to recognise that client's model objects and to borrow its login; the operator passes
    kopf plain dicts, speaks to the API server through kube_client.py and gives kopf the same
    credentials (handlers.login). Marking the package absent before kopf loads saves ~17 MiB of
    resident memory. Process-wide: `import kubernetes` raises ImportError from then on (and
    importlib.util.find_spec ValueError); .importlinter keeps the operator's modules off it. False
    when something imported the package already."""
    if "kubernetes" in sys.modules and sys.modules["kubernetes"] is not None:
        return False
    sys.modules["kubernetes"] = None  # type: ignore[assignment]  # import now raises ImportError
    return True


def run_operator(
    settings: OperatorSettings,
    metrics_port: int,
    health_port: int,
    verbose: bool,
    metrics_bind_address: str = "0.0.0.0",
    health_bind_address: str = "0.0.0.0",
) -> None:
    limit_malloc_arenas()
    keep_kubernetes_package_out()
    from phalanx.kube_client import ConfigError, load_credentials

    try:  # before kopf, which would retry its startup and login handlers forever
        load_credentials()
    except ConfigError as exc:
        raise SystemExit(f"phalanx operator: {exc}") from exc
    import kopf

    import phalanx.handlers  # noqa: F401  (registers the handlers)
    from phalanx import metrics

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kopf's own per-object logs are noisy at INFO for a busy cluster.
    logging.getLogger("kopf").setLevel(logging.DEBUG if verbose else logging.WARNING)
    if metrics_port:
        metrics.start_metrics_server(metrics_port, metrics_bind_address)
    # Our own /healthz and /readyz (health.py, started by handlers.configure), not kopf's liveness
    # endpoint: readiness needs the stores and the election, which kopf does not know.
    health_endpoint = (health_bind_address, health_port) if health_port else None
    namespaces = list(settings.namespaces)
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,  # no kopf peering: our own Lease decides who writes (leader.py)
            memo=kopf.Memo(settings=settings, health_endpoint=health_endpoint),
        )
    )
