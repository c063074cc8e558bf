"""The progress poller's status writes (controller/progress.py): throttled by the interval, while the
in-memory report the hang policy and the reconcile read stays fresh at every poll."""

from __future__ import annotations

import io
import json
import math
import time
from typing import Any

import pytest

from phalanx.controller import progress as progress_module
from phalanx.controller.progress import ProgressPoller, ProgressTarget
from tests.unit.progress_answers import answer_with


class RecordingWriter:
    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []

    def write_facts(self, key: str, uid: str, patch: dict[str, Any]) -> bool:
        self.writes.append(patch)
        return True


class NoQueue:
    def enqueue_threadsafe(self, key: str) -> None:
        pass


class Trainer:
    """What rank 0's /progress answers, and a clock the test moves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.report: dict[str, Any] = {"step": 1, "total_steps": 100}
        self.now = 1000.0
        answer_with(monkeypatch, self.urlopen)
        monkeypatch.setattr(progress_module.time, "monotonic", lambda: self.now)

    def urlopen(self, url: str, timeout: float) -> io.BytesIO:
        return io.BytesIO(json.dumps(self.report).encode())


@pytest.fixture
def trainer(monkeypatch: pytest.MonkeyPatch) -> Trainer:
    return Trainer(monkeypatch)


def poller(writer: RecordingWriter, seconds: float) -> ProgressPoller:
    polling = ProgressPoller(writer, NoQueue(), status_seconds=seconds)  # type: ignore[arg-type]
    polling.targets["ns/job"] = ProgressTarget("uid-1", "10.0.0.1")
    return polling


def test_the_poller_writes_the_first_report_and_holds_the_rest_for_the_reconcile_but_memory_sees_every_step(
    trainer: Trainer,
) -> None:
    # One periodic write per running job (issue 17): the reconcile's, which carries the sample with
    # the goodput booking once the interval has passed (tests/unit/test_steady_writes.py).
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    for step in range(1, 31):  # one poll a second for 30 s, a new step each time
        trainer.report["step"] = step
        polling.poll("ns/job")
        assert polling.trainer_reports["ns/job"][1]["step"] == step  # hang detection reads this
        assert not polling.sample_due("ns/job", "uid-1")  # within the interval of the first write
        if step > 1:
            assert (polling.held_back("ns/job", "uid-1") or {}).get("step") == step
        trainer.now += 1.0
    trainer.report["step"] = 31
    polling.poll("ns/job")
    assert [w["progress"]["step"] for w in writer.writes] == [1]
    assert polling.held_back("ns/job", "uid-1") == {"step": 31, "totalSteps": 100, "percent": 31}
    assert polling.sample_due("ns/job", "uid-1") and not polling.sample_due("ns/job", "uid-2")
    polling.written_with_status("ns/job", "uid-1", polling.held_back("ns/job", "uid-1"))
    assert polling.held_back("ns/job", "uid-1") is None
    trainer.now += 29.0
    trainer.report["step"] = 60
    polling.poll("ns/job")
    assert not polling.sample_due("ns/job", "uid-1")  # an interval from the reconcile's write
    trainer.now += 1.0
    assert polling.sample_due("ns/job", "uid-1")


def test_an_interval_shorter_than_the_resync_has_the_poller_wake_the_reconcile(trainer: Trainer) -> None:
    queue = RecordingQueue()
    polling = ProgressPoller(RecordingWriter(), queue, status_seconds=1.0)  # type: ignore[arg-type]
    polling.targets["ns/job"] = ProgressTarget("uid-1", "10.0.0.1")
    polling.poll("ns/job")  # the first report: written by the poller
    trainer.now += 1.0
    trainer.report["step"] = 2
    polling.poll("ns/job")
    assert queue.enqueued == ["ns/job"]


def test_a_new_checkpoint_is_written_at_once(trainer: Trainer) -> None:
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    polling.poll("ns/job")
    trainer.now += 1.0
    trainer.report.update(step=2, last_checkpoint={"step": 2, "time": "2026-01-01T00:00:00Z"})
    polling.poll("ns/job")
    assert [w.get("lastCheckpoint", {}).get("step") for w in writer.writes] == [None, 2]


def test_the_progress_the_interval_held_back_is_read_until_a_write_carries_it(trainer: Trainer) -> None:
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    polling.poll("ns/job")
    trainer.now += 1.0
    trainer.report["step"] = 100
    polling.poll("ns/job")
    assert len(writer.writes) == 1
    assert polling.held_back("ns/job", "other-uid") is None  # never onto another job
    newest = {"step": 100, "totalSteps": 100, "percent": 100}
    assert polling.held_back("ns/job", "uid-1") == newest
    polling.written_with_status("ns/job", "uid-1", {"step": 99})  # a write that carried another
    assert polling.held_back("ns/job", "uid-1") == newest  # a conflict or another value: still held
    polling.written_with_status("ns/job", "uid-1", newest)
    assert polling.held_back("ns/job", "uid-1") is None


def test_the_interval_comes_from_the_environment() -> None:
    from phalanx.settings import OperatorSettings

    assert OperatorSettings.from_environment({}).progress_status_seconds == 30.0
    configured = OperatorSettings.from_environment({"PHALANX_PROGRESS_STATUS_SECONDS": "2"})
    assert configured.progress_status_seconds == 2.0
    with pytest.raises(ValueError, match="PHALANX_PROGRESS_STATUS_SECONDS"):
        OperatorSettings.from_environment({"PHALANX_PROGRESS_STATUS_SECONDS": "0"})


def test_the_backfill_reads_the_eta_of_the_newest_poll_from_when_it_was_read(trainer: Trainer) -> None:
    from phalanx.controller.admission_pass import AdmissionPass
    from phalanx.controller.stores import ClusterStores

    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    trainer.report["eta_seconds"] = 600
    polling.poll("ns/job")  # written: the status says 600 s
    trainer.now += 20.0
    trainer.report.update(step=50, eta_seconds=580)
    polling.poll("ns/job")  # held back by the interval
    passing = AdmissionPass(None, ClusterStores(), None, None, None, None, None, time.time)  # type: ignore[arg-type]
    passing.read_progress = polling.read_progress
    job = {"metadata": {"name": "job", "namespace": "ns", "uid": "uid-1"},
           "status": {"phase": "Running", "progress": writer.writes[0]["progress"]}}  # fmt: skip
    read_at = polling.trainer_reports["ns/job"][1]["polled_at"]
    assert passing._work_end(job) == pytest.approx(read_at + 580)  # the held-back 580, not the status' 600
    other = {**job, "metadata": {**job["metadata"], "uid": "uid-2"}}  # a job re-created by name
    assert passing._work_end(other) == math.inf, "another job's reading, and the status' ETA has no time"


def test_a_trainer_slow_to_start_is_still_polled_every_second_after_four_minutes(
    monkeypatch: pytest.MonkeyPatch, trainer: Trainer
) -> None:
    # Imports and a rendezvous on a loaded node (or an image pull) can take minutes before rank 0
    # serves /progress. Backed off to 30 s by then, the first minute of training went unseen: a
    # disruption's step (the redone work) and a straggler in a short run were missed (e2e, loaded).
    def refused(url: str, timeout: float) -> io.BytesIO:
        raise ConnectionRefusedError(111, "Connection refused")

    answer_with(monkeypatch, refused)
    polling = poller(RecordingWriter(), seconds=30.0)
    for _ in range(240):  # a failed poll a second for four minutes
        polling.poll("ns/job")
        trainer.now += 1.0
    assert polling.next_poll["ns/job"] - trainer.now <= progress_module.PROGRESS_POLL_SECONDS


def test_the_poller_reads_the_url_its_settings_name_for_the_pod(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    answer_with(monkeypatch,
                        lambda url, timeout: asked.append(url) or trainer.urlopen(url, timeout))  # fmt: skip
    default = poller(RecordingWriter(), seconds=30.0)
    default.poll("ns/job")
    stand_in = ProgressPoller(RecordingWriter(), NoQueue(), 30.0, "http://127.0.0.1:8000/{ip}/progress")  # type: ignore[arg-type]
    stand_in.targets["ns/job"] = ProgressTarget("uid-1", "10.0.0.1")
    stand_in.poll("ns/job")
    assert asked == ["http://10.0.0.1:9400/progress", "http://127.0.0.1:8000/10.0.0.1/progress"]


def test_a_silent_pod_holds_one_poll_slot_not_the_polls_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import threading

    release, last_polled_twice = threading.Event(), threading.Event()
    asked: list[str] = []
    last = f"10.0.0.{progress_module.PROGRESS_CONCURRENCY}:"

    def urlopen(url: str, timeout: float) -> io.BytesIO:
        asked.append(url)
        if sum(last in u for u in asked) >= 2:
            last_polled_twice.set()
        if "10.0.0.0:" in url:
            release.wait(timeout=10)  # the first job's rank 0 answers only at the end
        return io.BytesIO(json.dumps({"step": len(asked), "total_steps": 100}).encode())

    answer_with(monkeypatch, urlopen)
    monkeypatch.setattr(progress_module, "PROGRESS_POLL_SECONDS", 0.05)
    polling = ProgressPoller(RecordingWriter(), NoQueue(), status_seconds=30.0)  # type: ignore[arg-type]
    for i in range(progress_module.PROGRESS_CONCURRENCY + 1):  # one more than a batch
        polling.targets[f"ns/job-{i}"] = ProgressTarget(f"uid-{i}", f"10.0.0.{i}")

    polled_on: list[bool] = []

    async def run_a_while() -> None:
        task = asyncio.create_task(polling.run())
        # Until the job after a full batch is polled twice while the first job's poll still waits
        # (that poll waits up to 10 s: far longer than two poll rounds).
        polled_on.append(await asyncio.to_thread(last_polled_twice.wait, 10))
        release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    try:
        asyncio.run(run_a_while())
    finally:
        release.set()
        polling.pool.shutdown(wait=True)
    assert polled_on == [True], asked  # polled on, while the first job's poll waited
    assert sum("10.0.0.0:" in url for url in asked) == 1  # never asked twice at once


class BlockingTrainer:
    """A /progress that answers (or fails) only when the test lets it, so that the test can act
    while a poll is in flight."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answers: bool) -> None:
        import threading

        self.asked, self.release, self.answers = threading.Event(), threading.Event(), answers
        answer_with(monkeypatch, self.urlopen)

    def urlopen(self, url: str, timeout: float) -> io.BytesIO:
        self.asked.set()
        self.release.wait(timeout=10)
        if not self.answers:
            raise OSError("connection refused")
        return io.BytesIO(json.dumps({"step": 7, "total_steps": 100, "startup": {"ready": "x"}}).encode())

    def poll_while(self, polling: ProgressPoller, key: str, meanwhile: Any) -> None:
        import threading

        thread = threading.Thread(target=polling.poll, args=(key,))
        thread.start()
        assert self.asked.wait(timeout=10)
        meanwhile()
        self.release.set()
        thread.join(timeout=10)
        assert not thread.is_alive()


@pytest.mark.parametrize("answers", [True, False])
def test_a_job_forgotten_while_its_poll_is_in_flight_stays_forgotten(
    monkeypatch: pytest.MonkeyPatch, answers: bool
) -> None:
    blocking = BlockingTrainer(monkeypatch, answers)
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    blocking.poll_while(polling, "ns/job", lambda: polling.forget("ns/job"))
    tables = {"trainer_reports": polling.trainer_reports, "failures": polling.failures,
              "next_poll": polling.next_poll, "unwritten": polling.unwritten,
              "last_progress": polling.last_progress, "written_at": polling.written_at}  # fmt: skip
    assert {name: dict(table) for name, table in tables.items() if table} == {}
    assert writer.writes == []


def test_a_stale_poll_does_not_overwrite_the_job_re_created_under_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocking = BlockingTrainer(monkeypatch, answers=True)
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)

    def re_create() -> None:
        polling.forget("ns/job")
        polling.targets["ns/job"] = ProgressTarget("uid-2", "10.0.0.2")  # the new job's rank 0

    blocking.poll_while(polling, "ns/job", re_create)
    assert "ns/job" not in polling.trainer_reports  # uid-1's report is not booked for uid-2
    assert "ns/job" not in polling.next_poll  # the new job is polled at once
    assert writer.writes == []


def test_an_answered_poll_sets_the_next_one_so_the_longest_overdue_job_goes_first(trainer: Trainer) -> None:
    from phalanx.policy.progress_polls import polls_to_start

    polling = poller(RecordingWriter(), seconds=30.0)
    polling.targets["ns/other"] = ProgressTarget("uid-2", "10.0.0.2")
    polling.poll("ns/job")  # answered at 1000 s
    assert polling.next_poll["ns/job"] == 1000.0 + progress_module.PROGRESS_POLL_SECONDS
    trainer.now += 5.0
    # Both due; the job never polled is the more overdue one, then the one polled 5 s ago.
    assert polls_to_start(list(polling.targets), polling.next_poll, set(), trainer.now) == [
        "ns/other",
        "ns/job",
    ]


def test_the_poller_counts_its_own_progress_writes(trainer: Trainer) -> None:
    """The steady-state bench tells them from the reconcile's status writes (same endpoint) by it."""
    from phalanx import metrics

    def written() -> float:
        return metrics.REGISTRY.get_sample_value("phalanx_progress_writes_total") or 0.0

    before = written()
    polling = poller(RecordingWriter(), seconds=30.0)
    polling.poll("ns/job")  # written
    trainer.now += 1.0
    trainer.report["step"] = 2
    polling.poll("ns/job")  # held back by the interval
    assert written() - before == 1.0


def test_a_new_checkpoint_is_stamped_with_the_operators_time_once(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Growth compares it with status.admittedTime, the operator's clock too (policy/elastic.py).
    monkeypatch.setattr(progress_module.time, "time", lambda: 1_800_000_000.0)
    writer = RecordingWriter()
    polling = poller(writer, seconds=0.0)
    trainer.report.update(step=2, last_checkpoint={"step": 2, "time": "2000-01-01T00:00:00Z"})
    polling.poll("ns/job")
    assert writer.writes[-1]["lastCheckpoint"]["observedTime"] == "2027-01-15T08:00:00Z"
    monkeypatch.setattr(progress_module.time, "time", lambda: 1_800_000_100.0)
    trainer.report.update(step=3)
    trainer.now += 1.0
    polling.poll("ns/job")  # the same checkpoint: when it was first seen stays
    assert writer.writes[-1]["lastCheckpoint"]["observedTime"] == "2027-01-15T08:00:00Z"


def test_a_checkpoint_the_status_holds_keeps_its_observed_time_after_an_operator_restart(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_module.time, "time", lambda: 1_800_000_100.0)
    writer = RecordingWriter()
    polling = ProgressPoller(writer, NoQueue(), status_seconds=0.0)  # type: ignore[arg-type]
    stored = {"step": 2, "time": "2000-01-01T00:00:00Z", "observedTime": "2027-01-15T07:00:00Z"}
    rank0 = {"metadata": {"name": "job-worker-0", "labels": {"phalanx.dev/attempt": "0",
                                                             "phalanx.dev/replica-index": "0"}},
             "status": {"podIP": "10.0.0.1"}}  # fmt: skip
    polling.track("ns/job", "uid-1", [rank0], {"phase": "Running", "attempt": 0, "lastCheckpoint": stored})
    trainer.report.update(step=3, last_checkpoint={"step": 2, "time": "2000-01-01T00:00:00Z"})
    polling.poll("ns/job")
    assert writer.writes[-1]["lastCheckpoint"]["observedTime"] == "2027-01-15T07:00:00Z"


class RecordingQueue:
    def __init__(self) -> None:
        self.enqueued: list[str] = []

    def enqueue_threadsafe(self, key: str) -> None:
        self.enqueued.append(key)


def test_a_new_checkpoint_written_wakes_the_reconcile_once(trainer: Trainer) -> None:
    # A decision reads it (an elastic gang grows only after a checkpoint since its admission): the
    # job's own status events do not enqueue it, so the poller that wrote it does.
    writer, queue = RecordingWriter(), RecordingQueue()
    polling = ProgressPoller(writer, queue, status_seconds=30.0)  # type: ignore[arg-type]
    polling.targets["ns/job"] = ProgressTarget("uid-1", "10.0.0.1")
    polling.poll("ns/job")
    assert queue.enqueued == []
    trainer.report.update(step=2, last_checkpoint={"step": 2, "time": "2026-01-01T00:00:00Z"})
    trainer.now += 1.0
    polling.poll("ns/job")
    assert queue.enqueued == ["ns/job"]
    trainer.report.update(step=3)
    trainer.now += 1.0
    polling.poll("ns/job")  # progress only: no reconcile for it
    assert queue.enqueued == ["ns/job"]


def test_last_checkpoint_is_not_bookkeeping_a_decision_reads_it() -> None:
    from phalanx.controller.reconciler import BOOKKEEPING_FIELDS

    assert "lastCheckpoint" not in BOOKKEEPING_FIELDS


def test_with_many_jobs_an_answered_poll_sets_the_next_one_further_away(trainer: Trainer) -> None:
    from phalanx.policy.progress_polls import poll_interval

    polling = poller(RecordingWriter(), seconds=30.0)
    for i in range(4000):
        polling.targets[f"ns/other-{i}"] = ProgressTarget(f"uid-{i}", f"10.1.{i // 250}.{i % 250}")
    polling.poll("ns/job")
    assert polling.next_poll["ns/job"] == trainer.now + poll_interval(4001, fastest=1.0)
    assert polling.next_poll["ns/job"] - trainer.now > 1.0


class PollThreadBetweenGetAndPop(dict):  # type: ignore[type-arg]
    """The poller's held-back table, with a poll thread that acts right after the reconcile's
    written_with_status has read its entry: the interleaving of the review (issue 17), made certain."""

    def __init__(self, act: Any) -> None:
        super().__init__()
        self.act: Any = act
        self.other: Any = None

    def get(self, key: Any, default: Any = None) -> Any:
        value = super().get(key, default)
        if self.act is not None:
            act, self.act = self.act, None
            import threading

            self.other = threading.Thread(target=act)
            self.other.start()
            self.other.join(timeout=0.5)  # it runs now, unless a lock keeps it until the check is done
        return value


@pytest.mark.parametrize("newer", [True, False], ids=["a-newer-sample-held", "the-held-one-written"])
def test_the_reconciles_write_and_a_poll_thread_do_not_lose_or_raise_over_the_held_progress(
    trainer: Trainer, newer: bool
) -> None:
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    polling.poll("ns/job")
    trainer.now += 1.0
    trainer.report["step"] = 2
    polling.poll("ns/job")  # held back
    carried = polling.held_back("ns/job", "uid-1")

    def poll_again() -> None:
        trainer.report["step"] = 3 if newer else 1  # 1: what was written: nothing held any more
        polling.poll("ns/job")

    table = PollThreadBetweenGetAndPop(poll_again)
    table.update(polling.unwritten)
    polling.unwritten = table
    polling.written_with_status("ns/job", "uid-1", carried)  # no KeyError after the status write
    table.other.join(timeout=5)
    if newer:
        assert polling.held_back("ns/job", "uid-1") == {"step": 3, "totalSteps": 100, "percent": 3}
    else:
        assert polling.held_back("ns/job", "uid-1") is None


def test_a_trainer_that_trickles_its_answer_frees_the_poll_slot_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # From the review (issue 17): the timeout bounds each socket operation, not the poll; a /progress
    # that sends a byte a little faster than that held a poll slot for good, and eight such trainers
    # stopped the polls of every job.
    import http.server
    import threading

    stop = threading.Event()

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Length", "10000")
            self.end_headers()
            while not stop.is_set():
                self.wfile.write(b" ")
                self.wfile.flush()
                stop.wait(0.1)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Trickle)
    serving = threading.Thread(target=server.handle_request, daemon=True)
    serving.start()
    monkeypatch.setattr(progress_module, "PROGRESS_TIMEOUT_SECONDS", 1.0)
    url = f"http://{{ip}}:{server.server_address[1]}/progress"
    polling = ProgressPoller(RecordingWriter(), NoQueue(), 30.0, url)  # type: ignore[arg-type]
    polling.targets["ns/job"] = ProgressTarget("uid-1", "127.0.0.1")
    polled = threading.Thread(target=polling.poll, args=("ns/job",), daemon=True)
    started = time.monotonic()
    polled.start()
    try:
        polled.join(timeout=6)
        assert not polled.is_alive(), "the poll still reads a trickle"
        assert time.monotonic() - started < 3
        assert polling.failures["ns/job"] == 1  # counted as no answer
    finally:
        stop.set()
        serving.join(5)
        server.server_close()


def test_after_an_operator_restart_a_job_with_progress_in_its_status_is_not_written_at_its_first_poll(
    trainer: Trainer,
) -> None:
    # From the review (issue 17): every job's first poll after a restart or failover was a "first
    # report" written at once, ~5,000 PATCHes in a burst; the status already shows progress, so the
    # first sample goes with the job's staggered resync write instead.
    writer = RecordingWriter()
    polling = ProgressPoller(writer, NoQueue(), status_seconds=30.0)  # type: ignore[arg-type]
    checkpoint = {"step": 2, "time": "2000-01-01T00:00:00Z", "observedTime": "2027-01-15T07:00:00Z"}
    rank0 = {"metadata": {"name": "job-worker-0", "labels": {"phalanx.dev/attempt": "0",
                                                             "phalanx.dev/replica-index": "0"}},
             "status": {"podIP": "10.0.0.1"}}  # fmt: skip
    status = {"phase": "Running", "attempt": 0, "progress": {"step": 1, "totalSteps": 100, "percent": 1},
              "lastCheckpoint": checkpoint}  # fmt: skip
    polling.track("ns/job", "uid-1", [rank0], status)
    trainer.report.update(step=3, last_checkpoint={"step": 2, "time": "2000-01-01T00:00:00Z"})
    polling.poll("ns/job")
    assert writer.writes == []
    assert polling.held_back("ns/job", "uid-1") == {"step": 3, "totalSteps": 100, "percent": 3}
    assert polling.sample_due("ns/job", "uid-1")  # the reconcile's next write carries it
    trainer.report.update(step=5, last_checkpoint={"step": 4, "time": "2000-01-01T00:01:00Z"})
    polling.poll("ns/job")
    assert [w["lastCheckpoint"]["step"] for w in writer.writes] == [4]  # a new checkpoint: at once


def test_at_scale_a_trainer_that_never_answers_is_asked_less_often_than_one_that_does(
    monkeypatch: pytest.MonkeyPatch, trainer: Trainer
) -> None:
    # From the review (issue 17): the back-off stopped at 30 s, the pace of every job past 600 jobs,
    # so dead endpoints (kwok's pods, a node gone) cost as much as live ones.
    def refused(url: str, timeout: float) -> io.BytesIO:
        raise ConnectionRefusedError(111, "Connection refused")

    answer_with(monkeypatch, refused)
    polling = poller(RecordingWriter(), seconds=30.0)
    for i in range(1, 2000):
        polling.targets[f"ns/other-{i}"] = ProgressTarget(f"uid-{i}", "10.0.1.1")
    interval = polling.poll_interval()
    for _ in range(40):  # twenty minutes or more of failed polls
        polling.poll("ns/job")
        trainer.now = polling.next_poll["ns/job"]
    polling.poll("ns/job")
    assert polling.next_poll["ns/job"] - trainer.now >= 2 * interval
    # ...but never so seldom that the hang rule calls what it saw stale (second review m5): a
    # wedged rank 0 answering nothing must still be looked at within POLL_STALE_SECONDS.
    from phalanx.policy.hang import POLL_STALE_SECONDS

    assert polling.next_poll["ns/job"] - trainer.now <= POLL_STALE_SECONDS


def test_jobs_tracked_together_are_first_polled_spread_over_an_interval(trainer: Trainer) -> None:
    # From the review (issue 17): after a restart every job was due at once, and polled in a burst
    # at every interval after.
    from phalanx.policy.progress_polls import polls_to_start

    polling = ProgressPoller(RecordingWriter(), NoQueue(), status_seconds=30.0)  # type: ignore[arg-type]
    for i in range(1000):
        rank0 = {"metadata": {"name": f"job-{i}-worker-0", "labels": {"phalanx.dev/attempt": "0",
                                                                     "phalanx.dev/replica-index": "0"}},
                 "status": {"podIP": f"10.0.{i // 250}.{i % 250}"}}  # fmt: skip
        polling.track(f"ns/job-{i}", f"uid-{i}", [rank0], {"phase": "Running", "attempt": 0})
    interval = polling.poll_interval()
    due_now = polls_to_start(list(polling.targets), polling.next_poll, (), trainer.now)
    assert len(due_now) < 100
    due_within = polls_to_start(list(polling.targets), polling.next_poll, (), trainer.now + interval)
    assert len(due_within) == 1000


def test_the_seconds_between_two_polls_of_a_job_are_exported(trainer: Trainer) -> None:
    # From the review (issue 17): a pace the slots cannot keep (slow polls at MAX_POLL_SLOTS) was
    # visible nowhere; the time achieved between two polls of a job is a histogram.
    from phalanx import metrics

    def seen() -> tuple[float, float]:
        name = "phalanx_progress_poll_interval_seconds"
        count = metrics.REGISTRY.get_sample_value(f"{name}_count") or 0.0
        return count, metrics.REGISTRY.get_sample_value(f"{name}_sum") or 0.0

    polling = poller(RecordingWriter(), seconds=30.0)
    polling.poll("ns/job")
    before = seen()
    trainer.now += 47.0
    polling.poll("ns/job")
    after = seen()
    assert after[0] - before[0] == 1 and after[1] - before[1] == pytest.approx(47.0)


def test_a_restart_between_two_polls_is_not_counted_as_the_pace(trainer: Trainer) -> None:
    from phalanx import metrics

    rank0 = {"metadata": {"name": "job-worker-0", "labels": {"phalanx.dev/attempt": "0",
                                                             "phalanx.dev/replica-index": "0"}},
             "status": {"podIP": "10.0.0.1"}}  # fmt: skip
    polling = ProgressPoller(RecordingWriter(), NoQueue(), status_seconds=30.0)  # type: ignore[arg-type]
    polling.track("ns/job", "uid-1", [rank0], {"phase": "Running", "attempt": 0})
    polling.poll("ns/job")
    polling.track("ns/job", "uid-1", [rank0], {"phase": "Restarting", "attempt": 0})
    trainer.now += 600.0
    count = metrics.REGISTRY.get_sample_value("phalanx_progress_poll_interval_seconds_count") or 0.0
    polling.track("ns/job", "uid-1", [rank0], {"phase": "Running", "attempt": 0})
    polling.poll("ns/job")
    assert (metrics.REGISTRY.get_sample_value("phalanx_progress_poll_interval_seconds_count") or 0.0) == count


def tracked_with_an_eta(trainer: Trainer) -> tuple[dict[str, Any], ProgressPoller]:
    """Rank 0 of a Running first attempt, tracked; its trainer reports an ETA of 600 s."""
    rank0 = {"metadata": {"name": "job-worker-0", "labels": {"phalanx.dev/attempt": "0",
                                                             "phalanx.dev/replica-index": "0"}},
             "status": {"podIP": "10.0.0.1"}}  # fmt: skip
    polling = ProgressPoller(RecordingWriter(), NoQueue(), status_seconds=30.0)  # type: ignore[arg-type]
    trainer.report["eta_seconds"] = 600
    polling.track("ns/job", "uid-1", [rank0], {"phase": "Running", "attempt": 0})
    return rank0, polling


def test_a_restart_forgets_the_eta_read_in_the_attempt_before(trainer: Trainer) -> None:
    # The backfill and early start read a job's end from the newest poll: an ETA of the attempt that
    # stopped is no end of the next one, which has reported nothing yet.
    rank0, polling = tracked_with_an_eta(trainer)
    polling.poll("ns/job")
    assert polling.read_progress("ns/job", "uid-1") is not None
    polling.track("ns/job", "uid-1", [rank0], {"phase": "Restarting", "attempt": 0})
    polling.track("ns/job", "uid-1", [rank0], {"phase": "Running", "attempt": 1})
    assert polling.read_progress("ns/job", "uid-1") is None


def test_a_poll_that_straddles_a_restart_keeps_no_eta_of_the_attempt_that_ended(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The attempt ends (track() forgets its ETA) after the poll read its report and before the poll
    # stores it: what the poll read belongs to the attempt that ended.
    rank0, polling = tracked_with_an_eta(trainer)

    def restart_meanwhile(*_: object) -> None:
        polling.track("ns/job", "uid-1", [rank0], {"phase": "Restarting", "attempt": 0})

    monkeypatch.setattr(progress_module.metrics, "observe_progress", restart_meanwhile)
    polling.poll("ns/job")
    assert polling.read_progress("ns/job", "uid-1") is None


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b'HTTP/1.0 200 OK\r\nContent-Length: 13\r\n\r\n{"step": 12}\n', None),
        (b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n", OSError),  # a pod not rank 0
        (b"HTTP/1.0 200 OK\r\n\r\n" + b" " * 300, ValueError),  # more than the bound (256 here)
        (b"SSH-2.0-OpenSSH\r\n", OSError),  # something else on the port: no answer, not a crash
        # HTTP/1.1 without a length: ends when the server closes, which it does for Connection: close
        (b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"step": 12}\n', None),
    ],
    ids=["ok", "not-found", "too-big", "not-http", "keep-alive-without-length"],
)
def test_read_within_takes_a_200_within_bounds_and_anything_else_as_no_answer(
    answer: bytes, error: type[Exception] | None
) -> None:
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            request = conn.recv(4096)
            conn.sendall(answer)
            if b"connection: close" not in request.lower():
                time.sleep(3)  # a keep-alive server: the connection stays open past the deadline

    serving = threading.Thread(target=serve, daemon=True)
    serving.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/progress"
    try:
        if error is None:
            assert json.loads(progress_module.read_within(url, 2.0, 256)) == {"step": 12}
        else:
            with pytest.raises(error):
                progress_module.read_within(url, 2.0, 256)
    finally:
        serving.join(5)
        listener.close()


def test_a_report_before_the_first_step_writes_no_progress(trainer: Trainer) -> None:
    # A fresh trainer serves its start-up times before its first step (phalanx_trainer.metrics
    # note_startup): no step, no totals. Written, it was an empty status.progress, or one whose
    # step the merge patch removed; a fresh-clone e2e run read a status.progress without a step.
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    trainer.report = {
        "attempt": 0,
        "startup": {"podsRunning": "2026-12-05T10:00:00Z"},
        "resumed_from_step": 0,
    }
    polling.poll("ns/job")
    assert writer.writes == []
    assert polling.trainer_reports["ns/job"][1]["startup"]  # the reconcile still sees the start-up
    trainer.report = {"step": 1, "total_steps": 100}
    polling.poll("ns/job")
    assert writer.writes == [{"progress": {"step": 1, "totalSteps": 100, "percent": 1}}]


def test_early_start_reads_the_newest_progress_from_when_a_poll_first_read_it(trainer: Trainer) -> None:
    # An ETA that stays the same between polls is the trainer's last estimate: it keeps counting
    # down from the poll that first read it, written or held back (gang/early_start.py).
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    trainer.report["eta_seconds"] = 600
    polling.poll("ns/job")  # written
    first = polling.read_progress("ns/job", "uid-1")
    assert first is not None and first[0]["etaSeconds"] == 600
    polling.poll("ns/job")
    assert polling.read_progress("ns/job", "uid-1") == first
    trainer.now += 1.0
    trainer.report.update(step=2, eta_seconds=590)
    polling.poll("ns/job")  # held back by the interval, read all the same
    newest = polling.read_progress("ns/job", "uid-1")
    assert newest is not None and newest[0]["etaSeconds"] == 590 and newest[1] >= first[1]
    assert len(writer.writes) == 1
    assert polling.read_progress("ns/job", "other-uid") is None  # never onto another job
    polling.forget("ns/job")
    assert polling.read_progress("ns/job", "uid-1") is None
