"""Reading a run from rank 0's log: attempts, lost steps, kept steps, goodput; and the demo's examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from phalanx.demo import (
    PlotMark,
    disruption_marks,
    format_eta,
    kept_steps,
    lost_steps,
    parse_trainer_log,
    progress_line,
    summarize,
)

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]


def progress(step: int, loss: float) -> str:
    return json.dumps({"event": "progress", "step": step, "loss": loss, "tokens_per_second": 1000.0,
                       "eta_seconds": 5.0, "data_wait_s": 0.01, "forward_backward_s": 0.08, "optimizer_s": 0.01})  # fmt: skip


def log_of(*attempts: list[str]) -> str:
    lines = []
    for index, events in enumerate(attempts):
        lines.append(f"--- pod uid u{index} container trainer: python -m phalanx_trainer ---")
        lines.extend(events)
    return "\n".join(lines)


PREEMPTED_AT_3 = log_of(
    [progress(1, 5.0), progress(2, 4.0), progress(3, 3.5), '{"event": "preempted", "step": 3}'],
    ['{"event": "resumed", "step": 2}', "a traceback line", progress(3, 3.4), progress(4, 3.0),
     '{"event": "finished", "step": 4}'],
)  # fmt: skip


def test_attempts_are_split_at_the_dev_nodes_headers() -> None:
    first, second = parse_trainer_log(PREEMPTED_AT_3)
    assert (sorted(first.steps), first.preempted_at, first.finished) == ([1, 2, 3], 3, False)
    assert (sorted(second.steps), second.resumed_from, second.finished) == ([3, 4], 2, True)
    assert first.steps[2].loss == 4.0 and first.steps[2].step_seconds == pytest.approx(0.1)


def test_lost_steps_are_those_run_again_after_a_restart() -> None:
    attempts = parse_trainer_log(PREEMPTED_AT_3)
    assert lost_steps(attempts) == [1]
    assert lost_steps(attempts[:1]) == []


def test_kept_steps_take_the_later_attempt_where_they_overlap() -> None:
    kept = kept_steps(parse_trainer_log(PREEMPTED_AT_3))
    assert sorted(kept) == [1, 2, 3, 4]
    assert kept[3].loss == 3.4  # the redone step, not the lost one


def test_goodput_is_kept_step_time_over_elapsed_time() -> None:
    summary = summarize(parse_trainer_log(PREEMPTED_AT_3), elapsed_seconds=2.0, recover_seconds=[1.5])
    assert (summary.steps, summary.final_loss, summary.restarts, summary.lost_steps) == (4, 3.0, 1, [1])
    assert summary.useful_seconds == pytest.approx(0.4)
    assert summary.goodput == pytest.approx(0.2)
    assert summary.to_dict()["recover_seconds"] == [1.5]


def test_progress_line_shows_step_loss_throughput_and_eta() -> None:
    record = parse_trainer_log(PREEMPTED_AT_3)[1].steps[4]
    line = progress_line("Running", 1, record, 8, 2)
    assert "step 4/8" in line and "loss 3.0000" in line and "1,000 tok/s" in line and "ETA 5s" in line
    assert "[##########..........]" in line and "checkpoint 2" in line
    assert format_eta(125) == "2m05s"


def test_the_demo_jobs_inline_trainer_config_matches_the_example_file() -> None:
    config_map, job = yaml.safe_load_all((REPO_ROOT / "examples" / "demo-trainingjob.yaml").read_text())
    inline = yaml.safe_load(config_map["data"]["trainer.yaml"])
    assert inline == yaml.safe_load((REPO_ROOT / "examples" / "demo-trainer.yaml").read_text())
    assert (job["spec"]["replicas"], job["spec"]["procsPerReplica"]) == (2, 2)
    assert (
        job["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    )


def test_the_plot_marks_the_eviction_and_the_resume_step_apart() -> None:
    """Evicted at step 153, saved at SIGTERM at 167, resumed from 167: two marks, two steps."""
    log = log_of(
        [progress(152, 2.0), progress(153, 2.0), progress(167, 1.9), '{"event": "preempted", "step": 167}'],
        ['{"event": "resumed", "step": 167}', progress(168, 1.9)],
    )
    assert disruption_marks(parse_trainer_log(log), evicted_steps=[153]) == [
        PlotMark(153, "evicted at step 153", "eviction"),
        PlotMark(167, "resumed from its SIGTERM checkpoint at step 167", "resume"),
    ]


def test_a_resume_from_an_older_checkpoint_is_named_so() -> None:
    """No SIGTERM save (killed): training picks up at the periodic checkpoint before the eviction."""
    attempts = parse_trainer_log(PREEMPTED_AT_3.replace('{"event": "preempted", "step": 3}', ""))
    assert disruption_marks(attempts, evicted_steps=[3]) == [
        PlotMark(3, "evicted at step 3", "eviction"),
        PlotMark(2, "resumed from the newest checkpoint at step 2", "resume"),
    ]
