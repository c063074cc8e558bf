"""The bind shim gives each dev-node pod its own ports: wildcard binds land on the pod's address."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.devnode.bindshim import build_bind_shim

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(
        shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler"
    ),
]

PROBE = """
import socket
v4 = socket.socket(); v4.bind(("0.0.0.0", 0))
v6 = socket.socket(socket.AF_INET6); v6.bind(("::", 0))
only6 = socket.socket(socket.AF_INET6)
only6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1); only6.bind(("::", 0))
explicit = socket.socket(); explicit.bind(("127.0.0.1", 0))
print(v4.getsockname()[0], v6.getsockname()[0], only6.getsockname()[0], explicit.getsockname()[0])
"""


def test_wildcard_binds_are_narrowed_to_the_pod_address(tmp_path: Path) -> None:
    library = build_bind_shim(tmp_path)
    assert library is not None and library.exists()
    assert build_bind_shim(tmp_path) == library  # built once, then reused

    env = {"LD_PRELOAD": str(library), "PHALANX_DEVNODE_POD_IP": "127.77.1.9"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)

    assert out.stdout.split() == ["127.77.1.9", "::ffff:127.77.1.9", "::", "127.0.0.1"]


def test_without_a_pod_address_binds_are_untouched(tmp_path: Path) -> None:
    library = build_bind_shim(tmp_path)
    assert library is not None
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={"LD_PRELOAD": str(library)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["0.0.0.0", "::", "::", "127.0.0.1"]
