"""kopf handlers: the only module that imports kopf. Each handler only tells the controller which
TrainingJob to look at; the controller decides (controller.py, reconcile/lifecycle.py). Pods and
nodes are watched by the controller's own reflectors (reflector.py), which also feed its caches."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from phalanx import constants as c
from phalanx.controller import Controller
from phalanx.k8s import KubeApi, load_api_client


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and diff-base live in annotations, so the status schema stays strict.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # Keep watches fresh behind load balancers that drop idle connections.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.error_backoffs = [1, 2, 5, 10]
    namespaces = [n for n in os.environ.get("PHALANX_NAMESPACES", "").split(",") if n]
    domain = os.environ.get("PHALANX_CLUSTER_DOMAIN", "cluster.local")
    controller = Controller(KubeApi(load_api_client()), namespaces, cluster_domain=domain)
    controller.loop = asyncio.get_running_loop()
    await controller.start()
    memo.controller = controller


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    controller: Controller | None = getattr(memo, "controller", None)
    if controller is not None:
        await controller.stop()


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
async def trainingjob_event(
    event: kopf.RawEvent, namespace: str | None, name: str, memo: Any, **_: Any
) -> None:
    # async on purpose: kopf runs it on its event loop, the thread that owns the controller's queue
    # and sets (a plain def would run in kopf's thread pool and race the workers).
    controller: Controller = memo.controller
    key = f"{namespace}/{name}"
    if event.get("type") == "DELETED":
        controller.forget(key)
        controller.admission_dirty.set()
        return
    controller.job_event(key, event.get("object") or {})
