"""The resident launcher (restart in place): one warm parent per pod that outlives its workers.

It imports torch and the trainer once, then forks NPROC_PER_NODE workers per restart generation.
When they stop (75 after an agreed stop, 76 after a lost peer, a signal) and the launcher itself
got no SIGTERM, it stays up in state "waiting" until the operator POSTs the next generation to its
control server, or until PHALANX_GENERATION_WAIT_SECONDS pass (then it exits with their code and
the operator's full gang restart takes over). What to do on each event is restart_policy.py's;
this file only carries it out. One thread: the control server is polled from the same loop that
reaps workers, so forking never copies a lock held by another thread.
"""

from __future__ import annotations

import http.server
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

from phalanx_trainer import contract, startup
from phalanx_trainer.distenv import EnvError, _int, _seconds, flag, worker_env
from phalanx_trainer.restart_policy import (
    Action,
    Admission,
    BadRequest,
    Decision,
    GenerationRequest,
    State,
    StopMode,
    admit,
    combine_exit_codes,
    on_launcher_terminated,
    on_wait_expired,
    on_workers_exited,
    parse_generation_request,
)

# Not part of the operator's contract: how workers start ("fork", the default, or "subprocess",
# the cold baseline measured in docs/trainer.md).
START_METHOD_ENV = "PHALANX_LAUNCHER_START_METHOD"
STOP_NOW_GRACE_SECONDS = 2.0  # stop "now": SIGTERM, then SIGKILL after this
POLL_SECONDS = 0.05


def preload() -> None:
    """What every worker would otherwise import cold: torch, torch.distributed, the trainer."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    import phalanx_trainer.generation  # noqa: F401
    import phalanx_trainer.train  # noqa: F401


def as_exit_code(status: int) -> int:
    """A wait status or Popen returncode as a shell would report it (signal N -> 128 + N)."""
    return 128 - status if status < 0 else status


class Worker:
    """One local rank of one generation, forked from this warm parent or started cold."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self.popen = popen
        self.exit_code: int | None = None

    def poll(self) -> int | None:
        if self.exit_code is not None:
            return self.exit_code
        if self.popen is not None:
            code = self.popen.poll()
            self.exit_code = None if code is None else as_exit_code(code)
            return self.exit_code
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == self.pid:
            self.exit_code = as_exit_code(os.waitstatus_to_exitcode(status))
        return self.exit_code

    def signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


def fork_worker(argv: Sequence[str], env: Mapping[str, str], close_fds: Sequence[int]) -> Worker:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return Worker(pid)
    code = contract.EXIT_PERMANENT_ERROR
    try:
        for fd in close_fds:
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        # The parent's start-up marks are the launcher's; this worker's generation starts now.
        startup.reset()
        from phalanx_trainer.__main__ import main

        code = main(list(argv))
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def spawn_worker(argv: Sequence[str], env: Mapping[str, str]) -> Worker:
    popen = subprocess.Popen([sys.executable, "-m", "phalanx_trainer", *argv], env=dict(env))
    return Worker(popen.pid, popen)


class ResidentLauncher:
    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        start_method: str = "fork",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.argv = list(argv)
        self.base_env = dict(env)
        self.start_method = start_method
        self.clock = clock
        self.nproc = _int(env, contract.ENV_NPROC_PER_NODE, 1)
        self.generation = _int(env, contract.ENV_GENERATION, 0)
        self.wait_seconds = _seconds(
            env, contract.ENV_GENERATION_WAIT, contract.DEFAULT_GENERATION_WAIT_SECONDS
        )
        self.spare = flag(env, contract.ENV_SPARE)
        self.state = State.SPARE if self.spare else State.RUNNING
        self.overrides: dict[str, str] = {}
        self.pending: GenerationRequest | None = None
        self.workers: list[Worker] = []
        self.last_codes: list[int] = []
        self.terminated = False
        self.forwarded = False
        self.waiting_since: float | None = None
        self.kill_at: float | None = None
        self.accepted_at: float | None = None  # unix time the current generation was accepted
        self.exit_code: int | None = None
        self.close_in_child: Sequence[int] = ()  # the control server's socket: not the workers' to hold

    # ---- the control server's two requests ---------------------------------------------------

    def describe(self) -> dict[str, Any]:
        env = {**self.base_env, **self.overrides}
        node_rank = None if self.state is State.SPARE else _int(env, contract.ENV_NODE_RANK, 0)
        return {
            "generation": self.generation,
            "state": self.state.value,
            "node_rank": node_rank,
            "last_exit_codes": self.last_codes,
            "pending_generation": self.pending.generation if self.pending else None,
            "accepted_at": self.accepted_at,
            "worker_pids": [w.pid for w in self.workers if w.poll() is None],
            "spare": self.spare,
        }

    def post_generation(self, body: Any) -> tuple[int, dict[str, Any]]:
        try:
            request = parse_generation_request(body, spare=self.state is State.SPARE)
        except BadRequest as err:
            return 400, {"error": str(err)}
        newest = max(self.generation, self.pending.generation if self.pending else self.generation)
        admission: Admission = admit(request, newest, self.state)
        if not admission.accepted:
            return 409, {"error": admission.reason, **self.describe()}
        self.accepted_at = time.time()
        self.pending = request
        if self.state in (State.RUNNING, State.STOPPING):
            self._stop_workers(request.stop)
        # Waiting or spare: step() starts it, after this answer, so no worker inherits the connection.
        return 202, self.describe()

    # ---- workers -----------------------------------------------------------------------------

    def _stop_workers(self, mode: StopMode) -> None:
        self.state = State.STOPPING
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        if mode is StopMode.NOW:
            deadline = self.clock() + STOP_NOW_GRACE_SECONDS
            self.kill_at = deadline if self.kill_at is None else min(self.kill_at, deadline)

    def _start_pending(self) -> None:
        assert self.pending is not None
        self.generation = self.pending.generation
        self.overrides.update(self.pending.env)
        self.pending = None
        self.start_workers()

    def start_workers(self) -> None:
        env = {**self.base_env, **self.overrides, contract.ENV_GENERATION: str(self.generation)}
        env.pop(contract.ENV_SPARE, None)
        self.spare = False
        self.state = State.RUNNING
        self.waiting_since = None
        self.kill_at = None
        self.workers = []
        for local_rank in range(self.nproc):
            per_rank = worker_env(env, local_rank)
            if self.start_method == "subprocess":
                self.workers.append(spawn_worker(self.argv, per_rank))
            else:
                self.workers.append(fork_worker(self.argv, per_rank, self.close_in_child))
        self._log("generation_started", generation=self.generation, pids=[w.pid for w in self.workers])

    def on_sigterm(self) -> None:
        self.terminated = True

    def step(self) -> int | None:
        """One turn of the loop after the control server had its chance; an exit code ends it."""
        if self.terminated and not self.forwarded:
            self.forwarded = True
            for worker in self.workers:
                worker.signal(signal.SIGTERM)
            decision = on_launcher_terminated(self.state, self._combined())
            if decision is not None:
                return self._apply(decision)
        if self.pending is not None and self.state in (State.WAITING, State.SPARE):
            self._start_pending()
            return None
        if self.kill_at is not None and self.clock() >= self.kill_at:
            for worker in self.workers:
                worker.signal(signal.SIGKILL)
            self.kill_at = None
        if self.state in (State.RUNNING, State.STOPPING) and self.workers:
            codes = [worker.poll() for worker in self.workers]
            if all(code is not None for code in codes):
                self.last_codes = [code for code in codes if code is not None]
                self.workers = []
                decision = on_workers_exited(self.last_codes, self.terminated, self.pending is not None)
                return self._apply(decision)
        if self.state is State.WAITING and self.waiting_since is not None:
            if self.clock() - self.waiting_since >= self.wait_seconds:
                self._log("generation_wait_expired", generation=self.generation, seconds=self.wait_seconds)
                return self._apply(on_wait_expired(self._combined()))
        return None

    def _combined(self) -> int | None:
        return combine_exit_codes(self.last_codes) if self.last_codes else None

    def _apply(self, decision: Decision) -> int | None:
        if decision.action is Action.EXIT:
            self.state = State.DONE
            self.exit_code = decision.exit_code
            return decision.exit_code
        if decision.action is Action.START:
            self._start_pending()
            return None
        self.state = State.WAITING
        self.waiting_since = self.clock()
        self._log("waiting", generation=self.generation, exit_codes=self.last_codes)
        return None

    def _log(self, event: str, **fields: Any) -> None:
        # The launcher's own lines, on stderr so that stdout stays the trainer's JSON event log.
        line = json.dumps({"time": time.time(), "event": f"launcher_{event}", **fields})
        print(line, file=sys.stderr, flush=True)


class ControlServer(http.server.HTTPServer):
    """GET/POST /generation, answered from the launcher's loop (no thread of its own)."""

    allow_reuse_address = True

    def __init__(self, port: int, launcher: ResidentLauncher) -> None:
        self.launcher = launcher
        super().__init__(("0.0.0.0", port), _ControlHandler)


class _ControlHandler(http.server.BaseHTTPRequestHandler):
    server: ControlServer
    timeout = 5.0  # a client that connects and sends nothing must not stall the launcher

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/generation":
            self._reply(404, {"error": f"no such path {self.path}; try /generation"})
            return
        self._reply(200, self.server.launcher.describe())

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/generation":
            self._reply(404, {"error": f"no such path {self.path}; try /generation"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except json.JSONDecodeError as err:
            self._reply(400, {"error": f"body: not JSON ({err})"})
            return
        status, answer = self.server.launcher.post_generation(body)
        self._reply(status, answer)

    def _reply(self, status: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per poll would drown the trainer's log


def run_resident_launcher(argv: Sequence[str], env: Mapping[str, str]) -> int:
    try:
        port = _int(env, contract.ENV_CONTROL_PORT, contract.DEFAULT_CONTROL_PORT)
        launcher = ResidentLauncher(argv, env, start_method=env.get(START_METHOD_ENV, "fork"))
    except EnvError as err:
        print(f"phalanx-trainer: error: {err}", file=sys.stderr, flush=True)
        return contract.EXIT_PERMANENT_ERROR
    if launcher.start_method not in ("fork", "subprocess"):
        print(f"phalanx-trainer: error: {START_METHOD_ENV}={launcher.start_method!r}: expected fork or subprocess",
              file=sys.stderr, flush=True)  # fmt: skip
        return contract.EXIT_PERMANENT_ERROR
    try:
        server = ControlServer(port, launcher)
    except OSError as err:
        print(f"phalanx-trainer: error: cannot serve the control endpoint on port {port} ({err}); "
              f"set {contract.ENV_CONTROL_PORT} to a free port", file=sys.stderr, flush=True)  # fmt: skip
        return contract.EXIT_PERMANENT_ERROR
    launcher.close_in_child = (server.fileno(),)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        launcher.on_sigterm()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    if launcher.start_method == "fork":
        preload()
    if launcher.state is not State.SPARE:
        launcher.start_workers()
    else:
        launcher._log("spare", generation=launcher.generation)
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ)
    try:
        while True:
            if selector.select(POLL_SECONDS):
                server.handle_request()
            code = launcher.step()
            if code is not None:
                launcher._log("exit", generation=launcher.generation, exit_code=code)
                return code
    finally:
        selector.close()
        server.server_close()
