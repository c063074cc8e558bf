"""Where a benchmark's JSON goes, stamped with the machine it ran on and when (shared by the
recovery and goodput benchmarks)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def write_result(path: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Writes `result` plus `machine` and `measured_at` to `path`; returns what was written."""
    stamped = {
        **result,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stamped, indent=2) + "\n")
    return stamped
