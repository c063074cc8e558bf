"""kopf's diff base is off: the operator registers only on.event, which needs none, and kopf would
otherwise deep-copy every TrainingJob event (managed fields and status included) to build one."""

from __future__ import annotations

import kopf
import pytest

from phalanx import handlers

pytestmark = pytest.mark.unit

JOB = {
    "apiVersion": "phalanx.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {
        "name": "j",
        "namespace": "ns",
        "uid": "u1",
        "annotations": {"team": "a"},
        "managedFields": [{"manager": "phalanx", "fieldsV1": {"f:status": {}}}],
    },  # fmt: skip
    "spec": {"replicas": 2},
    "status": {"phase": "Running", "progress": {"step": 5}},
}


def test_no_diff_base_is_built_read_or_written() -> None:
    settings = kopf.OperatorSettings()
    handlers.tune(settings)  # what the startup handler applies
    storage = settings.persistence.diffbase_storage
    assert isinstance(storage, handlers.NoDiffBase)
    body = kopf.Body(JOB)
    patch = kopf.Patch()
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None
    storage.store(body=body, patch=patch, essence={"spec": {"replicas": 2}})
    assert not patch  # no last-handled-configuration annotation written per event


def test_the_operator_registers_no_handler_that_needs_a_diff_base() -> None:
    # If a change-detecting handler (on.create/update/resume/delete/field) is ever added, it needs
    # kopf's diff base back: this fails first.
    registry = kopf.get_default_registry()
    assert registry._changing.get_all_handlers() == []  # noqa: SLF001 (kopf has no public view)
    assert registry._watching.get_all_handlers()  # noqa: SLF001 (the on.event handler)
