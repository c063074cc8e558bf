"""The trainer's JSON event lines from a log that may still be written to."""

from __future__ import annotations

import json
from typing import Any


def complete_lines(text: str) -> list[str]:
    """The lines that end in a newline: a reader racing the writer may see the last one half written."""
    return text.split("\n")[:-1]


def json_events(text: str) -> list[dict[str, Any]]:
    """Every complete line that is a JSON object, in order."""
    return [json.loads(line) for line in complete_lines(text) if line.startswith("{")]
