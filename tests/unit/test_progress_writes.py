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
