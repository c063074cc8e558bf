"""The health endpoints: /healthz (liveness: the event loop answers) and /readyz (readiness:
policy/readiness.py), served on a daemon thread so a busy loop cannot hide behind its own server."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from phalanx.cache import Store
from phalanx.leader import LeaderElector
from phalanx.policy.readiness import Election, Readiness, readiness

log = logging.getLogger("phalanx.health")

LOOP_TIMEOUT_SECONDS = 5.0  # within the chart's probe timeout


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        loop: asyncio.AbstractEventLoop,
        ready: Callable[[], Readiness],
        loop_timeout: float = LOOP_TIMEOUT_SECONDS,
    ) -> None:
        self.loop, self.ready, self.loop_timeout = loop, ready, loop_timeout
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        log.info("serving /healthz and /readyz on port %d", self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def loop_answers(self) -> bool:
        try:
            answer = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop)
        except RuntimeError:  # the loop is closed
            return False
        try:
            answer.result(self.loop_timeout)
        except FutureTimeout:
            answer.cancel()
            return False
        return True

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    alive = server.loop_answers()
                    self._answer(200 if alive else 503, "ok" if alive else "event loop not answering")
                elif path == "/readyz":
                    verdict = server.ready()
                    self._answer(200 if verdict.ready else 503, verdict.reason)
                else:
                    self._answer(404, "not found")

            def _answer(self, status: int, text: str) -> None:
                body = f"{text}\n".encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - probes every few seconds: quiet
                pass

        return Handler


def operator_readiness(stores: Mapping[str, Store], elector: LeaderElector | None) -> Callable[[], Readiness]:
    """The readiness of this process, read from its stores and its election each time it is asked."""

    def now() -> Readiness:
        synced = {name: store.synced.is_set() for name, store in stores.items()}
        election = None
        if elector is not None:
            election = Election(elector.may_write(), elector.in_contact.is_set(), elector.last_holder())
        return readiness(synced, election)

    return now
