"""A benchmark killed with SIGTERM tears its cluster down (devcluster/cluster.down_on_sigterm):
its try/finally runs, as on Ctrl-C. Without the handler Python ends at once and the finally never
runs (the cluster's processes kept spinning)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = """
import sys, time
from pathlib import Path
from phalanx.devcluster.cluster import down_on_sigterm
if sys.argv[2] == "handled":
    down_on_sigterm()
marker = Path(sys.argv[1])
try:
    marker.write_text("up")
    time.sleep(60)
finally:
    marker.write_text("down")
"""


def killed(tmp_path: Path, mode: str) -> tuple[str, int]:
    marker = tmp_path / f"marker-{mode}"
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, str(marker), mode])
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text() == "up"):
        assert time.monotonic() < deadline and process.poll() is None, "the script did not start"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    return_code = process.wait(timeout=30)
    return marker.read_text(), return_code


def test_a_sigterm_runs_the_finally_that_brings_the_cluster_down(tmp_path: Path) -> None:
    assert killed(tmp_path, "handled") == ("down", 128 + signal.SIGTERM)


def test_without_the_handler_the_finally_never_runs(tmp_path: Path) -> None:
    # What the handler is for: Python's default SIGTERM ends the process on the spot.
    assert killed(tmp_path, "default") == ("up", -signal.SIGTERM)
