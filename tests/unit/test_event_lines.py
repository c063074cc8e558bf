from tests.event_lines import complete_lines, json_events


def test_a_half_written_last_line_is_not_read() -> None:
    text = '{"event": "progress", "step": 1}\n{"event": "progress", "step": 2, "lo'
    assert json_events(text) == [{"event": "progress", "step": 1}]


def test_every_line_ended_by_a_newline_is_read_and_other_lines_are_left_out() -> None:
    text = 'starting\n{"event": "a"}\n{"event": "b"}\n'
    assert complete_lines(text) == ["starting", '{"event": "a"}', '{"event": "b"}']
    assert [e["event"] for e in json_events(text)] == ["a", "b"]
