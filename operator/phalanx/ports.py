"""Free local TCP ports for servers this project starts (dev cluster, tests, benchmarks)."""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack
from pathlib import Path

LOWEST_PORT = 15000
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range_start() -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(consecutive: int = 1, attempts: int = 200) -> int:
    """The first of `consecutive` ports that are free now, below the kernel's ephemeral range.

    A port the kernel handed out for bind(0) lies in the ephemeral range, where any outgoing
    connection (gloo opens dozens) may take it before our server binds it. Below that range only
    another explicit bind can.
    """
    highest = ephemeral_range_start() - consecutive
    for _ in range(attempts):
        base = random.randint(LOWEST_PORT, highest)
        try:
            with ExitStack() as stack:
                for port in range(base, base + consecutive):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("0.0.0.0", port))  # 0.0.0.0 also meets binds on any one address
            return base
        except OSError:
            continue
    raise OSError(f"no {consecutive} consecutive free ports between {LOWEST_PORT} and {highest}")
