"""Where the progress poller and the hang probe read a pod's /progress (policy/progress_url.py), and
which PHALANX_PROGRESS_URL_TEMPLATE values the operator refuses at start."""

from __future__ import annotations

import logging

import pytest

from phalanx.settings import OperatorSettings
from tests.unit.progress_answers import answer_with


def template_of(value: str) -> str:
    return OperatorSettings.from_environment({"PHALANX_PROGRESS_URL_TEMPLATE": value}).progress_url_template


def test_an_ipv6_pod_ip_is_bracketed_in_the_url() -> None:
    from phalanx.policy.progress_url import progress_url

    assert progress_url("http://{ip}:{port}/progress", "fd00::5", 9400) == "http://[fd00::5]:9400/progress"
    assert progress_url("http://{ip}:{port}/progress", "10.0.0.5", 9400) == "http://10.0.0.5:9400/progress"


@pytest.mark.parametrize(
    ("template", "names"),
    [
        ("http://127.0.0.1:8000/{{ip}}/progress", r"\{ip\}"),  # escaped: every job would read one URL
        ("http://127.0.0.1:8000/{ip}/{job}/progress", r"\{job\}"),  # a KeyError at every poll
        ("http://127.0.0.1:8000/{ip", "format"),
        ("https://127.0.0.1:8000/{ip}/progress", "http"),
        ("ftp://{ip}/progress", "http"),
        ("http://stand-in.example:8000/{ip}/progress", "loopback"),  # every pod's facts to one host
        ("http://10.1.2.3:8000/{ip}/progress", "loopback"),
    ],
)
def test_a_template_the_poller_cannot_use_is_refused_at_start_naming_the_variable(
    template: str, names: str
) -> None:
    with pytest.raises(ValueError, match="PHALANX_PROGRESS_URL_TEMPLATE") as refused:
        template_of(template)
    assert refused.match(names)


def test_a_template_with_the_ip_in_the_host_or_a_loopback_host_is_taken() -> None:
    assert template_of("http://{ip}:{port}/progress") == "http://{ip}:{port}/progress"
    assert template_of("http://{ip}:9500/progress") == "http://{ip}:9500/progress"
    assert template_of("http://127.0.0.1:8000/{ip}/progress") == "http://127.0.0.1:8000/{ip}/progress"
    assert template_of("http://localhost:8000/{ip}/progress") == "http://localhost:8000/{ip}/progress"
    assert template_of("http://[::1]:8000/{ip}/progress") == "http://[::1]:8000/{ip}/progress"


def test_a_set_template_is_warned_about_at_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        OperatorSettings.from_environment({})
    assert not any("PHALANX_PROGRESS_URL_TEMPLATE" in r.getMessage() for r in caplog.records)
    with caplog.at_level(logging.WARNING):
        template_of("http://127.0.0.1:8000/{ip}/progress")
    warned = [r for r in caplog.records if "PHALANX_PROGRESS_URL_TEMPLATE" in r.getMessage()]
    assert warned and warned[0].levelno == logging.WARNING
    assert "benchmarks only" in warned[0].getMessage()


def test_the_poll_and_the_hang_probe_read_one_url(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from phalanx.controller.progress import HangWatch, ProgressPoller, ProgressTarget

    asked: list[str] = []

    def urlopen(url: str, timeout: float) -> io.BytesIO:
        asked.append(url)
        return io.BytesIO(b'{"step": 1}')

    answer_with(monkeypatch, urlopen)

    class Writer:
        def write_facts(self, key: str, uid: str, patch: object) -> bool:
            return True

    polling = ProgressPoller(Writer(), None, 30.0, "http://127.0.0.1:8000/{ip}/progress")  # type: ignore[arg-type]
    polling.targets["ns/job"] = ProgressTarget("uid-1", "fd00::5")
    polling.poll("ns/job")
    assert polling.silent_pods(HangWatch(0, 60, (("job-0", "fd00::5"),))) == []
    assert asked == ["http://127.0.0.1:8000/[fd00::5]/progress"] * 2
