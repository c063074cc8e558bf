"""Publishing a restart generation to the kept pods of an in-place attempt (thin I/O; the decision
is reconcile/rules/in_place.py, the launcher's side docs/trainer.md "Restart in place").

After the status that keeps the pods is written, each kept pod's resident launcher is POSTed
generation N (the attempt) with PHALANX_ATTEMPT=N, concurrently and with a short timeout, off the
reconcile's thread. Idempotent: a pod told (uid, N) is not told again by this process, and after an
operator restart the launcher answers 409 with its generation at N or newer, which counts as done.
A launcher that refuses (409 below N: it is exiting) or cannot be reached is a fact the next
reconcile reads (refusals()): rules/in_place.py falls back to a full restart.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from phalanx import constants as c
from phalanx.builders.names import master_addr_of
from phalanx.controller import failpoints
from phalanx.controller.queue import WorkQueue
from phalanx.pod_facts import in_current_attempt, kept_pod_uids, pod_attempt, replica_index, spare_ranks
from phalanx.policy.in_place import STOP_AT_CHECKPOINT, takes_generations

log = logging.getLogger("phalanx.controller")

GENERATION_TIMEOUT_SECONDS: Final = 2.0  # the launcher answers from its reaping loop, within ~1 s
GENERATION_TRIES: Final = 3  # a launcher busy forking may miss one; three misses is unreachable
GENERATION_RETRY_SECONDS: Final = 1.0
GENERATION_CONCURRENCY: Final = 8
GENERATION_MAX_BYTES: Final = 64 * 1024


@dataclass(frozen=True)
class GenerationAnswer:
    """What a launcher said: taken (202, or 409 at this generation or newer), or refused and why."""

    taken: bool
    why: str = ""


def post_generation(
    pod_ip: str, port: int, body: Mapping[str, Any], headers: Mapping[str, str]
) -> tuple[int, dict[str, Any]]:
    """The one POST to a resident launcher's control server: (HTTP status, JSON answer). Raises
    OSError when it cannot be reached. The one place to add authentication headers."""
    request = urllib.request.Request(
        f"http://{pod_ip}:{port}{c.GENERATION_PATH}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=GENERATION_TIMEOUT_SECONDS) as response:
            return response.status, _json(response.read(GENERATION_MAX_BYTES))
    except urllib.error.HTTPError as err:
        return err.code, _json(err.read(GENERATION_MAX_BYTES))


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def judge_answer(status: int, answer: Mapping[str, Any], generation: int) -> GenerationAnswer:
    """202: taken. 409 with the launcher at (or pending) this generation or newer: it has it already
    (a repeat after an operator restart). Any other answer: refused, with the launcher's words."""
    if status == 202:
        return GenerationAnswer(True)
    if status == 409:
        held = [answer.get("generation"), answer.get("pending_generation")]
        if any(isinstance(g, int) and not isinstance(g, bool) and g >= generation for g in held):
            return GenerationAnswer(True)
    return GenerationAnswer(False, f"HTTP {status}: {str(answer.get('error') or 'no reason given')[:200]}")


class GenerationPublisher:
    def __init__(
        self, work: WorkQueue, headers: Mapping[str, str] | None = None, cluster_domain: str = "cluster.local"
    ) -> None:
        self.work = work
        self.headers = dict(headers or {})
        self.cluster_domain = cluster_domain
        self.pool = ThreadPoolExecutor(GENERATION_CONCURRENCY, thread_name_prefix="generation")
        self._lock = threading.Lock()
        # job key -> (pod uid, generation) taken, or being told now; the job's entry goes with it.
        self._told: dict[str, set[tuple[str, int]]] = {}
        # job key -> (job uid, attempt, {pod name: why}): launchers that did not take the generation.
        self._refused: dict[str, tuple[str, int, dict[str, str]]] = {}

    def forget(self, key: str) -> None:
        with self._lock:
            self._refused.pop(key, None)
            self._told.pop(key, None)

    def refusals(self, key: str, job_uid: str, attempt: int) -> dict[str, str]:
        """Kept pods of this job's current attempt whose launcher refused it or was unreachable."""
        with self._lock:
            found = self._refused.get(key)
        if found is None or found[0] != job_uid or found[1] != attempt:
            return {}
        return dict(found[2])

    def publish(self, key: str, job_uid: str, pods: list[dict[str, Any]], status: Mapping[str, Any]) -> None:
        """Tells every kept pod of the current in-place attempt its generation, once (in the
        background); returns at once."""
        kept = kept_pod_uids(status)
        if not kept or status.get("phase") in ("Succeeded", "Failed"):
            return
        attempt = int(status.get("attempt") or 0)
        stop = str((status.get("inPlace") or {}).get("stop") or STOP_AT_CHECKPOINT)
        by_name = {p["metadata"]["name"]: p for p in pods}
        ranks = spare_ranks(status)
        master = self._master_addr(key, pods, status) if ranks else None
        for name, uid in kept.items():
            pod = by_name.get(name)
            ip = ((pod or {}).get("status") or {}).get("podIP")
            if pod is None or pod["metadata"].get("uid") != uid or not ip:
                continue  # gone: the pod's own outcome says so to the next reconcile
            if name in ranks and master is None:
                continue  # a spare meets rank 0: told once its address is known (a later pass)
            if not takes_generations(pod):
                continue  # a torchrun agent: it takes the replacement in by itself
            with self._lock:
                told = self._told.setdefault(key, set())
                if (uid, attempt) in told:
                    continue
                # Earlier attempts' generations are never told again: only this one's is kept.
                told -= {t for t in told if t[1] < attempt}
                told.add((uid, attempt))
            token = ((pod.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_CONTROL_TOKEN)
            env = {c.ENV_ATTEMPT: str(attempt)}
            if name in ranks:
                # A warm spare: it takes the lost rank, and meets rank 0 of this attempt (it may have
                # been created in an earlier one, whose rank 0 had another name).
                env[c.ENV_NODE_RANK] = str(ranks[name])
                env[c.ENV_MASTER_ADDR] = str(master)
            self.pool.submit(self._tell, key, job_uid, name, uid, str(ip), attempt, token, stop, env)

    def _master_addr(self, key: str, pods: list[dict[str, Any]], status: Mapping[str, Any]) -> str | None:
        """Rank 0's DNS name in the current attempt (its pod's name says whether the attempt took
        `-a<attempt>` names, builders/names.py); None when no rank 0 is seen."""
        rank0 = next(
            (p for p in pods if in_current_attempt(p, status) and replica_index(p, status) == 0), None
        )
        if rank0 is None:
            return None
        namespace, job_name = key.split("/", 1)
        return master_addr_of(
            job_name, namespace, rank0["metadata"]["name"], pod_attempt(rank0), self.cluster_domain
        )

    def _tell(
        self,
        key: str,
        job_uid: str,
        pod: str,
        uid: str,
        ip: str,
        attempt: int,
        token: str | None = None,
        stop: str = STOP_AT_CHECKPOINT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        headers = {**self.headers, **({"Authorization": f"Bearer {token}"} if token else {})}
        body = {
            "generation": attempt,
            "env": dict(env) if env is not None else {c.ENV_ATTEMPT: str(attempt)},
            "stop": stop,
        }
        answer = GenerationAnswer(False, "not tried")
        for tries in range(1, GENERATION_TRIES + 1):
            try:
                answer = judge_answer(
                    *post_generation(*failpoints.launcher_address(ip, c.DEFAULT_CONTROL_PORT), body, headers),
                    attempt,
                )
                break
            except OSError as err:
                answer = GenerationAnswer(False, f"unreachable at {ip}:{c.DEFAULT_CONTROL_PORT}: {err}")
                if tries < GENERATION_TRIES:
                    time.sleep(GENERATION_RETRY_SECONDS)
        if answer.taken:
            log.info("%s: %s took restart generation %d", key, pod, attempt)
            return
        log.warning("%s: %s did not take restart generation %d: %s", key, pod, attempt, answer.why)
        with self._lock:
            self._told.get(key, set()).discard((uid, attempt))
            known = self._refused.get(key)
            pods = dict(known[2]) if known is not None and known[:2] == (job_uid, attempt) else {}
            pods[pod] = answer.why
            self._refused[key] = (job_uid, attempt, pods)
        self.work.enqueue_threadsafe(key)
