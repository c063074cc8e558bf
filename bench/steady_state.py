"""Steady state at scale: what the operator costs while thousands of jobs simply run.

One local control plane (real API server, scheduler, controller-manager) with kwok nodes, one
operator process (`phalanx operator`, as the image runs it, with the chart's defaults), many
TrainingJobs of 2 pods that run for an hour (kwok stage). Once every job runs and a settle period
has passed, nothing is submitted for the window (10 minutes by default) and the operator is
measured: resident memory (sampled), CPU (cores, from /proc), the API requests it sent per second by
method and endpoint (its own phalanx_api_requests_total, scraped before and after: the API server's
apiserver_request_total would count kwok and the scheduler too), and reconciles per second
(phalanx_reconcile_duration_seconds' count).

kwok's pods have no trainer behind their IPs, so a stand-in answers /progress for every pod
(fake_progress.py, a step that moves on each second, as a trainer's does), the operator pointed at it
by $PHALANX_PROGRESS_URL_TEMPLATE: the polls (policy/progress_polls.py) and the periodic status
writes (policy/progress_writes.py) are then what is measured. --no-fake-progress measures the poller's
back-off against pods that never answer instead.

    make bench-gang                          # runs this after gang_bench.py (key steady_state)
    python bench/steady_state.py --nodes 1000 --jobs 4000
    PHALANX_BENCH_STEADY_SECONDS=60 python bench/steady_state.py --nodes 50 --jobs 100   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fake_progress import FakeProgress
from gang_bench import (  # beside this script (its directory is on sys.path when run)
    GROUP,
    JOB_LABEL,
    PLURAL,
    RESULTS,
    VERSION,
    Operator,
    PodWatch,
    bench_pool,
    create_namespace,
    log,
    pool_placement,
    remove_state,
    start_bench_cluster,
    training_job,
)
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from result_file import write_result

from phalanx import constants as c
from phalanx.devcluster.cluster import LocalCluster, down_on_sigterm
from phalanx.policy.hang import POLL_STALE_SECONDS
from phalanx.policy.progress_polls import SLOWEST_POLL_SECONDS

REPO = Path(__file__).resolve().parents[1]
ENV_WINDOW = "PHALANX_BENCH_STEADY_SECONDS"
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
GOALS = {"writes_per_second_per_job": 1 / 30, "cpu_cores": 0.2, "rss_mib_at_4000_jobs": 250}


def scrape(port: int) -> dict[str, dict[str, float]]:
    """{"requests": {"METHOD endpoint": total}, "reconciles": {"count": n}, "progress_writes":
    {"count": n}} from the operator."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    requests: dict[str, float] = {}
    reconciles = progress_writes = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "phalanx_api_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    key = f"{sample.labels['method']} {sample.labels['endpoint']}"
                    requests[key] = requests.get(key, 0.0) + sample.value
        elif family.name == "phalanx_reconcile_duration_seconds":
            reconciles += sum(s.value for s in family.samples if s.name.endswith("_count"))
        elif family.name == "phalanx_progress_writes":
            progress_writes += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return {
        "requests": requests,
        "reconciles": {"count": reconciles},
        "progress_writes": {"count": progress_writes},
    }


def poll_pace(jobs: int, polls_per_second: float, stale_seconds: float = POLL_STALE_SECONDS,
              pace_seconds: float = SLOWEST_POLL_SECONDS) -> dict[str, Any]:  # fmt: skip
    """The seconds between two answered polls of one job (jobs / polls answered per second), and
    flags when that is longer than the hang rule's staleness bound (policy/hang.py: its verdicts
    then rest on old reads) or, by more than a tenth (the figure's own noise), than the slowest pace
    the poller keeps (policy/progress_polls.py: it fell behind)."""
    if polls_per_second <= 0:
        return {
            "seconds_between_polls_per_job": None,
            "poll_pace_flags": ["no /progress poll answered in the window"],
        }
    between = round(jobs / polls_per_second, 1)
    flags: list[str] = []
    if between > stale_seconds:
        flags.append(f"{between} s between polls of a job > POLL_STALE_SECONDS ({stale_seconds:.0f} s)")
    if between > 1.1 * pace_seconds:
        flags.append(f"{between} s between polls of a job > the poller's slowest pace ({pace_seconds:.0f} s)")
    return {"seconds_between_polls_per_job": between, "poll_pace_flags": flags}


def steady_state(api: client.ApiClient, operator: Operator, jobs: int, window: float, settle: float,
                 timeout: float, fake: FakeProgress | None = None) -> dict[str, Any]:  # fmt: skip
    core: Any = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    ns = "steady"
    create_namespace(core, ns)
    watch = PodWatch(core, ns, JOB_LABEL).start()
    time.sleep(0.5)
    placement = pool_placement("main")
    log(f"steady state: {jobs} jobs of 2 pods")

    def submit(i: int) -> None:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, training_job(f"s{i}", 2, 1, "3600s", placement)
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(submit, range(jobs)))
    groups = {f"s{i}": 2 for i in range(jobs)}
    started, deadline, last_report = time.monotonic(), time.monotonic() + timeout, 0.0
    while len(done := watch.all_running_at(groups)) < jobs:
        if time.monotonic() > deadline:
            log(f"  only {len(done)}/{jobs} jobs running after {timeout:.0f}s; measuring anyway")
            break
        if time.monotonic() - last_report > 15:
            log(f"  {len(done)}/{jobs} jobs running, operator RSS {operator.rss_mib()[0]:.0f} MiB")
            last_report = time.monotonic()
        time.sleep(1)
    running = len(watch.all_running_at(groups))
    all_running_seconds = round(time.monotonic() - started, 1)
    log(f"  {running} jobs running after {all_running_seconds} s; settling {settle:.0f} s")
    time.sleep(settle)  # the last creations' follow-ups and the first resyncs

    log(f"  measuring {window:.0f} idle seconds")
    polls_before = fake.poll_count() if fake is not None else 0
    before, cpu_before, at_before = scrape(operator.metrics_port), operator.cpu_seconds(), time.monotonic()
    rss: list[float] = []
    end = at_before + window
    while time.monotonic() < end:
        rss.append(operator.rss_mib()[0])
        time.sleep(min(5.0, max(0.0, end - time.monotonic())))
    after, cpu_after, at_after = scrape(operator.metrics_port), operator.cpu_seconds(), time.monotonic()
    polls_after = fake.poll_count() if fake is not None else 0
    elapsed = at_after - at_before
    per_second = {
        key: round((total - before["requests"].get(key, 0.0)) / elapsed, 3)
        for key, total in sorted(after["requests"].items())
        if total - before["requests"].get(key, 0.0) > 0
    }
    by_verb: dict[str, float] = {}
    for key, rate in per_second.items():
        method = key.split(" ", 1)[0]
        by_verb[method] = round(by_verb.get(method, 0.0) + rate, 3)
    writes = round(sum(r for m, r in by_verb.items() if m in WRITE_METHODS), 3)
    status_writes = round(
        sum(
            r for k, r in per_second.items() if k.split(" ", 1)[0] in WRITE_METHODS and k.endswith("/status")
        ),
        3,
    )
    progress_writes = round(
        (after["progress_writes"]["count"] - before["progress_writes"]["count"]) / elapsed, 3
    )
    polls = round((polls_after - polls_before) / elapsed, 2) if fake is not None else None
    core.delete_namespace(ns)
    cpu = round((cpu_after - cpu_before) / elapsed, 3)
    peak_rss = round(operator.rss_mib()[1], 1)
    return {
        "jobs": jobs,
        "pods": 2 * jobs,
        "jobs_running": running,
        "all_running_seconds": all_running_seconds,
        "window_seconds": round(elapsed, 1),
        "operator_cpu_cores": cpu,
        "operator_rss_mib_median": round(statistics.median(rss), 1) if rss else None,
        "operator_rss_mib_max_in_window": round(max(rss), 1) if rss else None,
        "operator_peak_rss_mib": peak_rss,
        "api_requests_per_second_by_verb": by_verb,
        "api_requests_per_second": per_second,
        "writes_per_second": writes,
        "writes_goal_per_second": round(jobs * GOALS["writes_per_second_per_job"], 2),
        # Answered by fake_progress.py (None: run with --no-fake-progress, every poll unanswered).
        "progress_polls_per_second": polls,
        **(poll_pace(running, polls) if polls is not None else {}),
        "status_writes_per_second": status_writes,
        # The poller's (phalanx_progress_writes_total: first reports, new checkpoints), and the rest
        # of the status writes: the reconcile's (phase changes, and a Running job's periodic write,
        # the progress sample with its goodput booking, policy/progress_writes.py).
        "progress_writes_per_second": progress_writes,
        "reconcile_status_writes_per_second": round(max(0.0, status_writes - progress_writes), 3),
        "reconciles_per_second": round(
            (after["reconciles"]["count"] - before["reconciles"]["count"]) / elapsed, 3
        ),
        "goals": {
            "writes_per_second": f"<= jobs/30 = {jobs / 30:.1f}",
            "cpu_cores": "<= 0.2",
            "rss_mib": "<= 250 at 4000 jobs",
        },  # fmt: skip
    }


def rows(steady: dict[str, Any]) -> list[tuple[str, str]]:
    verbs = ", ".join(f"{m} {r}" for m, r in steady["api_requests_per_second_by_verb"].items()) or "none"
    return [
        ("steady state: jobs (running) x 2 pods", f"{steady['jobs']} ({steady['jobs_running']})"),
        ("  idle window", f"{steady['window_seconds']} s"),
        ("  operator CPU (goal <= 0.2 core)", f"{steady['operator_cpu_cores']} cores"),
        ("  operator RSS median / peak", f"{steady['operator_rss_mib_median']} / {steady['operator_peak_rss_mib']} MiB"),
        ("  API requests/s by verb", verbs),
        ("  writes/s (goal <= jobs/30)", f"{steady['writes_per_second']} (<= {steady['writes_goal_per_second']})"),
        ("  of them status writes/s", f"{steady['status_writes_per_second']}"),
        ("    progress (poller) / reconcile", f"{steady['progress_writes_per_second']} / {steady['reconcile_status_writes_per_second']}"),
        ("  /progress polls/s answered", f"{steady['progress_polls_per_second']}"),
        ("  s between polls of a job", f"{steady.get('seconds_between_polls_per_job')}"),
        ("  FLAGGED", "; ".join(steady.get("poll_pace_flags") or []) or "no"),
        ("  reconciles/s", f"{steady['reconciles_per_second']}"),
    ]  # fmt: skip


def main() -> int:
    down_on_sigterm()  # a killed run tears its cluster down
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000, help="kwok nodes x 8 GPUs")
    parser.add_argument("--jobs", type=int, default=4000, help="running jobs of 2 pods x 1 GPU")
    parser.add_argument(
        "--window",
        type=float,
        default=float(os.environ.get(ENV_WINDOW) or 600),
        help=f"idle seconds measured (default 600, or ${ENV_WINDOW})",
    )
    parser.add_argument("--settle", type=float, default=60, help="seconds after all run, before measuring")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for every job to run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="merged into this file under steady_state")
    parser.add_argument(
        "--no-fake-progress", action="store_true", help="no stand-in /progress server: every poll fails"
    )
    args = parser.parse_args()  # fmt: skip

    started = time.time()
    state_dir = Path(tempfile.mkdtemp(prefix="phalanx-bench-steady-"))
    cluster = LocalCluster(state_dir, log=log)
    operator: Operator | None = None
    fake = None if args.no_fake_progress else FakeProgress().start()
    env = {c.ENV_PROGRESS_URL_TEMPLATE: fake.url_template} if fake is not None else {}
    succeeded = False
    try:
        kubeconfig, api = start_bench_cluster(cluster, [bench_pool("main", args.nodes)])
        operator = Operator(kubeconfig, state_dir / "operator.log", env)
        log(f"cluster ready ({time.time() - started:.0f}s); operator log {state_dir}/operator.log")
        steady = steady_state(api, operator, args.jobs, args.window, args.settle, args.timeout, fake)
        succeeded = True
    finally:
        if operator is not None:
            operator.stop()
        if fake is not None:
            fake.stop()
        cluster.down(quiet=True)
        remove_state(state_dir, succeeded)
    steady["nodes"] = args.nodes
    steady["wall_seconds"] = round(time.time() - started, 1)
    steady["command"] = " ".join(["python", "bench/steady_state.py", *sys.argv[1:]])
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    if "machine" in results and "platform" not in results["machine"]:  # gang_bench.py's: for its parts
        results["gang_parts_machine"] = results.pop("machine", None)
    results.pop("measured_at", None)
    write_result(args.out, {**results, "steady_state": steady})
    width = max(len(k) for k, _ in rows(steady))
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows(steady)))
    log(f"wrote {args.out} (steady_state) in {steady['wall_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
