"""A watch's connection goes back to the pool only when the server ended the stream: one left in the
middle of a chunked answer would hand its unread rest to the next request on it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from phalanx.cache import Store
from phalanx.reflector import Expired, Reflector

pytestmark = pytest.mark.unit


class Stream:
    def __init__(self, *events: dict[str, Any]) -> None:
        self.chunks = [json.dumps(e).encode() + b"\n" for e in events]
        self.released = self.closed = False

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        yield from self.chunks

    def release_conn(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


def watching(response: Stream) -> Reflector:
    return Reflector("pods", lambda **_: response, Store(lambda obj: dict(obj)))


def pod(version: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "p", "uid": "u", "resourceVersion": version}}


def test_a_stream_the_server_ended_returns_its_connection_to_the_pool() -> None:
    response = Stream({"type": "ADDED", "object": pod("5")}, {"type": "BOOKMARK", "object": pod("9")})
    assert watching(response)._watch("1") == "9"
    assert (response.released, response.closed) == (True, False)


def test_a_stream_left_in_the_middle_is_closed() -> None:
    expired = Stream({"type": "ERROR", "object": {"code": 410}}, {"type": "ADDED", "object": pod("5")})
    with pytest.raises(Expired):
        watching(expired)._watch("1")
    assert (expired.released, expired.closed) == (False, True)
    broken = Stream({"type": "ADDED", "object": pod("5")})
    broken.chunks.append(b"{not json\n")
    with pytest.raises(ValueError):
        watching(broken)._watch("1")
    assert (broken.released, broken.closed) == (False, True)
