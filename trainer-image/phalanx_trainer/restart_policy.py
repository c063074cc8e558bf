"""What the resident launcher does on each event: the pure half of restart in place.

The launcher (resident.py) feeds events in and carries out the decision; nothing here touches a
process, a socket or the clock. docs/trainer.md "Restart in place" describes the same table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phalanx_trainer import contract


class State(enum.StrEnum):
    RUNNING = "running"  # workers of the current generation are up
    STOPPING = "stopping"  # a newer generation was accepted; the current workers are being stopped
    WAITING = "waiting"  # workers stopped (75) or failed; waiting for the operator's next generation
    SPARE = "spare"  # a standby: imports done, no worker until its first generation
    DONE = "done"  # the launcher is exiting with `exit_code`


class StopMode(enum.StrEnum):
    CHECKPOINT = "checkpoint"  # SIGTERM: every rank agrees on a step, saves, exits 75
    NOW = "now"  # SIGTERM, then SIGKILL after a short grace: resume from the newest checkpoint


# Variables a generation may change: where the rendezvous is and which rank this pod holds.
OVERRIDABLE_ENV: frozenset[str] = frozenset(
    {
        contract.ENV_NODE_RANK,
        contract.ENV_NNODES,
        contract.ENV_WORLD_SIZE,
        contract.ENV_MASTER_ADDR,
        contract.ENV_MASTER_PORT,
        contract.ENV_ATTEMPT,
    }
)


@dataclass(frozen=True)
class GenerationRequest:
    """A parsed POST /generation."""

    generation: int
    env: Mapping[str, str]
    stop: StopMode


class BadRequest(ValueError):
    """A POST body the launcher cannot act on; the message names the field and the fix."""


def parse_generation_request(body: Any, spare: bool) -> GenerationRequest:
    if not isinstance(body, dict):
        raise BadRequest('body: expected a JSON object such as {"generation": 1}')
    generation = body.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise BadRequest(f"generation: expected a non-negative integer, got {generation!r}")
    env = body.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str | int) for v in env.values()):
        raise BadRequest('env: expected an object of strings, such as {"NODE_RANK": "1"}')
    unknown = sorted(set(env) - OVERRIDABLE_ENV)
    if unknown:
        raise BadRequest(f"env: {', '.join(unknown)} cannot change per generation; allowed: "
                         f"{', '.join(sorted(OVERRIDABLE_ENV))}")  # fmt: skip
    if spare and contract.ENV_NODE_RANK not in env:
        raise BadRequest(
            f"env.{contract.ENV_NODE_RANK}: a spare's first generation must say which rank it takes"
        )
    stop = body.get("stop", StopMode.CHECKPOINT.value)
    if stop not in {mode.value for mode in StopMode}:
        raise BadRequest(f'stop: expected "checkpoint" or "now", got {stop!r}')
    return GenerationRequest(generation, {k: str(v) for k, v in env.items()}, StopMode(stop))


@dataclass(frozen=True)
class Admission:
    accepted: bool
    reason: str = ""


def admit(request: GenerationRequest, current: int, state: State) -> Admission:
    """Fencing at the launcher: only a strictly newer generation is taken, and never once done.

    A spare has no generation of its own yet, so its first request is taken at any number above
    the one it was started with.
    """
    if state is State.DONE:
        return Admission(False, "the launcher is exiting; the operator replaces this pod")
    if request.generation <= current:
        return Admission(False, f"generation {request.generation} is not newer than the current {current}")
    return Admission(True)


class Action(enum.StrEnum):
    START = "start"  # start the pending generation's workers
    WAIT = "wait"  # stay up, state waiting
    EXIT = "exit"  # exit with the code


@dataclass(frozen=True)
class Decision:
    action: Action
    exit_code: int = contract.EXIT_SUCCESS


def combine_exit_codes(codes: Sequence[int]) -> int:
    """0 if all are 0; 75 if every non-zero is 75; else the first other non-zero code."""
    failures = [code for code in codes if code != contract.EXIT_SUCCESS]
    if not failures:
        return contract.EXIT_SUCCESS
    others = [code for code in failures if code != contract.EXIT_CHECKPOINTED_ON_PREEMPTION]
    return others[0] if others else contract.EXIT_CHECKPOINTED_ON_PREEMPTION


def is_permanent(code: int) -> bool:
    """A config or code error: another generation would fail the same way (docs/environment.md)."""
    return 0 < code < 128 and code not in (
        contract.EXIT_CHECKPOINTED_ON_PREEMPTION,
        contract.EXIT_GENERATION_FAILED,
    )


def on_workers_exited(codes: Sequence[int], launcher_terminated: bool, pending: bool) -> Decision:
    """All workers of a generation have exited with `codes`.

    launcher_terminated: the launcher itself got SIGTERM (its pod is going away): exit as today.
    pending: a newer generation was accepted while they ran (state stopping).
    """
    code = combine_exit_codes(codes)
    if launcher_terminated or code == contract.EXIT_SUCCESS or is_permanent(code):
        return Decision(Action.EXIT, code)
    # 75 (agreed stop), 76 (a lost peer, fenced) or a signal: the pod is fine, the generation is over.
    return Decision(Action.START if pending else Action.WAIT, code)


def on_wait_expired(last_code: int | None) -> Decision:
    """No new generation came in time: exit so the operator's full gang restart takes over.

    A spare that was never assigned has no code; it exits 75: stopped on purpose, nothing lost.
    """
    return Decision(Action.EXIT, contract.EXIT_CHECKPOINTED_ON_PREEMPTION if last_code is None else last_code)


def on_launcher_terminated(state: State, last_code: int | None) -> Decision | None:
    """The launcher's own SIGTERM. With workers up it forwards the signal and decides when they exit
    (None); waiting or spare, it exits at once with the code its workers last left."""
    if state in (State.RUNNING, State.STOPPING):
        return None
    return on_wait_expired(last_code)
