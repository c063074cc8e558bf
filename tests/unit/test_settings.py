"""The operator's settings: read once at start, the command line over the environment (settings.py)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.controller import Controller
from phalanx.policy.node_loss import DEFAULT_NODE_LOST_AFTER_SECONDS
from phalanx.settings import OperatorSettings

pytestmark = pytest.mark.unit


def test_without_variables_the_defaults_hold() -> None:
    settings = OperatorSettings.from_environment({})
    assert settings.namespaces == () and settings.leader_election.enabled
    assert (settings.cluster_domain, settings.admit_on_creation) == ("cluster.local", True)
    assert settings.node_lost_after_seconds == DEFAULT_NODE_LOST_AFTER_SECONDS


def test_the_environment_sets_what_the_chart_passes_and_the_command_line_wins() -> None:
    environ = {"PHALANX_CLUSTER_DOMAIN": "corp.example", "PHALANX_ADMIT_ON_CREATION": "False",
               "PHALANX_NODE_LOST_AFTER_SECONDS": "45"}  # fmt: skip
    settings = OperatorSettings.from_environment(environ, namespaces=("a", "b"))
    assert settings.cluster_domain == "corp.example" and settings.admit_on_creation is False
    assert settings.node_lost_after_seconds == 45.0 and settings.namespaces == ("a", "b")


def test_a_bad_value_stops_the_operator_at_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phalanx import cli, runner

    started: list[Any] = []
    monkeypatch.setattr(runner, "run_operator", lambda settings, **kwargs: started.append(settings))
    monkeypatch.setenv("PHALANX_NODE_LOST_AFTER_SECONDS", "soon")
    assert cli.main(["operator"]) == 2 and started == []
    assert "PHALANX_NODE_LOST_AFTER_SECONDS='soon'" in capsys.readouterr().err


def test_the_command_line_builds_the_settings_once_and_hands_them_to_the_runner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from phalanx import cli, runner

    started: list[OperatorSettings] = []
    monkeypatch.setattr(runner, "run_operator", lambda settings, **kwargs: started.append(settings))
    monkeypatch.setenv("PHALANX_ADMIT_ON_CREATION", "false")
    monkeypatch.delenv("PHALANX_NODE_LOST_AFTER_SECONDS", raising=False)
    assert cli.main(["operator", "--namespace", "a", "--namespace", "b", "--no-leader-elect"]) == 0
    (settings,) = started
    assert settings.namespaces == ("a", "b") and settings.admit_on_creation is False
    assert settings.leader_election.enabled is False


def test_the_controller_takes_its_settings_and_clock_from_its_caller() -> None:
    settings = OperatorSettings(namespaces=("a",), cluster_domain="corp.example", admit_on_creation=False,
                                node_lost_after_seconds=7.0)  # fmt: skip
    controller = Controller(api=None, settings=settings, workers=1, clock=lambda: 42.0)  # type: ignore[arg-type]
    try:
        reconciler = controller.reconciler
        assert (reconciler.cluster_domain, reconciler.node_lost_after) == ("corp.example", 7.0)
        assert reconciler.creation_admission.enabled is False and controller.namespaces == ["a"]
        # Every part that decides on wall time asks the same clock.
        assert (
            reconciler.clock()
            == controller.admission.clock()
            == controller.admission.preemptor.clock()
            == 42.0
        )
    finally:
        for pool in (controller.reconcile_pool, controller.write_pool, controller.progress.pool,
                     controller.admission.pool):  # fmt: skip
            pool.shutdown(wait=False)


def test_the_progress_url_is_the_trainers_unless_a_bench_points_it_elsewhere() -> None:
    assert OperatorSettings.from_environment({}).progress_url_template == "http://{ip}:{port}/progress"
    bench = {"PHALANX_PROGRESS_URL_TEMPLATE": "http://127.0.0.1:8000/{ip}/progress"}
    assert (
        OperatorSettings.from_environment(bench).progress_url_template
        == "http://127.0.0.1:8000/{ip}/progress"
    )
    with pytest.raises(ValueError, match=r"PHALANX_PROGRESS_URL_TEMPLATE=.*lacks \{ip\}"):
        OperatorSettings.from_environment({"PHALANX_PROGRESS_URL_TEMPLATE": "http://127.0.0.1:8000/progress"})
