from phalanx.policy.progress_writes import poller_wakes_reconcile, progress_write_due, sample_due

STEP_10 = {"progress": {"step": 10}}
STEP_11 = {"progress": {"step": 11}}


def test_first_report_is_written_at_once() -> None:
    assert progress_write_due(None, STEP_10)


def test_unchanged_progress_is_never_written_again() -> None:
    assert not progress_write_due(STEP_10, dict(STEP_10))


def test_a_new_step_is_held_for_the_reconciles_write_once_the_interval_has_passed() -> None:
    assert not progress_write_due(STEP_10, STEP_11)
    assert not sample_due(100.0, now=129.9, interval=30.0)
    assert sample_due(100.0, now=130.0, interval=30.0)
    assert sample_due(None, now=0.0, interval=30.0)  # none written by this process yet


def test_the_poller_wakes_the_reconcile_only_for_an_interval_shorter_than_the_resync() -> None:
    assert poller_wakes_reconcile(1.0, resync_seconds=20.0)
    assert not poller_wakes_reconcile(30.0, resync_seconds=20.0)


def test_new_checkpoint_is_written_at_once() -> None:
    saved = {**STEP_11, "lastCheckpoint": {"step": 11, "time": "2026-01-01T00:00:00Z"}}
    assert progress_write_due(STEP_10, saved)
    # the same checkpoint again, with a newer step: held once more
    later = {"progress": {"step": 12}, "lastCheckpoint": saved["lastCheckpoint"]}
    assert not progress_write_due(saved, later)


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


def test_the_write_keeps_the_stored_progress_unless_due_or_the_status_is_written_anyway() -> None:
    from phalanx.policy.progress_writes import settle_progress

    stored = {"phase": "Running", "progress": {"step": 10}}
    held = {"step": 35}
    same = {"phase": "Running", "progress": {"step": 35}}
    settle_progress(stored, same, held)
    assert same["progress"] == {"step": 10}  # the interval still holds it back
    due = {"phase": "Running", "progress": {"step": 35}}
    settle_progress(stored, due, held, due=True)
    assert due["progress"] == {"step": 35}  # the periodic sample
    booked = {"phase": "Running", "progress": {"step": 35}, "goodput": {"ratio": "0.9"}}
    settle_progress(stored, booked, held)
    assert booked["progress"] == {"step": 35}  # a write happens anyway: it costs nothing there
    restarting = {"phase": "Restarting", "progress": {"step": 35}}
    settle_progress(stored, restarting, held)
    assert restarting["progress"] == {"step": 35}  # goes with the phase change
    finished = {"phase": "Succeeded", "progress": {"step": 100, "percent": 100}}
    settle_progress(stored, finished, held)
    assert finished["progress"] == {"step": 100, "percent": 100}  # what the decision set wins
    unwritten = {"phase": "Running", "progress": {"step": 35}}
    settle_progress({"phase": "Running"}, unwritten, held)
    assert "progress" not in unwritten
