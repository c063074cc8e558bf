import platform

import pytest

from phalanx.runner import limit_malloc_arenas

pytestmark = pytest.mark.unit


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_ARENA_MAX) is glibc's")
def test_malloc_arenas_are_limited_on_glibc() -> None:
    assert limit_malloc_arenas(2) is True


def test_the_metrics_and_health_bind_addresses_are_the_users_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx import cli, metrics, runner

    seen: dict[str, object] = {}
    monkeypatch.setattr(runner, "run_operator", lambda settings, **kwargs: seen.update(kwargs))
    assert (
        cli.main(["operator", "--metrics-bind-address", "127.0.0.1", "--health-bind-address", "127.0.0.2"])
        == 0
    )
    assert seen["metrics_bind_address"] == "127.0.0.1" and seen["health_bind_address"] == "127.0.0.2"
    server = metrics.start_metrics_server(0, "127.0.0.1")
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
