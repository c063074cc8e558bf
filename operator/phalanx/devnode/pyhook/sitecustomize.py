"""Narrows wildcard IPv4 binds of a dev-node pod's Python processes to the pod's own address.

Every dev-node pod shares the machine's network, so two pods that both listen on 0.0.0.0:9400 would
collide where two real pods (one network namespace each) would not. Binding to the pod IP instead
gives each pod its own port space on loopback. Python must find this file as `sitecustomize`, which
it does because the agent puts this directory first on PYTHONPATH.
"""

from __future__ import annotations

import os
import socket
from typing import Any

_POD_IP = os.environ.get("PHALANX_DEVNODE_POD_IP", "")
_WILDCARDS = ("", "0.0.0.0")


def _narrowed(sock: socket.socket, address: Any) -> Any:
    if sock.family == socket.AF_INET and isinstance(address, tuple) and address[0] in _WILDCARDS:
        return (_POD_IP, *address[1:])
    return address


if _POD_IP:
    _original_bind = socket.socket.bind

    def _bind(self: socket.socket, address: Any) -> None:
        _original_bind(self, _narrowed(self, address))

    socket.socket.bind = _bind  # type: ignore[method-assign,assignment]
