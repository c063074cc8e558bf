"""policy/elastic.py: the size of each attempt of an elastic gang, and when a running one grows."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.pod_facts import attempt_replicas, attempt_spec
from phalanx.policy.elastic import (
    Room,
    checkpointed_since_admission,
    grow_size,
    resize_message,
    start_size,
)

pytestmark = pytest.mark.unit

TEMPLATE = {"spec": {"containers": [{"name": "trainer"}]}}
ADMITTED = {"admittedTime": "2027-01-15T08:00:00Z"}
CHECKPOINT_AFTER = {
    **ADMITTED,
    "lastCheckpoint": {
        "step": 20,
        "time": "2027-01-15T08:05:00.250Z",
        "observedTime": "2027-01-15T08:05:01Z",
    },
}


def spec(**fields: Any) -> TrainingJobSpec:
    return parse(TrainingJobSpec, {"template": TEMPLATE, **fields})


def elastic(low: int, high: int, **fields: Any) -> TrainingJobSpec:
    return spec(elastic={"minReplicas": low, "maxReplicas": high}, **fields)


def test_replicas_left_out_is_max_replicas_with_elastic_and_one_without() -> None:
    assert elastic(1, 4).replicas == 4
    assert spec().replicas == 1
    assert elastic(1, 4, replicas=3).replicas == 3


def test_a_new_attempt_takes_the_largest_size_that_fits_within_the_range() -> None:
    assert start_size(elastic(1, 4), Room(pods=3)) == 3
    assert start_size(elastic(1, 4), Room(pods=9)) == 4
    assert start_size(elastic(1, 4, replicas=2), Room(pods=9)) == 2


def test_when_not_even_min_fits_the_attempt_waits_at_min() -> None:
    assert start_size(elastic(2, 4), Room(pods=1)) == 2
    assert start_size(elastic(2, 4), Room(pods=0)) == 2


def test_a_fixed_size_job_is_never_resized() -> None:
    fixed = spec(replicas=3)
    assert start_size(fixed, Room(pods=1)) == 3
    assert attempt_replicas(fixed, {"currentReplicas": 1}) == 3
    assert grow_size(fixed, 1, Room(pods=5), CHECKPOINT_AFTER) is None


def test_the_attempt_runs_at_status_current_replicas_kept_within_range() -> None:
    assert attempt_replicas(elastic(1, 4), {"currentReplicas": 2}) == 2
    assert attempt_replicas(elastic(2, 4), {"currentReplicas": 1}) == 2  # min raised while suspended
    assert attempt_replicas(elastic(1, 4), {}) == 4
    sized = attempt_spec(elastic(1, 4, procsPerReplica=2), {"currentReplicas": 2})
    assert sized.replicas == 2 and sized.world_size == 4


def test_a_gang_grows_into_free_room_after_a_checkpoint_since_its_admission() -> None:
    assert grow_size(elastic(1, 4), 1, Room(pods=2), CHECKPOINT_AFTER) == 3
    assert grow_size(elastic(1, 4), 3, Room(pods=5), CHECKPOINT_AFTER) == 4


def test_no_growth_without_a_checkpoint_since_admission() -> None:
    before = {**ADMITTED, "lastCheckpoint": {"step": 10, "time": "2027-01-15T07:59:59.900Z",
                                             "observedTime": "2027-01-15T07:59:59Z"}}  # fmt: skip
    assert grow_size(elastic(1, 4), 1, Room(pods=3), before) is None
    assert grow_size(elastic(1, 4), 1, Room(pods=3), ADMITTED) is None
    assert checkpointed_since_admission(CHECKPOINT_AFTER)


def test_no_growth_without_room_or_at_full_size() -> None:
    assert grow_size(elastic(1, 4), 1, Room(pods=0), CHECKPOINT_AFTER) is None
    assert grow_size(elastic(1, 4), 4, Room(pods=3), CHECKPOINT_AFTER) is None
    assert grow_size(elastic(1, 4), 1, None, CHECKPOINT_AFTER) is None


def test_the_resize_message_says_from_and_to() -> None:
    assert resize_message(2, 1, "after NodeLost") == "gang shrinks from 2 to 1 pod(s): after NodeLost"
    assert resize_message(1, 2, "after Resize") == "gang grows from 1 to 2 pod(s): after Resize"


def in_steps_of(step: int, low: int, high: int, **fields: Any) -> TrainingJobSpec:
    return spec(elastic={"minReplicas": low, "maxReplicas": high, "replicasMultipleOf": step}, **fields)


def test_with_replicas_multiple_of_a_new_attempt_rounds_the_room_down_to_a_multiple() -> None:
    # A global batch of 96 divides 2, 4, 6, 8 ranks... but not 3, 5 or 7 (the trainer would exit 1).
    assert start_size(in_steps_of(2, 2, 8), Room(pods=7)) == 6
    assert start_size(in_steps_of(2, 2, 8), Room(pods=3)) == 2
    assert start_size(in_steps_of(2, 2, 8), Room(pods=1)) == 2  # waits at the smallest, a multiple
    assert start_size(in_steps_of(4, 4, 8, replicas=6), Room(pods=9)) == 4  # spec.replicas rounded down


def test_with_replicas_multiple_of_a_gang_grows_only_by_whole_multiples() -> None:
    assert grow_size(in_steps_of(2, 2, 8), 2, Room(pods=3), CHECKPOINT_AFTER) == 4
    assert grow_size(in_steps_of(2, 2, 8), 2, Room(pods=1), CHECKPOINT_AFTER) is None
    assert grow_size(in_steps_of(4, 4, 8, replicas=6), 4, Room(pods=5), CHECKPOINT_AFTER) is None


def test_a_checkpoint_counts_by_when_the_operator_saw_it_not_by_the_trainers_clock() -> None:
    # The trainer's clock runs ahead: its timestamp says after the admission, the operator saw the
    # checkpoint before it (the attempt before wrote it). No growth: a restart would lose more.
    ahead = {**ADMITTED, "lastCheckpoint": {"step": 10, "time": "2027-01-15T08:09:00.000Z",
                                            "observedTime": "2027-01-15T07:59:50Z"}}  # fmt: skip
    assert not checkpointed_since_admission(ahead)
    # Behind: its timestamp says before the admission, the operator first saw it after.
    behind = {**ADMITTED, "lastCheckpoint": {"step": 20, "time": "2027-01-15T07:50:00.000Z",
                                             "observedTime": "2027-01-15T08:05:01Z"}}  # fmt: skip
    assert checkpointed_since_admission(behind)
    # Stored before the operator stamped its observations: not known to be newer, no growth yet.
    assert not checkpointed_since_admission(
        {**ADMITTED, "lastCheckpoint": {"step": 20, "time": "2027-01-15T08:05:00Z"}}
    )
