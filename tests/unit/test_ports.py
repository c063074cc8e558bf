import socket

import pytest

from phalanx.ports import LOWEST_PORT, ephemeral_range_start, free_port

pytestmark = pytest.mark.unit


def test_free_ports_lie_below_the_ephemeral_range_and_can_all_be_bound() -> None:
    base = free_port(consecutive=3)
    assert LOWEST_PORT <= base and base + 3 <= ephemeral_range_start()
    sockets = [socket.socket() for _ in range(3)]
    try:
        for offset, sock in enumerate(sockets):
            sock.bind(("0.0.0.0", base + offset))
    finally:
        for sock in sockets:
            sock.close()


def test_a_held_port_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", free_port()))
        held = holder.getsockname()[1]
        # Offer the held port first, then its neighbour: the neighbour must come back.
        offers = iter([held, held + 1])
        monkeypatch.setattr("phalanx.ports.random.randint", lambda low, high: next(offers))
        assert free_port() == held + 1
