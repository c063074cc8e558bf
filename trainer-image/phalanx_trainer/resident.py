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

import hmac
import http.server
import io
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from phalanx_trainer import contract, startup
from phalanx_trainer.checkpoint.records import CheckpointConfig
from phalanx_trainer.distenv import EnvError, _int, _seconds, flag, worker_env
from phalanx_trainer.pod_memory import STATE_MEMORY_DIR_ENV, make_pod_folder, remove_pod_folder
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
    supersede,
)
from phalanx_trainer.stacks import forward_stack_dumps, held_while_starting_workers

# Not part of the operator's contract: how workers start ("fork", the default, or "subprocess",
# the cold baseline measured in docs/trainer.md).
START_METHOD_ENV = "PHALANX_LAUNCHER_START_METHOD"
STOP_NOW_GRACE_SECONDS = 2.0  # stop "now": SIGTERM, then SIGKILL after this
# Stop "checkpoint": SIGTERM, then SIGKILL once the SIGTERM checkpoint (its emergency budget) plus
# this margin (reaching the agreed step, the process's exit) has passed; a hung worker must not
# keep the launcher stopping for ever. STOP_DEADLINE_ENV overrides the sum (not in the contract).
STOP_DEADLINE_ENV = "PHALANX_LAUNCHER_STOP_DEADLINE_SECONDS"
STOP_DEADLINE_MARGIN_SECONDS = 30.0
DEFAULT_EMERGENCY_BUDGET_SECONDS = (
    CheckpointConfig().emergency_budget_seconds
)  # main() passes the configured one
POLL_SECONDS = 0.05
# The control server shares the loop that reaps workers: a whole request (line, headers, body) must
# arrive within this, however slowly a client trickles it, and a body is a small JSON object.
REQUEST_DEADLINE_SECONDS = 1.0
MAX_BODY_BYTES = 64 * 1024


def preload() -> None:
    """What every worker would otherwise import cold: torch, torch.distributed, the trainer."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    import phalanx_trainer.generation  # noqa: F401
    import phalanx_trainer.train  # noqa: F401
    from phalanx_trainer.heap import freeze_imported

    freeze_imported()  # every forked worker inherits the frozen heap (heap.py)


def as_exit_code(status: int) -> int:
    """A wait status or Popen returncode as a shell would report it (signal N -> 128 + N)."""
    return 128 - status if status < 0 else status


class Worker:
    """One local rank of one generation, forked from this warm parent or started cold."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self.popen = popen
        self.exit_code: int | None = None
        self.sent: set[int] = set()

    def signal_once(self, signum: int) -> None:
        """A second SIGTERM would cut short the checkpoint the first one started."""
        if signum not in self.sent:
            self.sent.add(signum)
            self.signal(signum)

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


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def fork_worker(argv: Sequence[str], env: Mapping[str, str], close_fds: Sequence[int]) -> Worker:
    import torch

    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        # A forked child cannot use a CUDA context its parent made; the launcher must only import.
        raise RuntimeError(
            "CUDA was initialised in the resident launcher before forking a worker; nothing the "
            "launcher runs (preload, hooks imported at module level) may touch torch.cuda; or set "
            f"{START_METHOD_ENV}=subprocess"
        )
    sys.stdout.flush()
    sys.stderr.flush()
    # A SIGTERM between fork and the child's SIG_DFL would run the launcher's handler in the
    # child (and be lost there): hold it until each side has its own handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        return Worker(pid)
    code = contract.EXIT_PERMANENT_ERROR
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        for fd in close_fds:
            os.close(fd)
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
        emergency_budget_seconds: float = DEFAULT_EMERGENCY_BUDGET_SECONDS,
    ) -> None:
        self.argv = list(argv)
        # The control token authenticates the operator to this launcher only: workers run user code.
        self.base_env = {k: v for k, v in env.items() if k != contract.ENV_CONTROL_TOKEN}
        self.control_token = env.get(contract.ENV_CONTROL_TOKEN) or None
        self.start_method = start_method
        self.clock = clock
        self.nproc = _int(env, contract.ENV_NPROC_PER_NODE, 1)
        self.generation = _int(env, contract.ENV_GENERATION, 0)
        self.wait_seconds = _seconds(
            env, contract.ENV_GENERATION_WAIT, contract.DEFAULT_GENERATION_WAIT_SECONDS
        )
        self.stop_deadline_seconds = _seconds(
            env, STOP_DEADLINE_ENV, emergency_budget_seconds + STOP_DEADLINE_MARGIN_SECONDS
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
            request = parse_generation_request(body, spare=self.state is State.SPARE, nnodes=self._nnodes())
        except BadRequest as err:
            return 400, {"error": str(err)}
        newest = max(self.generation, self.pending.generation if self.pending else self.generation)
        admission: Admission = admit(request, newest, self.state, terminated=self.terminated)
        if not admission.accepted:
            return 409, {"error": admission.reason, **self.describe()}
        self.accepted_at = time.time()
        self.pending = supersede(self.pending, request)
        request = self.pending
        if self.state in (State.RUNNING, State.STOPPING):
            self._stop_workers(request.stop)
        # Waiting or spare: step() starts it, after this answer, so no worker inherits the connection.
        return 202, self.describe()

    def _nnodes(self) -> int:
        """The NNODES the next generation starts with unless a request changes it."""
        env = {**self.base_env, **self.overrides, **(self.pending.env if self.pending else {})}
        return _int(env, contract.ENV_NNODES, 1)

    # ---- workers -----------------------------------------------------------------------------

    def _stop_workers(self, mode: StopMode) -> None:
        self.state = State.STOPPING
        for worker in self.workers:
            worker.signal_once(signal.SIGTERM)
        grace = STOP_NOW_GRACE_SECONDS if mode is StopMode.NOW else self.stop_deadline_seconds
        deadline = self.clock() + grace
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
        try:
            with held_while_starting_workers():
                for local_rank in range(self.nproc):
                    per_rank = worker_env(env, local_rank)
                    if self.start_method == "subprocess":
                        self.workers.append(spawn_worker(self.argv, per_rank))
                    else:
                        self.workers.append(fork_worker(self.argv, per_rank, self.close_in_child))
        except BaseException:
            # Half a generation must not outlive the launcher that cannot run it.
            self.kill_workers()
            raise
        self._log("generation_started", generation=self.generation, pids=[w.pid for w in self.workers])

    def kill_workers(self) -> None:
        """SIGTERM every worker, SIGKILL those still up after the short grace, and reap them: for
        an unexpected error in the launcher itself, which must never leave live workers behind."""
        for worker in self.workers:
            worker.signal_once(signal.SIGTERM)
        deadline = time.monotonic() + STOP_NOW_GRACE_SECONDS
        while any(worker.poll() is None for worker in self.workers) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        for worker in self.workers:
            worker.signal_once(signal.SIGKILL)
        self.workers = []

    def on_sigterm(self) -> None:
        self.terminated = True

    def step(self) -> int | None:
        """One turn of the loop after the control server had its chance; an exit code ends it."""
        if self.terminated and not self.forwarded:
            self.forwarded = True
            for worker in self.workers:
                worker.signal_once(signal.SIGTERM)
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


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each given only what is left of one deadline for the whole request: a
    per-read timeout alone lets a client that sends a byte at a time hold the loop for ever."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self.sock = sock
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"the request took over {REQUEST_DEADLINE_SECONDS} s")
        self.sock.settimeout(remaining)
        return self.sock.recv_into(buffer)


class _ControlHandler(http.server.BaseHTTPRequestHandler):
    server: ControlServer
    timeout = REQUEST_DEADLINE_SECONDS

    def setup(self) -> None:
        super().setup()
        deadline = time.monotonic() + REQUEST_DEADLINE_SECONDS
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline))

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/generation":
            self._reply(404, {"error": f"no such path {self.path}; try /generation"})
            return
        self._reply(200, self.server.launcher.describe())

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/generation":
            self._reply(404, {"error": f"no such path {self.path}; try /generation"})
            return
        if not self._authorized():
            self.close_connection = True
            return
        raw_length = self.headers.get("Content-Length", "")
        length = int(raw_length) if raw_length.strip().isdigit() else 0
        if length <= 0:
            self._reply(400, {"error": f"Content-Length: expected 1..{MAX_BODY_BYTES}, got {raw_length!r}; "
                                       'send a JSON object such as {"generation": 1}'})  # fmt: skip
            return
        if length > MAX_BODY_BYTES:
            self._reply(413, {"error": f"Content-Length: {length} is over {MAX_BODY_BYTES} bytes"})
            return
        try:
            data = self.rfile.read(length)
        except TimeoutError:
            self.close_connection = True  # the client is too slow; the loop has workers to reap
            return
        try:
            body = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            self._reply(400, {"error": f"body: not JSON ({err})"})
            return
        status, answer = self.server.launcher.post_generation(body)
        self._reply(status, answer)

    def _authorized(self) -> bool:
        """A POST changes what the pod's workers run: with a token set it must carry it (compared
        in constant time; the answer never names the expected value)."""
        expected = self.server.launcher.control_token
        if expected is None:
            return True
        scheme, _, given = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode()):
            return True
        self._reply(
            401,
            {
                "error": f"Authorization: expected 'Bearer <token>' with this pod's "
                f"{contract.ENV_CONTROL_TOKEN} (the operator sends it)"
            },  # fmt: skip
            {"WWW-Authenticate": "Bearer"},
        )
        return False

    def _reply(self, status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.connection.settimeout(REQUEST_DEADLINE_SECONDS)  # the reply is small; a stuck reader is cut off
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per poll would drown the trainer's log


def run_resident_launcher(
    argv: Sequence[str],
    env: Mapping[str, str],
    emergency_budget_seconds: float = DEFAULT_EMERGENCY_BUDGET_SECONDS,
) -> int:
    memory_folder: Path | None = None
    if not env.get(STATE_MEMORY_DIR_ENV):
        memory_folder = make_pod_folder()
        if memory_folder is not None:
            env = {**env, STATE_MEMORY_DIR_ENV: str(memory_folder)}
    try:
        return _serve(argv, env, emergency_budget_seconds)
    finally:
        if memory_folder is not None:
            remove_pod_folder(memory_folder)


def _serve(argv: Sequence[str], env: Mapping[str, str], emergency_budget_seconds: float) -> int:
    try:
        port = _int(env, contract.ENV_CONTROL_PORT, contract.DEFAULT_CONTROL_PORT)
        launcher = ResidentLauncher(
            argv,
            env,
            start_method=env.get(START_METHOD_ENV, "fork"),
            emergency_budget_seconds=emergency_budget_seconds,
        )
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
    forward_stack_dumps(
        lambda: [(rank, w.pid) for rank, w in enumerate(launcher.workers) if w.exit_code is None]
    )
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
    except BaseException:
        launcher._log("crashed", generation=launcher.generation, error=traceback.format_exc())
        launcher.kill_workers()
        raise
    finally:
        selector.close()
        server.server_close()
