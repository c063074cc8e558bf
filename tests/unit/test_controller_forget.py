"""Controller.forget after a job's delete event: what each part kept for the key goes, unless the
name already belongs to a successor."""

from __future__ import annotations

import pytest

from phalanx import metrics
from phalanx.controller import Controller
from phalanx.settings import OperatorSettings

pytestmark = pytest.mark.unit

KEY = "ns-forget/j"


def job(uid: str) -> dict[str, object]:
    return {"metadata": {"name": "j", "namespace": "ns-forget", "uid": uid, "resourceVersion": "7"},
            "spec": {}, "status": {}}  # fmt: skip


@pytest.fixture
def controller() -> Controller:
    made = Controller(api=None, settings=OperatorSettings(), workers=2)  # type: ignore[arg-type]
    metrics.forget_job("ns-forget", "j")
    metrics.observe_job_created("ns-forget", "j")
    return made


def series() -> float | None:
    return metrics.REGISTRY.get_sample_value(
        "phalanx_job_progress_ratio", {"namespace": "ns-forget", "trainingjob": "j"}
    )


def test_a_predecessors_late_delete_event_leaves_the_successors_state(controller: Controller) -> None:
    # kopf's per-object worker waits a moment before it handles an event; the operator's own watch
    # does not, so the successor (same name, new uid) may be stored and reconciled first.
    controller.stores.jobs.upsert(job("uid-new"))
    controller.reconciler.known_jobs.add(KEY)
    metrics.observe_progress("ns-forget", "j", 1, 10)
    controller.forget(KEY, "uid-old")
    assert KEY in controller.reconciler.known_jobs and series() == 0.1
    controller.forget(KEY, "uid-new")  # its own deletion
    assert KEY not in controller.reconciler.known_jobs and series() is None


def test_a_delete_whose_uid_is_not_known_still_forgets(controller: Controller) -> None:
    controller.stores.jobs.upsert(job("uid-new"))
    controller.reconciler.known_jobs.add(KEY)
    controller.forget(KEY)
    assert KEY not in controller.reconciler.known_jobs
