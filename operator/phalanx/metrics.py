"""The operator's Prometheus metrics and the small helpers the reconcile code calls to update them.

Everything lives in one private registry so the exposition holds exactly METRIC_NAMES plus the
process collector, and tests can read it without a server.  Per-job series (phase, checkpoint age,
progress, restarts, admission wait) are bounded by the number of live TrainingJobs: `forget_job`
drops them when a job is deleted.  Ages are computed at scrape time from stored timestamps, so a
stalled operator shows a growing age instead of a frozen one.

The job's name is the label `trainingjob`, not `job`: Prometheus owns `job` (the scrape job), and
the chart's PodMonitor gives trainer series the same `trainingjob` label so both sides join.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from phalanx.policy import goodput, recovery_timeline

RestartReason = Literal["failure", "preemption", "hang", "resize", "requeue"]
RESTART_REASONS: Final[tuple[RestartReason, ...]] = ("failure", "preemption", "hang", "resize", "requeue")
TERMINAL_PHASES: Final = ("Succeeded", "Failed")
JOB_LABELS: Final = ("namespace", "trainingjob")

# Scheduling waits range from seconds (free cluster) to hours (busy queue, Kueue-style backoff).
ADMISSION_WAIT_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
# A recovery takes seconds in place and minutes for a cold gang restart on a busy cluster.
RECOVERY_BUCKETS: Final = (0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
POLL_INTERVAL_BUCKETS: Final = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0)
RECONCILE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# Created series (`*_created`) double every counter's series count for little use on dashboards.
disable_created_metrics()  # type: ignore[no-untyped-call]

REGISTRY: Final = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)  # the usual process_* series, told apart by the scrape job

JOBS_CREATED: Final = Counter(
    "phalanx_jobs_created", "TrainingJobs the operator started managing.", registry=REGISTRY
)
JOBS_FINISHED: Final = Counter(
    "phalanx_jobs_finished",
    "TrainingJobs that reached a terminal phase, by result (succeeded or failed).",
    ["result"],
    registry=REGISTRY,
)
JOBS_BY_PHASE: Final = Gauge(
    "phalanx_jobs", "TrainingJobs the operator currently knows, by phase.", ["phase"], registry=REGISTRY
)
CRD_SCHEMA: Final = Gauge(
    "phalanx_crd_schema_info",
    "The installed TrainingJob CRD's schema digest and this operator's, read at start; current=\"false\": "
    "an older or other CRD, whose schema may drop status fields (apply the chart's CRDs).",
    ["current", "installed", "expected"],
    registry=REGISTRY,
)
ADMISSION_WAIT: Final = Histogram(
    "phalanx_admission_wait_seconds",
    "Time from a gang asking for admission to all its pods being admitted, by admitter (Builtin or "
    "Kueue) and Kueue ClusterQueue (empty for Builtin).",
    ["admitted_by", "cluster_queue"],
    buckets=ADMISSION_WAIT_BUCKETS,
    registry=REGISTRY,
)
GANG_ADMISSIONS: Final = Counter("phalanx_gang_admissions", "Gangs admitted as a whole.", registry=REGISTRY)
GANG_TIMEOUTS: Final = Counter(
    "phalanx_gang_timeouts",
    "Gangs that were not admitted within their admission timeout and were requeued.",
    registry=REGISTRY,
)
RECONCILE_DURATION: Final = Histogram(
    "phalanx_reconcile_duration_seconds",
    "Wall time of one reconcile handler call, by handler.",
    ["handler"],
    buckets=RECONCILE_BUCKETS,
    registry=REGISTRY,
)
RECONCILE_ERRORS: Final = Counter(
    "phalanx_reconcile_errors",
    "Reconcile handler calls that raised (kopf retries them), by handler.",
    ["handler"],
    registry=REGISTRY,
)
PODS_CREATED: Final = Counter("phalanx_pods_created", "Worker pods created.", registry=REGISTRY)
API_REQUESTS: Final = Counter(
    "phalanx_api_requests",
    "Requests the operator sent to the Kubernetes API, by method, endpoint (the API path template) "
    'and HTTP status code ("error" when no answer came).',
    ["method", "endpoint", "code"],
    registry=REGISTRY,
)
PROGRESS_WRITES: Final = Counter(
    "phalanx_progress_writes",
    "status.progress writes of the progress poller: a first report, a new checkpoint (the periodic "
    "sample goes with the reconcile's status writes, beside them in phalanx_api_requests_total).",
    registry=REGISTRY,
)
PROGRESS_POLL_INTERVAL: Final = Histogram(
    "phalanx_progress_poll_interval_seconds",
    "Seconds between the starts of two polls of a running job's /progress: the pace achieved "
    "(aimed at: 1 s up to 20 jobs, jobs/20 s up to 600, 30 s beyond; longer when the poll slots "
    "cannot keep it, or a trainer that does not answer is backed off).",
    buckets=POLL_INTERVAL_BUCKETS,
    registry=REGISTRY,
)
RECOVERY_SECONDS: Final = Histogram(
    "phalanx_recovery_seconds",
    "Time from a gang disruption being seen to the first training step after it, by restart reason "
    "and recovery path.",
    ["reason", "path"],
    buckets=RECOVERY_BUCKETS,
    registry=REGISTRY,
)
RECOVERY_PHASE_SECONDS: Final = Histogram(
    "phalanx_recovery_phase_seconds",
    "Time each phase of a recovery took (podsStopped, podsRunning, rendezvousDone, stateRestored, "
    "firstStep), from the end of the phase before it.",
    ["phase"],
    buckets=RECOVERY_BUCKETS,
    registry=REGISTRY,
)


# How long a deleted job's name is remembered: a reconcile under way when it went shows no ghost series.
DELETED_REMEMBERED_SECONDS: Final = 600.0


@dataclass(slots=True)
class _JobState:
    """Every per-job series, as plain values the collector turns into samples at scrape time: a
    metric child per job and series (a lock and a value object each) cost about 8 KB a job."""

    phase: str | None = None
    last_checkpoint_at: float | None = None
    waiting_since: float | None = None
    progress_ratio: float | None = None
    straggler_ratio: float | None = None
    goodput_ratio: float | None = None
    device_unit: str | None = None
    device_seconds: dict[str, float] | None = None  # by kind (goodput.TOTALS)
    restarts: dict[str, int] | None = None  # by reason
    resizes: dict[str, int] | None = None  # by direction
    levels_shown: bool = False  # observe_status showed its stored levels (see there)
    uid: str | None = None  # of the job these are, once a reconcile saw it alive


class _JobCollector(Collector):
    """Per-job series whose value depends on the time of the scrape."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], _JobState] = {}
        # Deleted jobs (uid, when): a poll or reconcile still under way for one must not bring its
        # series back. Forgotten once a job of another uid is seen alive under the name, or after
        # DELETED_REMEMBERED_SECONDS.
        self._deleted: dict[tuple[str, str], tuple[str, float]] = {}

    def _gone(self, key: tuple[str, str]) -> bool:
        deleted = self._deleted.get(key)
        return deleted is not None and self._clock() - deleted[1] <= DELETED_REMEMBERED_SECONDS

    def update(self, namespace: str, name: str, change: Callable[[_JobState], None]) -> None:
        with self._lock:
            if self._gone((namespace, name)):
                return  # a poll or reconcile that was under way when the job went: no ghost series
            change(self._jobs.setdefault((namespace, name), _JobState()))

    def levels_wanted(self, namespace: str, name: str) -> bool:
        """Its stored levels are still to be shown: not shown yet, and the job was not deleted."""
        with self._lock:
            state = self._jobs.get((namespace, name))
            shown = state is not None and state.levels_shown
            return not shown and not self._gone((namespace, name))

    def created(self, namespace: str, name: str) -> None:
        with self._lock:
            self._deleted.pop((namespace, name), None)  # a new job under a deleted one's name

    def alive(self, namespace: str, name: str, uid: str) -> None:
        """A reconcile found the job of this uid alive: a deletion remembered under its name was of
        a predecessor (a standby's, or one whose delete event came after its successor's first
        reconcile, which then never counts as created again), so its series show once more."""
        with self._lock:
            deleted = self._deleted.get((namespace, name))
            if deleted is not None and deleted[0] != uid:
                del self._deleted[(namespace, name)]
            if self._gone((namespace, name)):
                return  # this very job's deletion: a reconcile under way when it went
            state = self._jobs.get((namespace, name))
            if state is None or state.uid not in (None, uid):
                # A predecessor's values (its restart counts among them) are not this job's.
                state = self._jobs[(namespace, name)] = _JobState()
            state.uid = uid

    def pop(self, namespace: str, name: str, uid: str) -> _JobState | None:
        with self._lock:
            now = self._clock()
            for key, (_, at) in list(self._deleted.items()):
                if now - at > DELETED_REMEMBERED_SECONDS:
                    del self._deleted[key]
            self._deleted[(namespace, name)] = (uid, now)
            return self._jobs.pop((namespace, name), None)

    def phase_counts(self) -> dict[str, int]:
        with self._lock:
            counts: dict[str, int] = {}
            for state in self._jobs.values():
                if state.phase is not None:
                    counts[state.phase] = counts.get(state.phase, 0) + 1
            return counts

    def collect(self) -> Iterable[Metric]:
        now = self._clock()
        f = _JobFamilies()
        with self._lock:
            for (namespace, name), state in sorted(self._jobs.items()):
                job = [namespace, name]
                if state.phase is not None:
                    f.phase.add_metric([*job, state.phase], 1.0)
                if state.last_checkpoint_at is not None:
                    f.checkpoint_age.add_metric(job, max(0.0, now - state.last_checkpoint_at))
                if state.waiting_since is not None:
                    f.waiting.add_metric(job, max(0.0, now - state.waiting_since))
                if state.progress_ratio is not None:
                    f.progress.add_metric(job, state.progress_ratio)
                if state.straggler_ratio is not None:
                    f.stragglers.add_metric(job, state.straggler_ratio)
                if state.goodput_ratio is not None:
                    f.goodput.add_metric(job, state.goodput_ratio)
                for kind, seconds in (state.device_seconds or {}).items():
                    f.device_seconds.add_metric([*job, kind, state.device_unit or ""], seconds)
                for reason, count in (state.restarts or {}).items():
                    f.restarts.add_metric([*job, reason], count)
                for direction, count in (state.resizes or {}).items():
                    f.resizes.add_metric([*job, direction], count)
        return f.all()

    def describe(self) -> Iterable[Metric]:
        # Empty families: lets the registry check names without running a scrape-time computation.
        return _JobFamilies().all()


def _per_job(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=JOB_LABELS)


class _JobFamilies:
    """The per-job families, empty: one scrape's worth."""

    def __init__(self) -> None:
        self.phase = GaugeMetricFamily(
            "phalanx_job_phase",
            "1 for the current phase of each TrainingJob (one series per job).",
            labels=(*JOB_LABELS, "phase"),
        )
        self.checkpoint_age = _per_job(
            "phalanx_job_checkpoint_age_seconds",
            "Seconds since the newest valid checkpoint of a TrainingJob was written.",
        )
        self.waiting = _per_job(
            "phalanx_job_admission_waiting_seconds",
            "Seconds a TrainingJob's gang has been waiting for admission so far.",
        )
        self.progress = _per_job(
            "phalanx_job_progress_ratio",
            "Fraction of a TrainingJob's total steps completed (0 to 1), as reported by its trainer.",
        )
        self.stragglers = _per_job(
            "phalanx_job_straggler_ratio",
            "The slowest straggler's time over its peers' median (status.stragglers); 0 when none.",
        )
        self.goodput = _per_job(
            "phalanx_job_goodput_ratio",
            "Productive device time over device time since the job was created (status.goodput.ratio).",
        )
        self.device_seconds = GaugeMetricFamily(
            "phalanx_job_device_seconds",
            "Device-seconds of a job's gang (GPUs, MIG slices, or CPU cores: see `unit`) by kind: "
            "allocated, productive, and lost to waitingForAdmission, startup, recovery, redoneSteps, "
            "checkpointStalls, standbySpares (warm spares holding devices). "
            "A gauge: productive goes down when steps are lost and redone.",
            labels=(*JOB_LABELS, "kind", "unit"),
        )
        self.restarts = CounterMetricFamily(
            "phalanx_job_restarts",
            "Gang restarts of a TrainingJob, by reason (failure counts against the backoff limit, "
            "preemption not).",
            labels=(*JOB_LABELS, "reason"),
        )
        self.resizes = CounterMetricFamily(
            "phalanx_job_resizes",
            "Size changes of an elastic gang between attempts, by direction (grow or shrink).",
            labels=(*JOB_LABELS, "direction"),
        )

    def all(self) -> tuple[Metric, ...]:
        return (self.phase, self.checkpoint_age, self.waiting, self.progress, self.stragglers,
                self.goodput, self.device_seconds, self.restarts, self.resizes)  # fmt: skip


_JOBS: Final = _JobCollector(time.time)
REGISTRY.register(_JOBS)

# Every sample family the operator exports, as PromQL sees it in the Prometheus text format
# (counters with `_total`; histograms by base name, sampled as `_bucket`, `_sum`, `_count`).
METRIC_NAMES: Final = (
    "phalanx_crd_schema_info",
    "phalanx_jobs_created_total",
    "phalanx_jobs_finished_total",
    "phalanx_jobs",
    "phalanx_job_phase",
    "phalanx_job_restarts_total",
    "phalanx_admission_wait_seconds",
    "phalanx_job_admission_waiting_seconds",
    "phalanx_gang_admissions_total",
    "phalanx_gang_timeouts_total",
    "phalanx_reconcile_duration_seconds",
    "phalanx_reconcile_errors_total",
    "phalanx_pods_created_total",
    "phalanx_api_requests_total",
    "phalanx_progress_writes_total",
    "phalanx_progress_poll_interval_seconds",
    "phalanx_job_checkpoint_age_seconds",
    "phalanx_job_progress_ratio",
    "phalanx_recovery_seconds",
    "phalanx_recovery_phase_seconds",
    "phalanx_job_goodput_ratio",
    "phalanx_job_device_seconds",
    "phalanx_job_straggler_ratio",
    "phalanx_job_resizes_total",
)


def _refresh_phase_gauge(previous_phases: Iterable[str]) -> None:
    counts = _JOBS.phase_counts()
    for phase in set(previous_phases) | set(counts):
        JOBS_BY_PHASE.labels(phase=phase).set(counts.get(phase, 0))


def observe_job_alive(namespace: str, name: str, uid: str) -> None:
    """A reconcile found the job of this uid alive (see _JobCollector.alive)."""
    before = _JOBS.phase_counts()
    _JOBS.alive(namespace, name, uid)
    _refresh_phase_gauge(before)


def observe_job_created(namespace: str, name: str) -> None:
    """A TrainingJob was seen for the first time (its create handler ran)."""
    JOBS_CREATED.inc()
    _JOBS.created(namespace, name)


def observe_phase_change(namespace: str, name: str, old: str | None, new: str) -> None:
    """Record a job's current phase; idempotent, so a resumed operator may call it again."""
    before = _JOBS.phase_counts()

    def set_phase(state: _JobState) -> None:
        state.phase = new

    _JOBS.update(namespace, name, set_phase)
    if new in TERMINAL_PHASES and old != new:
        JOBS_FINISHED.labels(result=new.lower()).inc()
    _refresh_phase_gauge(before)


def observe_admission_wait_started(namespace: str, name: str, started_at: float) -> None:
    """The job's gang asked for admission at `started_at` (epoch seconds)."""

    def set_waiting(state: _JobState) -> None:
        state.waiting_since = started_at

    _JOBS.update(namespace, name, set_waiting)


def observe_gang_admitted(namespace: str, name: str, waited_seconds: float) -> None:
    """The whole gang was admitted after `waited_seconds`."""
    ADMISSION_WAIT.labels(admitted_by="Builtin", cluster_queue="").observe(max(0.0, waited_seconds))
    GANG_ADMISSIONS.inc()

    def clear_waiting(state: _JobState) -> None:
        state.waiting_since = None

    _JOBS.update(namespace, name, clear_waiting)


def observe_kueue_admitted(namespace: str, name: str, cluster_queue: str, waited_seconds: float) -> None:
    """Kueue admitted the job's Workload from `cluster_queue` after `waited_seconds` in its queue."""
    ADMISSION_WAIT.labels(admitted_by="Kueue", cluster_queue=cluster_queue).observe(max(0.0, waited_seconds))

    def clear_waiting(state: _JobState) -> None:
        state.waiting_since = None

    _JOBS.update(namespace, name, clear_waiting)


def observe_gang_timeout(namespace: str, name: str) -> None:
    """The gang missed its admission deadline and goes back to the queue (still waiting)."""
    GANG_TIMEOUTS.inc()


def observe_restart(namespace: str, name: str, reason: RestartReason) -> None:
    """The operator restarted the job's gang."""
    if reason not in RESTART_REASONS:
        raise ValueError(f"restart reason must be one of {RESTART_REASONS}, got {reason!r}")

    def count(state: _JobState) -> None:
        state.restarts = _counted(state.restarts, reason)

    _JOBS.update(namespace, name, count)


def _counted(counts: dict[str, int] | None, key: str) -> dict[str, int]:
    counts = counts if counts is not None else {}
    counts[key] = counts.get(key, 0) + 1
    return counts


def observe_pods_created(count: int = 1) -> None:
    PODS_CREATED.inc(count)


def observe_api_request(method: str, endpoint: str, code: int | None) -> None:
    API_REQUESTS.labels(method, endpoint, str(code) if code is not None else "error").inc()


def observe_progress_write() -> None:
    PROGRESS_WRITES.inc()


def observe_progress_poll_interval(seconds: float) -> None:
    PROGRESS_POLL_INTERVAL.observe(seconds)


def observe_checkpoint(namespace: str, name: str, saved_at: float) -> None:
    """The newest valid checkpoint of the job was written at `saved_at` (epoch seconds)."""

    def set_checkpoint(state: _JobState) -> None:
        if state.last_checkpoint_at is None or saved_at > state.last_checkpoint_at:
            state.last_checkpoint_at = saved_at

    _JOBS.update(namespace, name, set_checkpoint)


def observe_progress(namespace: str, name: str, completed_steps: int, total_steps: int) -> None:
    """The trainer reported `completed_steps` of `total_steps`."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    ratio = min(1.0, max(0.0, completed_steps / total_steps))

    def set_progress(state: _JobState) -> None:
        state.progress_ratio = ratio

    _JOBS.update(namespace, name, set_progress)


def observe_recovery(reason: str, path: str, total_seconds: float, phase_seconds: dict[str, float]) -> None:
    """A recovery finished: its total and the time each phase took (policy/recovery_timeline.py)."""
    RECOVERY_SECONDS.labels(reason=reason, path=path).observe(total_seconds)
    for phase, seconds in phase_seconds.items():
        RECOVERY_PHASE_SECONDS.labels(phase=phase).observe(seconds)


def observe_stragglers(namespace: str, name: str, ratios: list[float]) -> None:
    """The ratios of the ranks status.stragglers lists now (none: 0)."""
    slowest = max(ratios, default=0.0)

    def set_stragglers(state: _JobState) -> None:
        state.straggler_ratio = slowest

    _JOBS.update(namespace, name, set_stragglers)


def observe_replicas(namespace: str, name: str, old: int | None, new: int) -> None:
    """status.currentReplicas was set: a resize when an earlier size changed."""
    if old is not None and old != new:
        direction = "grow" if new > old else "shrink"

        def count(state: _JobState) -> None:
            state.resizes = _counted(state.resizes, direction)

        _JOBS.update(namespace, name, count)


def observe_goodput(namespace: str, name: str, ledger: dict[str, object]) -> None:
    """The job's status.goodput as written (policy/goodput.py)."""
    try:
        ratio = float(str(ledger["ratio"]))
    except (KeyError, ValueError):
        return
    unit = str(ledger.get("unit") or "")
    seconds = {
        kind: goodput.device_seconds(ledger, kind)
        for kind in goodput.TOTALS
        if isinstance(ledger.get(f"{kind}Seconds"), (int, float))
    }

    def set_goodput(state: _JobState) -> None:
        state.goodput_ratio, state.device_unit = ratio, unit
        # Kinds the ledger no longer lists keep their last value, as the gauges they replace did.
        state.device_seconds = {**(state.device_seconds or {}), **seconds}

    _JOBS.update(namespace, name, set_goodput)


def _restore_levels(namespace: str, name: str, stored: Mapping[str, Any]) -> None:
    """The gauges of a job as its stored status has them; nothing counted (it happened before)."""
    before = _JOBS.phase_counts()

    def set_phase(state: _JobState) -> None:
        state.phase = stored.get("phase")
        state.levels_shown = True

    _JOBS.update(namespace, name, set_phase)
    _refresh_phase_gauge(before)
    observe_stragglers(namespace, name, [float(s.get("ratio") or 0) for s in stored.get("stragglers") or []])
    if stored.get("goodput"):
        observe_goodput(namespace, name, stored["goodput"])


def observe_status(namespace: str, name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """What a decision changed in a job's status (`old` as stored before it, `new` as written).
    The first time this process sees a job (an operator just started or took over), its stored
    levels are shown first: a gauge set only on change would stay missing while nothing moves."""
    if _JOBS.levels_wanted(namespace, name):
        _restore_levels(namespace, name, old)
    if old.get("phase") != new.get("phase") and new.get("phase"):
        observe_phase_change(namespace, name, old.get("phase"), new["phase"])
    old_restarts, new_restarts = old.get("restarts") or {}, new.get("restarts") or {}
    for field_name, reason in (("failures", "failure"), ("preemptions", "preemption"), ("hangs", "hang"),
                               ("resizes", "resize"), ("requeues", "requeue")):  # fmt: skip
        if new_restarts.get(field_name, 0) > (old_restarts.get(field_name) or 0):
            observe_restart(namespace, name, reason)  # type: ignore[arg-type]
    admission = new.get("admission") or {}
    if admission.get("by") == "Kueue" and admission != (old.get("admission") or {}):
        waited = float(admission.get("waitedSeconds") or 0)
        observe_kueue_admitted(namespace, name, str(admission.get("clusterQueue") or ""), waited)
    if isinstance(new.get("currentReplicas"), int):
        observe_replicas(namespace, name, old.get("currentReplicas"), new["currentReplicas"])
    if (new.get("gangTimeouts") or 0) > (old.get("gangTimeouts") or 0):
        observe_gang_timeout(namespace, name)
    if new.get("stragglers") != old.get("stragglers"):
        ratios = [float(s.get("ratio") or 0) for s in new.get("stragglers") or []]
        observe_stragglers(namespace, name, ratios)
    if new.get("goodput") and new.get("goodput") != old.get("goodput"):
        observe_goodput(namespace, name, new["goodput"])
    recovery = new.get("lastRecovery")
    if recovery_timeline.is_complete(recovery) and not recovery_timeline.is_complete(old.get("lastRecovery")):
        observe_recovery(
            str(recovery.get("reason")),
            str(recovery.get("path")),
            recovery["phasesMilliseconds"]["firstStep"] / 1000,
            recovery_timeline.phase_durations(recovery),
        )


@contextmanager
def reconcile_timer(handler: str) -> Iterator[None]:
    """Time one handler call; count it as an error when it raises (the exception propagates)."""
    started = time.perf_counter()
    try:
        yield
    except BaseException:
        RECONCILE_ERRORS.labels(handler=handler).inc()
        raise
    finally:
        RECONCILE_DURATION.labels(handler=handler).observe(time.perf_counter() - started)


def forget_job(namespace: str, name: str, uid: str = "") -> None:
    """Drop every per-job series of a deleted job (of this uid; "" when not known), keeping label
    cardinality bounded by live jobs."""
    before = _JOBS.phase_counts()
    _JOBS.pop(namespace, name, uid)
    _refresh_phase_gauge(before)


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> WSGIServer:
    """Serve /metrics on a daemon thread; port 0 picks a free port (read `server.server_port`)."""
    server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
    return server


def observe_crd_schema(installed: str, expected: str) -> None:
    """The one series of phalanx_crd_schema_info: the digests read at start ("absent": none)."""
    CRD_SCHEMA.clear()
    CRD_SCHEMA.labels(current=str(installed == expected).lower(), installed=installed, expected=expected).set(
        1
    )
