"""Stand-in trainers for the progress poller's unit tests: one function answers both the polls
(controller/progress.read_within, http.client) and the hang probe (urllib)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.controller import progress as progress_module


def answer_with(monkeypatch: pytest.MonkeyPatch, urlopen: Any) -> None:
    """Trainers that answer as `urlopen(url, timeout)` does (a readable body, or an OSError)."""
    monkeypatch.setattr(progress_module.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(
        progress_module, "read_within", lambda url, timeout, _max: urlopen(url, timeout).read()
    )
