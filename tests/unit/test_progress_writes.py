from phalanx.policy.progress_writes import progress_write_due

STEP_10 = {"progress": {"step": 10}}
STEP_11 = {"progress": {"step": 11}}


def test_first_report_is_written_at_once() -> None:
    assert progress_write_due(None, None, STEP_10, now=100.0, interval=30.0)


def test_unchanged_progress_is_never_written_again() -> None:
    assert not progress_write_due(STEP_10, 0.0, dict(STEP_10), now=1000.0, interval=30.0)


def test_new_step_waits_for_the_interval() -> None:
    assert not progress_write_due(STEP_10, 100.0, STEP_11, now=129.9, interval=30.0)
    assert progress_write_due(STEP_10, 100.0, STEP_11, now=130.0, interval=30.0)


def test_new_checkpoint_is_written_at_once() -> None:
    saved = {**STEP_11, "lastCheckpoint": {"step": 11, "time": "2026-01-01T00:00:00Z"}}
    assert progress_write_due(STEP_10, 100.0, saved, now=101.0, interval=30.0)
    # the same checkpoint again, with a newer step: the interval holds once more
    later = {"progress": {"step": 12}, "lastCheckpoint": saved["lastCheckpoint"]}
    assert not progress_write_due(saved, 101.0, later, now=102.0, interval=30.0)


# -- decisions read the freshest progress, the status write keeps the interval (review, steady state)


def test_a_disruption_books_the_step_the_trainer_last_reported_not_the_last_written() -> None:
    # From the review: status.progress may be 30 s old; the step at disruption (and so the redone
    # steps and goodput) must come from the newest report the poller holds back.
    from phalanx.policy.progress_writes import decided_on
    from phalanx.reconcile.lifecycle import decide
    from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

    stored = {**RUNNING, "progress": {"step": 10, "totalSteps": 100, "percent": 10}}
    held = {"step": 35, "totalSteps": 100, "percent": 35}
    evicted = pod(1, phase="Failed", exit_code=75)
    plan = decide(job(decided_on(stored, held)), [pod(0), evicted], NODES, NOW)
    assert plan.status["lastRecovery"]["stepAtDisruption"] == 35


def test_the_write_keeps_the_stored_progress_unless_the_phase_changed() -> None:
    from phalanx.policy.progress_writes import settle_progress

    stored = {"phase": "Running", "progress": {"step": 10}}
    held = {"step": 35}
    same = {"phase": "Running", "progress": {"step": 35}}
    settle_progress(stored, same, held)
    assert same["progress"] == {"step": 10}  # the interval still holds it back
    restarting = {"phase": "Restarting", "progress": {"step": 35}}
    settle_progress(stored, restarting, held)
    assert restarting["progress"] == {"step": 35}  # goes with the phase change
    finished = {"phase": "Succeeded", "progress": {"step": 100, "percent": 100}}
    settle_progress(stored, finished, held)
    assert finished["progress"] == {"step": 100, "percent": 100}  # what the decision set wins
    unwritten = {"phase": "Running", "progress": {"step": 35}}
    settle_progress({"phase": "Running"}, unwritten, held)
    assert "progress" not in unwritten
