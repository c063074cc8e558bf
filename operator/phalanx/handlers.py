"""kopf handlers: the only module that imports kopf. Each handler only tells the controller which
TrainingJob to look at; the controller decides (controller/, reconcile/lifecycle.py). Pods and
nodes are watched by the controller's own reflectors (reflector.py), which also feed its caches."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kopf

from phalanx import constants as c
from phalanx import metrics
from phalanx.api.crd import expected_digest, installed_digest, stale_crd_message
from phalanx.controller import Controller
from phalanx.health import HealthServer, operator_readiness
from phalanx.k8s import KubeApi, LeaseApi, load_lease_client
from phalanx.kube_client import ConfigError, Credentials, load_client, load_credentials
from phalanx.leader import LeaderElector
from phalanx.settings import LeaderElection, OperatorSettings

LEADERSHIP_LOST_EXIT_CODE = 3
LOGIN_RETRY_SECONDS = 10


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf keeps a diff base for change-detecting handlers (on.create, on.update, on.resume), and
    builds one for every event whatever the handlers: a deep copy of the whole object, managed
    fields and status included. This operator has only on.event (the controller decides from the
    object as it is), so none is built, read or stored."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return {}

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def tune(settings: kopf.OperatorSettings) -> None:
    """kopf's settings for this operator."""
    # Progress lives in annotations, so the status schema stays strict; no diff base (see there).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.WARNING
    # Keep watches fresh behind load balancers that drop idle connections.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.error_backoffs = [1, 2, 5, 10]


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's watches log in as the operator's own requests do (kube_client.py): one reading of the
    service account or kubeconfig. After a 401 kopf logs in again, which reads a rotated token.
    runner.py checks the credentials before kopf starts; one that breaks later (a kubeconfig being
    rewritten) is tried again, since a failed login would leave kopf's watches waiting for good."""
    try:
        return connection_info(load_credentials())
    except ConfigError as exc:
        raise kopf.TemporaryError(str(exc), delay=LOGIN_RETRY_SECONDS) from exc


def connection_info(credentials: Credentials) -> kopf.ConnectionInfo:
    token = credentials.token
    if token is None and credentials.token_file:
        token = Path(credentials.token_file).read_text().strip()
    return kopf.ConnectionInfo(
        server=credentials.server,
        ca_path=credentials.ca_file,
        ca_data=credentials.ca_data,
        insecure=credentials.insecure or None,
        certificate_path=credentials.cert_file,
        private_key_path=credentials.key_file,
        token=token,
    )


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    tune(settings)
    operator_settings: OperatorSettings = (
        getattr(memo, "settings", None) or OperatorSettings.from_environment()
    )
    elector = start_election(operator_settings.leader_election)
    api = KubeApi(load_client(), write_fence=elector.fence if elector else None)
    await asyncio.to_thread(check_crd, api)
    controller = Controller(api, operator_settings, leader=elector)
    controller.loop = asyncio.get_running_loop()
    await controller.start()
    memo.controller = controller
    memo.elector = elector
    memo.health = start_health_server(getattr(memo, "health_endpoint", None), controller, elector)


def check_crd(api: KubeApi) -> None:
    """Says loudly when the installed CRD is not this operator's, and goes on: the jobs still run,
    but an older schema drops the status fields it lacks (api/crd.stale_crd_message)."""
    try:
        installed = api.trainingjob_crd()
    except Exception as exc:  # noqa: BLE001 - a check, never a reason not to start
        logging.getLogger("phalanx.crd").warning("could not read the TrainingJob CRD to check it: %s", exc)
        return
    expected = expected_digest()
    message = stale_crd_message(installed, expected)
    metrics.observe_crd_schema(installed_digest(installed), expected)
    if message:
        logging.getLogger("phalanx.crd").error(message)


def start_health_server(
    endpoint: tuple[str, int] | None, controller: Controller, elector: LeaderElector | None
) -> HealthServer | None:
    """/healthz and /readyz (health.py) on the operator's health port; None when it is off (0)."""
    if endpoint is None:
        return None
    stores = {
        "trainingjobs": controller.stores.jobs,
        "pods": controller.stores.pods,
        "nodes": controller.stores.nodes,
    }
    host, port = endpoint
    return HealthServer(host, port, asyncio.get_running_loop(), operator_readiness(stores, elector)).start()


def start_election(election: LeaderElection) -> LeaderElector | None:
    if not election.enabled:
        return None

    def lost() -> None:
        # As client-go's operators do: a leader that cannot renew stops; its pod restarts as a standby.
        logging.getLogger("phalanx.leader").error("leadership lost: exiting so that no stale leader writes")
        os._exit(LEADERSHIP_LOST_EXIT_CODE)

    return LeaderElector(
        LeaseApi(load_lease_client()),
        election.namespace,
        election.lease_name,
        election.identity,
        on_lost=lost,
        duration_seconds=election.lease_duration_seconds,
        renew_deadline_seconds=min(election.renew_deadline_seconds, election.lease_duration_seconds * 2 / 3),
        retry_period_seconds=election.retry_period_seconds,
    ).start()


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    controller: Controller | None = getattr(memo, "controller", None)
    elector: LeaderElector | None = getattr(memo, "elector", None)
    health: HealthServer | None = getattr(memo, "health", None)
    if health is not None:
        health.stop()
    if elector is not None:
        elector.close_fence()  # first: no new write passes; the lease stays ours while we drain
    drained = await controller.stop() if controller is not None else True
    if elector is not None:
        # Released only once no write of ours can land after it; otherwise it expires (15 s).
        await asyncio.to_thread(elector.stop, drained)


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
async def trainingjob_event(
    event: kopf.RawEvent, namespace: str | None, name: str, memo: Any, **_: Any
) -> None:
    # async on purpose: kopf runs it on its event loop, the thread that owns the controller's queue
    # and sets (a plain def would run in kopf's thread pool and race the workers).
    controller: Controller = memo.controller
    key = f"{namespace}/{name}"
    if event.get("type") == "DELETED":
        controller.forget(key, str(((event.get("object") or {}).get("metadata") or {}).get("uid") or ""))
        controller.admission_dirty.set()
        return
    controller.job_event(key, event.get("object") or {})
