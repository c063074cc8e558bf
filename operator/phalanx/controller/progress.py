"""The progress client: polls global rank 0's /progress (HTTP, docs/environment.md) while a job
runs, keeps the newest report in memory (hang detection, metrics and the reconcile read it), and
copies it into status.progress and status.lastCheckpoint when policy/progress_writes.py says so:
itself for the first report and a new checkpoint, else through the reconcile's write."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, NamedTuple
from urllib.parse import urlsplit

from phalanx import constants as c
from phalanx import metrics
from phalanx.controller.job_writes import JobWriter
from phalanx.controller.queue import WorkQueue
from phalanx.k8s import short_error
from phalanx.pod_facts import in_current_attempt, pod_index
from phalanx.policy import hang
from phalanx.policy.progress_polls import (
    MAX_POLL_SLOTS,
    failed_poll_delay,
    first_poll_offset,
    poll_interval,
    poll_slots,
    polls_to_start,
)
from phalanx.policy.progress_url import progress_url
from phalanx.policy.progress_writes import (
    DEFAULT_PROGRESS_STATUS_SECONDS,
    poller_wakes_reconcile,
    progress_write_due,
    sample_due,
)
from phalanx.policy.resync import RESYNC_SECONDS
from phalanx.reconcile.plan import iso, parse_iso

log = logging.getLogger("phalanx.controller")

PROGRESS_CONCURRENCY: Final = hang.PROBE_CONCURRENCY  # the polls' slots: policy/progress_polls.py
PROGRESS_TIMEOUT_SECONDS: Final = 2.0  # a trainer busy on every core answers slowly
PROGRESS_POLL_SECONDS: Final = 1.0  # the fastest pace (few jobs), and the tick that starts polls
POLL_TIME_WEIGHT: Final = 0.05  # of each poll in the moving average of how long one takes
PROGRESS_MAX_BYTES: Final = 64 * 1024  # a /progress document is a few hundred bytes; more is not one


def progress_status(report: dict[str, Any]) -> dict[str, Any]:
    """status.progress from the trainer's /progress JSON (docs/environment.md)."""
    out: dict[str, Any] = {}
    step, total = report.get("step"), report.get("total_steps")
    if isinstance(step, int):
        out["step"] = step
    if isinstance(total, int) and total > 0:
        out["totalSteps"] = total
        if isinstance(step, int):
            out["percent"] = min(100, int(100 * step / total))
    eta = report.get("eta_seconds")
    if isinstance(eta, (int, float)):
        out["etaSeconds"] = int(eta)
    if isinstance(report.get("loss"), (int, float)):
        out["loss"] = f"{report['loss']:.4f}"
    if isinstance(report.get("tokens_per_second"), (int, float)):
        out["tokensPerSecond"] = f"{report['tokens_per_second']:.0f}"
    return out


def trainer_facts(report: dict[str, Any]) -> dict[str, Any]:
    """The /progress fields the reconcile books, of the types it expects; anything else is left out
    (the document comes from user code: a string where a number belongs must not stop the job's
    reconciles)."""
    facts: dict[str, Any] = {}
    attempt = report.get("attempt")
    if isinstance(attempt, int) and not isinstance(attempt, bool):
        facts["attempt"] = attempt
    startup = report.get("startup")
    if isinstance(startup, dict):
        facts["startup"] = {k: v for k, v in startup.items() if isinstance(k, str) and isinstance(v, str)}
    for key in ("seconds_per_step", "checkpoint_stall_seconds"):
        number = _number(report.get(key))
        if number is not None and math.isfinite(number) and number >= 0:
            facts[key] = number
    stragglers = report.get("stragglers")
    if isinstance(stragglers, list):
        facts["stragglers"] = [s for s in stragglers[:8] if isinstance(s, dict)]
    for key in ("resumed_from_step", "step", "total_steps", "last_step"):
        value = report.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            facts[key] = value
    return facts


def with_step_timing(facts: dict[str, Any], known: dict[str, Any] | None, now: float) -> dict[str, Any]:
    """The facts with `step_seen_at`: when this poller first saw rank 0 at this step of this attempt
    (policy/hang.py measures stalls from it), and the silent pods of the last probe while it lasts."""
    same = known is not None and all(known.get(k) == facts.get(k) for k in ("attempt", "step", "last_step"))
    timed = {**facts, "step_seen_at": known["step_seen_at"] if same and known is not None else now}
    if same and known is not None and "silent_pods" in known:
        timed["silent_pods"] = known["silent_pods"]
    return timed


def read_within(url: str, timeout: float, max_bytes: int) -> bytes:
    """The body of a 200 answer at the plain-http `url`, read within `timeout` seconds in all (a
    socket timeout bounds each operation: a trickling answer would hold the poll's slot for good),
    and at most `max_bytes` (ValueError beyond). Any other answer, or none, is an OSError.

    http.client, not urllib: at thousands of jobs the polls are a hundred a second, and urllib's
    opener chain cost a third of each one's CPU."""
    deadline = time.monotonic() + timeout
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not a plain http URL: {url}")
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        connection.connect()
        if connection.sock is not None:  # what the connect left of the deadline, for the request
            connection.sock.settimeout(max(0.001, deadline - time.monotonic()))
        # Connection: close (as urllib sent it): a keep-alive answer without a length would
        # otherwise be read until the deadline.
        target = f"{parts.path or '/'}{'?' + parts.query if parts.query else ''}"
        connection.request("GET", target, headers={"Connection": "close"})
        response = connection.getresponse()
        if response.status != 200:
            raise OSError(f"/progress answered HTTP {response.status}")
        body = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"/progress not read within {timeout:g}s")
            _shorten_socket_timeout(response, left)
            chunk = response.read1(min(16 * 1024, max_bytes + 1 - len(body)))
            if not chunk:
                return bytes(body)
            body += chunk
            if len(body) > max_bytes:
                raise ValueError(f"/progress answered more than {max_bytes} bytes")
    except http.client.HTTPException as exc:  # not an OSError: a garbled answer is no answer
        raise OSError(f"/progress: {short_error(exc)}") from exc
    finally:
        connection.close()


def _shorten_socket_timeout(response: Any, seconds: float) -> None:
    # http.client keeps the socket under fp.raw._sock: its next read waits no longer than the
    # deadline (without it, one read more than the deadline).
    sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(max(0.001, seconds))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def trainer_answers(
    ip: str, port: int = c.DEFAULT_METRICS_PORT, template: str = c.PROGRESS_URL_TEMPLATE
) -> bool:
    """Whether the pod's trainer answers on its metrics port at all: only global rank 0 serves
    /progress, so any HTTP answer (a 404 from the other pods) counts; silence or a refused
    connection does not."""
    try:
        with urllib.request.urlopen(progress_url(template, ip, port), timeout=hang.PROBE_TIMEOUT_SECONDS):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False


class ProgressTarget(NamedTuple):
    uid: str  # the job this address serves: its progress is written to that job only
    ip: str


class HangWatch(NamedTuple):
    """What the hang probe needs of a running job: its bound and its pods' addresses."""

    attempt: int
    hang_timeout_seconds: int | None
    pods: tuple[tuple[str, str], ...]  # (pod name, pod IP) of the current attempt


class ProgressPoller:
    def __init__(
        self,
        writer: JobWriter,
        work: WorkQueue,
        status_seconds: float = DEFAULT_PROGRESS_STATUS_SECONDS,
        url_template: str = c.PROGRESS_URL_TEMPLATE,
    ) -> None:
        self.writer = writer
        self.url_template = url_template  # {ip}, {port}: policy/progress_url.py
        self.work = work
        self.status_seconds = status_seconds  # the least time between two progress samples of a job
        self.wakes_reconcile = poller_wakes_reconcile(status_seconds, RESYNC_SECONDS)
        # Own threads: slow polls of unreachable pods must not hold up reconciles or admission.
        self.pool = ThreadPoolExecutor(MAX_POLL_SLOTS, thread_name_prefix="progress")
        # How long a poll takes (answer or timeout), a moving average: sizes the slots.
        self.seconds_per_poll = PROGRESS_TIMEOUT_SECONDS / 4
        self.targets: dict[str, ProgressTarget] = {}  # job key -> rank 0's pod IP, for the job's uid
        self.next_poll: dict[str, float] = {}
        self.poll_started: dict[str, float] = {}  # when (monotonic) the job's last poll began
        self.failures: dict[str, int] = {}
        self.last_progress: dict[str, dict[str, Any]] = {}  # the status patch last written, per job
        # status.lastCheckpoint as the reconcile last read it: when a checkpoint was first seen
        # survives an operator restart (observed_checkpoint).
        self.stored_checkpoints: dict[str, dict[str, Any]] = {}
        self.written_at: dict[str, float] = {}  # when (monotonic) it was written
        # Read but held back by the interval, with its job's uid: a phase change writes it at once.
        self.unwritten: dict[str, tuple[str, dict[str, Any]]] = {}
        # The newest progress read, written or not, with its job's uid and when (wall clock) a poll
        # first read that very progress: an ETA counts down from then (early start reads it).
        self.progress_read: dict[str, tuple[str, dict[str, Any], float]] = {}
        # The poll threads and the reconcile's written_with_status change `unwritten` under it.
        self.unwritten_lock = threading.Lock()
        # The newest start-up times rank 0 reported, with the uid of its job (read by the reconcile).
        self.trainer_reports: dict[str, tuple[str, dict[str, Any]]] = {}
        self.hang_watch: dict[str, HangWatch] = {}
        self.probe_pool = ThreadPoolExecutor(2, thread_name_prefix="hang-probe")
        self.probing: set[str] = set()

    def forget(self, key: str) -> None:
        tables = (self.targets, self.next_poll, self.poll_started, self.failures, self.last_progress,
                  self.trainer_reports, self.hang_watch, self.written_at, self.unwritten,
                  self.stored_checkpoints, self.progress_read)  # fmt: skip
        for table in tables:
            table.pop(key, None)

    def observed_checkpoint(self, key: str, step: int, saved: Any) -> dict[str, Any]:
        """status.lastCheckpoint for the checkpoint rank 0 reports: its step, the trainer's time, and
        when this operator first saw it (observedTime, the operator's clock: what growth compares
        with status.admittedTime, policy/elastic.py; a trainer's clock may be off). The same step
        keeps the time it was first seen, also one the status held from before a restart (without
        one it gets none: not known to be newer than the admission)."""
        known = (
            (self.last_progress.get(key) or {}).get("lastCheckpoint")
            or self.stored_checkpoints.get(key)
            or {}
        )
        if known.get("step") == step:
            observed = known.get("observedTime")
        else:
            observed = iso(time.time())
        entry: dict[str, Any] = {"step": step, "time": saved}
        if observed:
            entry["observedTime"] = observed
        return entry

    def held_back(self, key: str, uid: str) -> dict[str, Any] | None:
        """status.progress as last read for the job with `uid`, if newer than its status (the
        interval held it back); the reconcile writes it with the next status."""
        held = self.unwritten.get(key)
        return held[1].get("progress") if held is not None and held[0] == uid else None

    def read_progress(self, key: str, uid: str) -> tuple[dict[str, Any], float] | None:
        """The newest progress read for the job with `uid` and when a poll first read it (an ETA that
        stays the same between polls is the trainer's last estimate, not a new one)."""
        with self.unwritten_lock:
            read = self.progress_read.get(key)
        return (read[1], read[2]) if read is not None and read[0] == uid else None

    def sample_due(self, key: str, uid: str) -> bool:
        """The reconcile's write is to carry the progress held back for the job with `uid`: the
        interval has passed since the last sample (policy/progress_writes.py)."""
        held = self.unwritten.get(key)
        if held is None or held[0] != uid:
            return False
        return sample_due(self.written_at.get(key), time.monotonic(), self.status_seconds)

    def written_with_status(self, key: str, uid: str, progress: Mapping[str, Any] | None) -> None:
        """The reconcile's status write carried `progress`: held back no longer, and the next sample
        is an interval away. Only after the write succeeded, so a conflict keeps it for the next try."""
        with self.unwritten_lock:  # compare and pop: a poll may replace or drop it meanwhile
            held = self.unwritten.get(key)
            if held is not None and held[0] == uid and held[1].get("progress") == progress:
                self.unwritten.pop(key)
                self.last_progress[key] = held[1]
                self.written_at[key] = time.monotonic()

    def track(
        self,
        key: str,
        uid: str,
        pods: list[dict[str, Any]],
        status: dict[str, Any],
        hang_timeout_seconds: int | None = None,
    ) -> None:
        """Remembers where global rank 0 of the job with `uid` serves /progress while the job runs
        (polled, and what is read written to that job only)."""
        if isinstance(status.get("lastCheckpoint"), dict):
            self.stored_checkpoints[key] = status["lastCheckpoint"]
        if status.get("phase") != "Running":
            self.targets.pop(key, None)
            self.hang_watch.pop(key, None)
            self.poll_started.pop(key, None)  # the pace resumes with the next attempt's polls
            with self.unwritten_lock:  # an ETA of this attempt is no end of the next (gang/backfill.py)
                self.progress_read.pop(key, None)
            return
        if key not in self.last_progress and isinstance(status.get("progress"), dict):
            # What the status shows, as if this poller had written it (an operator restart or a
            # failover): the first poll's report waits for the resync's write like any later sample,
            # not thousands of first reports written at once.
            seeded: dict[str, Any] = {"progress": status["progress"]}
            if isinstance(status.get("lastCheckpoint"), dict):
                seeded["lastCheckpoint"] = status["lastCheckpoint"]
            with self.unwritten_lock:
                self.last_progress.setdefault(key, seeded)
        attempt = status.get("attempt")
        addresses = tuple(sorted(
            (str((p.get("metadata") or {}).get("name", "")), ip)
            for p in pods
            if in_current_attempt(p, status) and (ip := (p.get("status") or {}).get("podIP"))
        ))  # fmt: skip
        self.hang_watch[key] = HangWatch(int(attempt or 0), hang_timeout_seconds, addresses)
        rank0 = next((p for p in pods if in_current_attempt(p, status) and pod_index(p) == 0), None)
        ip = (rank0 or {}).get("status", {}).get("podIP")
        if ip and self.targets.get(key) != (target := ProgressTarget(uid, ip)):
            self.targets[key] = target
            self.next_poll[key] = time.monotonic() + first_poll_offset(uid, self.poll_interval())
            self.failures.pop(key, None)
            self.poll_started.pop(key, None)

    def poll_interval(self) -> float:
        """Seconds between two polls of a job, at the number of jobs polled now."""
        return poll_interval(len(self.targets), PROGRESS_POLL_SECONDS)

    async def run(self) -> None:
        """Every PROGRESS_POLL_SECONDS, starts the due polls (policy/progress_polls.py), as many in
        flight as the pace needs (poll_slots) and no batch waiting for its slowest: each poll frees
        its slot as it answers."""
        loop = asyncio.get_running_loop()
        freed = asyncio.Event()
        in_flight: dict[str, float] = {}  # job key -> when (monotonic) its poll started
        tasks: set[asyncio.Task[None]] = set()

        async def poll_one(key: str) -> None:
            try:
                await loop.run_in_executor(self.pool, self.poll, key)
            except Exception as exc:
                log.warning("progress of %s not recorded: %s", key, short_error(exc))
            finally:
                in_flight.pop(key, None)
                freed.set()

        def slots(jobs: int) -> int:
            now = time.monotonic()
            ages = [now - began for began in in_flight.values()]
            return poll_slots(jobs, self.poll_interval(), self.seconds_per_poll, ages)

        try:
            while True:
                await asyncio.sleep(PROGRESS_POLL_SECONDS)
                jobs = len(self.targets)
                for key in polls_to_start(list(self.targets), self.next_poll, in_flight, time.monotonic()):
                    # Sized again as polls wait: those stuck on silent trainers widen it.
                    while len(in_flight) >= slots(jobs):
                        freed.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(freed.wait(), PROGRESS_POLL_SECONDS)
                    in_flight[key] = time.monotonic()
                    task = asyncio.create_task(poll_one(key), name=f"progress {key}")
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        finally:
            for task in list(tasks):
                task.cancel()

    def _timed(self, started: float) -> None:
        # From the poll threads: a lost update only slows the average down a little.
        took = time.monotonic() - started
        self.seconds_per_poll += POLL_TIME_WEIGHT * (took - self.seconds_per_poll)

    def _probe_if_stalled(self, key: str, target: ProgressTarget) -> None:
        """Once the step has stalled half the hang bound, asks every pod once whether it answers,
        so that a Hang verdict can name the silent ones."""
        known, watch = self.trainer_reports.get(key), self.hang_watch.get(key)
        if known is None or known[0] != target.uid or watch is None or "silent_pods" in known[1]:
            return
        if key in self.probing or not hang.probe_due(
            known[1], watch.attempt, time.time(), watch.hang_timeout_seconds
        ):
            return
        self.probing.add(key)
        # On its own threads: a big gang behind a partition takes a while to time out, and the
        # polls of every other job must go on meanwhile (their stalls are timed by them).
        self.probe_pool.submit(self._probe, key, target, watch, known[1])

    def _probe(self, key: str, target: ProgressTarget, watch: HangWatch, facts: dict[str, Any]) -> None:
        try:
            silent = self.silent_pods(watch)
            current = self.trainer_reports.get(key)
            # Only onto the same stall of the same job: not after forget() or a new step or attempt.
            if current is None or current[0] != target.uid or self.targets.get(key) != target:
                return
            if any(current[1].get(k) != facts.get(k) for k in ("attempt", "step", "last_step")):
                return
            self.trainer_reports[key] = (target.uid, {**current[1], "silent_pods": silent})
            log.warning("%s: no new step since step %s; pods not answering: %s", key,
                        facts.get("last_step", facts.get("step")), ", ".join(silent) or "none")  # fmt: skip
            self.work.enqueue_threadsafe(key)  # a verdict that waits for the probe (policy/hang.py)
        finally:
            self.probing.discard(key)

    def silent_pods(self, watch: HangWatch) -> list[str]:
        """The pods whose trainer does not answer /progress within the timeout (a stopped or wedged
        process serves nothing; one blocked in a collective still answers from its server thread)."""

        with ThreadPoolExecutor(PROGRESS_CONCURRENCY, thread_name_prefix="hang-probe") as pool:
            answered = list(pool.map(self._answers, [ip for _, ip in watch.pods]))
        return [name for (name, _), ok in zip(watch.pods, answered, strict=True) if not ok]

    def _answers(self, ip: str) -> bool:
        return trainer_answers(ip, c.DEFAULT_METRICS_PORT, self.url_template)

    def poll(self, key: str) -> None:
        """Reads the trainer's /progress; copies it into status.progress and status.lastCheckpoint when
        they changed and the write is due (policy/progress_writes.py)."""
        target = self.targets.get(key)
        if target is None:
            return
        started = time.monotonic()  # the next poll is due a poll interval after this one began
        interval = self.poll_interval()
        previous = self.poll_started.get(key)
        self.poll_started[key] = started
        if previous is not None:
            metrics.observe_progress_poll_interval(started - previous)  # the pace achieved
        try:
            url = progress_url(self.url_template, target.ip, c.DEFAULT_METRICS_PORT)
            try:
                body = read_within(url, PROGRESS_TIMEOUT_SECONDS, PROGRESS_MAX_BYTES)
            finally:
                self._timed(started)
            report = json.loads(body)
            if not isinstance(report, dict):
                raise ValueError("/progress is not a JSON object")
        except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested past the stack
            if self.targets.get(key) != target:
                return  # forgotten, or re-created under the name, while the poll waited
            # Simulated pods serve nothing and a trainer may still be starting: back off, quietly.
            failures = self.failures.get(key, 0) + 1
            self.failures[key] = failures
            # A trainer takes a while to import torch and rendezvous: keep the normal pace for the
            # first minutes, then back off (kwok's simulated pods never answer).
            delay = failed_poll_delay(failures, interval)
            self.next_poll[key] = time.monotonic() + delay
            known = self.trainer_reports.get(key)
            if known is not None and known[0] == target.uid:  # asked, no answer: still a look
                looked = {"polled_at": time.time(), "next_poll_after": delay}
                self.trainer_reports[key] = (target.uid, {**known[1], **looked})
            self._probe_if_stalled(key, target)  # rank 0 itself may be the one stopped
            return
        if self.targets.get(key) != target:
            return  # forgotten, or re-created under the name, while the poll waited: not its state
        self.failures.pop(key, None)
        self.next_poll[key] = started + interval  # policy/progress_polls.py orders by it
        namespace, name = key.split("/", 1)
        known = self.trainer_reports.get(key)
        known_facts = known[1] if known is not None and known[0] == target.uid else None
        facts = {
            **with_step_timing(trainer_facts(report), known_facts, time.time()),
            "polled_at": time.time(),
            "next_poll_after": interval,  # policy/hang.py looks again after it
        }
        self.trainer_reports[key] = (target.uid, facts)
        self._probe_if_stalled(key, target)
        news = ("attempt", "startup", "checkpoint_stall_seconds", "resumed_from_step", "stragglers")
        if facts.get("startup") and (known is None or any(known[1].get(k) != facts.get(k) for k in news)):
            # Start-up times end a recovery, stalls cost goodput: the reconcile books them, under
            # the version it decides on.
            self.work.enqueue_threadsafe(key)
        if not isinstance(report.get("step"), int):
            # A trainer starting up serves its start-up times before its first step: nothing for
            # status.progress yet (an empty one would drop the step a status already shows).
            return
        patch: dict[str, Any] = {"progress": progress_status(report)}
        checkpoint = report.get("last_checkpoint") or None
        if isinstance(checkpoint, dict) and isinstance(checkpoint.get("step"), int):
            patch["lastCheckpoint"] = self.observed_checkpoint(
                key, int(checkpoint["step"]), checkpoint.get("time")
            )
            saved = parse_iso(checkpoint.get("time"))
            if saved is not None:
                metrics.observe_checkpoint(namespace, name, saved)
        total, step = report.get("total_steps"), report.get("step")
        if isinstance(total, int) and isinstance(step, int) and total > 0:
            metrics.observe_progress(namespace, name, step, total)
        written, now = self.last_progress.get(key), time.monotonic()
        with self.unwritten_lock:
            seen = self.progress_read.get(key)
            # Not if its attempt ended while this poll ran (track() forgot its ETA under this lock).
            current = self.targets.get(key) == target
            if current and (seen is None or seen[0] != target.uid or seen[1] != patch["progress"]):
                self.progress_read[key] = (target.uid, patch["progress"], facts["polled_at"])
        if written == patch:
            with self.unwritten_lock:
                self.unwritten.pop(key, None)
            return
        if not progress_write_due(written, patch):
            # The reconcile's write carries it, with the goodput booking: one periodic write a job.
            with self.unwritten_lock:
                self.unwritten[key] = (target.uid, patch)
            if self.wakes_reconcile and sample_due(self.written_at.get(key), now, self.status_seconds):
                self.work.enqueue_threadsafe(key)
            return
        if not self.writer.write_facts(key, target.uid, patch):
            # Its job is gone (or re-created under the name: that one gets its own target).
            if self.targets.get(key) == target:
                self.targets.pop(key, None)
            return
        metrics.observe_progress_write()
        if self.targets.get(key) != target:
            return  # forgotten during the write
        with self.unwritten_lock:
            self.last_progress[key] = patch
            self.written_at[key] = now
            self.unwritten.pop(key, None)
        if "lastCheckpoint" in patch and patch["lastCheckpoint"] != (written or {}).get("lastCheckpoint"):
            # A decision reads it (an elastic gang grows after a checkpoint since its admission), and
            # the job's own status events do not enqueue it: a checkpoint every few minutes, one pass each.
            self.work.enqueue_threadsafe(key)
