"""Where a pod's /progress is read (used by controller/progress.py for the polls and the hang probe,
and by settings.py to check PHALANX_PROGRESS_URL_TEMPLATE at start).

A template names the pod by {ip} and may name the trainer's port by {port}. Only benchmarks set one
(bench/steady_state.py points the poller at a stand-in server, kwok's pods serve nothing); a template
that reads another host than the pod's must be on this machine, or every job's progress would come
from, and be told to, one remote server."""

from __future__ import annotations

import ipaddress
from typing import Final
from urllib.parse import urlsplit

_SAMPLE_IPS: Final = ("192.0.2.1", "192.0.2.2")  # documentation addresses (RFC 5737)
_SAMPLE_PORT: Final = 9400


def progress_url(template: str, ip: str, port: int) -> str:
    """The URL of the pod at `ip`; an IPv6 address is bracketed, or urllib would read its colons as
    a port and every poll of an IPv6 cluster would fail as silence."""
    host = f"[{ip}]" if ":" in ip else ip
    return template.format(ip=host, port=port)


def template_problem(template: str) -> str | None:
    """Why the poller cannot use `template`, or None when it can."""
    try:
        urls = [progress_url(template, ip, _SAMPLE_PORT) for ip in _SAMPLE_IPS]
    except KeyError as exc:
        return f"names {{{exc.args[0]}}}; only {{ip}} and {{port}} are filled in"
    except (IndexError, ValueError) as exc:
        return f"is not a format string ({exc}); write the pod's place as {{ip}}"
    if urls[0] == urls[1]:
        return "lacks {ip} (or escapes it as {{ip}}): every job would read one document"
    parts = [urlsplit(url) for url in urls]
    if parts[0].scheme != "http":
        return f"has scheme {parts[0].scheme!r}: the trainer serves plain http"
    try:
        hosts = [p.hostname for p in parts]
    except ValueError as exc:
        return f"has no host a URL can carry ({exc})"
    if hosts[0] != hosts[1]:
        return None if hosts == list(_SAMPLE_IPS) else "puts {ip} in the host with more around it"
    return None if _loopback(hosts[0]) else f"reads host {hosts[0]!r}, not the pod's: only a loopback host"


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
