"""Waiting for a CRD to be served: `kubectl wait --for=condition=Established` errors out, instead of
waiting, while the CRD has no status conditions yet (seen with the 166 KB TrainingJob CRD)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any


def established(crd: Mapping[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def wait_established(kubectl: Sequence[str], names: Sequence[str], timeout: float = 60.0) -> None:
    """`kubectl`: the argv prefix (binary and --kubeconfig). Raises TimeoutError naming the CRDs left."""
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        out = subprocess.run([*kubectl, "get", "crd", *pending, "-o", "json"], capture_output=True, text=True)
        if out.returncode == 0:
            answer = json.loads(out.stdout)
            items = answer.get("items") or [] if "items" in answer else [answer]  # one name: no List
            ready = {item["metadata"]["name"] for item in items if established(item)}
            pending = [name for name in pending if name not in ready]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRDs not Established after {timeout:.0f}s: {pending}")
        time.sleep(0.2)
