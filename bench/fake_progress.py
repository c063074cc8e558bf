"""A stand-in for the trainers' /progress servers, for benchmarks on kwok pods (which serve nothing).

One local HTTP server answers GET /<pod ip>/progress with the document a trainer's rank 0 serves
(docs/environment.md): the step moves on with time (one step per `seconds_per_step` since the pod
was first asked), so every poll reads something new, as it does from a training job. The operator
is pointed at it with $PHALANX_PROGRESS_URL_TEMPLATE (constants.py); it counts the polls it answers.
It serves from a process of its own, so the bench's pod watch (parsing thousands of pods) does not
share an interpreter lock with it. On a 2-core machine at load 20 the polls answered stayed at about
4.5/s either way (8 slots, about 1.8 s a poll): there the machine, not the operator, sets the rate.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOTAL_STEPS = 1_000_000


class FakeProgress:
    def __init__(self, seconds_per_step: float = 1.0) -> None:
        self.seconds_per_step = seconds_per_step
        self.first_asked: dict[str, float] = {}  # in the serving process
        self.lock = threading.Lock()
        self.polls = multiprocessing.get_context("fork").Value("q", 0)  # read by the bench's process
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                ip, _, rest = self.path.strip("/").partition("/")
                if rest != "progress" or not ip:
                    self.send_error(404)
                    return
                body = json.dumps(fake.document(ip)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
                pass  # thousands of polls a minute

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.process = multiprocessing.get_context("fork").Process(
            target=self.server.serve_forever, name="fake-progress", daemon=True
        )

    @property
    def url_template(self) -> str:
        """For $PHALANX_PROGRESS_URL_TEMPLATE: {ip} is the pod's IP, as the poller fills it in."""
        return f"http://127.0.0.1:{self.server.server_port}/{{ip}}/progress"

    def document(self, ip: str) -> dict[str, Any]:
        now = time.monotonic()
        with self.lock:
            since = now - self.first_asked.setdefault(ip, now)
        with self.polls.get_lock():
            self.polls.value += 1
        step = int(since / self.seconds_per_step)
        return {
            "step": step,
            "total_steps": TOTAL_STEPS,
            "eta_seconds": (TOTAL_STEPS - step) * self.seconds_per_step,
            "loss": 2.0 + 1.0 / (1 + step),
            "tokens_per_second": 50_000.0,
            "seconds_per_step": self.seconds_per_step,
            "attempt": 0,
        }

    def poll_count(self) -> int:
        with self.polls.get_lock():
            return int(self.polls.value)

    def start(self) -> FakeProgress:
        self.process.start()  # forked: the listening socket is already bound, its port known
        return self

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(timeout=10)
        self.server.server_close()
