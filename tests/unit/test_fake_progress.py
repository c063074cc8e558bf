"""bench/fake_progress.py: the stand-in /progress server answers per pod, its step moving on."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from fake_progress import FakeProgress  # noqa: E402 (beside the benchmarks, not a package)

from phalanx.controller.progress import progress_status  # noqa: E402

pytestmark = pytest.mark.unit


def test_each_pod_gets_its_own_moving_progress_document() -> None:
    fake = FakeProgress(seconds_per_step=0.05).start()
    try:
        url = fake.url_template.format(ip="10.0.0.7")

        def read() -> dict[str, object]:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return dict(json.loads(answer.read()))

        first = read()
        time.sleep(0.2)
        second = read()
        assert isinstance(first["step"], int) and isinstance(second["step"], int)
        assert second["step"] > first["step"]
        assert progress_status(second)["totalSteps"] == 1_000_000  # the poller reads it as a trainer's
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(
                fake.url_template.format(ip="10.0.0.7").replace("/progress", "/x"), timeout=5
            )
        assert fake.poll_count() == 2
    finally:
        fake.stop()
