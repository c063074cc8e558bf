"""Fault injection for reliability tests: an API server proxy that answers 429/503 on demand.

`FaultProxy` listens on plain HTTP on 127.0.0.1 and forwards every request to the real API server
over HTTPS with the cluster's admin client certificate. Responses are relayed as they arrive, so
watches stream through. While a fault window is open, the proxy answers instead of the API server
for requests drawn at random (a seeded generator, a set probability; the operator's threads take
their draws in whatever order their requests come, so runs differ, but each draw is as likely),
never more than a set number in a row on one endpoint (method + path), so a retried call gets
through, and only until a set number of faults was served: the window is measured in tries, not
seconds, so a slow machine sees as large a storm as a fast one. The first request of chosen
(method, path prefix) pairs is always refused, so what a test is about (a lost pod creation) meets
the storm for sure. With `lost_answers`, a chosen write (POST, PUT,
PATCH, DELETE) first reaches the API server and only its answer is replaced: the change is made and
the client is told it failed, as when a load balancer gives up after the API server committed.
`proxy_kubeconfig` writes a kubeconfig that points a client at the proxy.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import ssl
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

# Hop-by-hop headers (RFC 9110 section 7.6.1) are never forwarded; the proxy frames bodies itself.
HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade")
)
RELAY_CHUNK_BYTES = 64 * 1024
UPSTREAM_TIMEOUT_SECONDS = 600.0  # longer than any watch the operator opens (its client timeout: 330 s)
WRITE_METHODS = frozenset(("POST", "PUT", "PATCH", "DELETE"))


@dataclass(frozen=True)
class Fault:
    status: int
    after_upstream: bool  # the request is applied, only the answer is lost


@dataclass(frozen=True)
class Upstream:
    """Where and how to reach the real API server."""

    host: str
    port: int
    tls: ssl.SSLContext


@dataclass(frozen=True)
class Exchange:
    """One request the proxy saw: the status the client got, and the API server's when it was asked."""

    method: str
    path: str
    status: int
    injected: bool
    upstream_status: int | None  # None: the API server never saw the request
    at: float

    @property
    def is_watch(self) -> bool:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        return query.get("watch", [""])[0] in ("true", "1")


def _kubeconfig_file(entry: dict[str, Any], key: str, base: Path, scratch: Path) -> str:
    """A file path for `key` (a path relative to the kubeconfig) or `key-data` (base64, inline)."""
    inline = entry.get(f"{key}-data")
    if inline:
        path = scratch / key
        path.write_bytes(base64.b64decode(inline))
        return str(path)
    path = Path(entry[key])
    return str(path if path.is_absolute() else base / path)


def upstream_from_kubeconfig(kubeconfig: str | Path, scratch: Path) -> Upstream:
    """The first cluster's server and CA, authenticated as the first user's client certificate."""
    kubeconfig = Path(kubeconfig)
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    base = kubeconfig.parent
    tls = ssl.create_default_context(cafile=_kubeconfig_file(cluster, "certificate-authority", base, scratch))
    tls.load_cert_chain(
        _kubeconfig_file(user, "client-certificate", base, scratch),
        _kubeconfig_file(user, "client-key", base, scratch),
    )
    server = urllib.parse.urlsplit(cluster["server"])
    assert server.scheme == "https" and server.hostname, f"expected an https server, got {cluster['server']}"
    return Upstream(server.hostname, server.port or 443, tls)


def status_body(code: int, reason: str, message: str, retry_after: int | None) -> bytes:
    """A metav1.Status, the body the API server itself sends with an error."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if retry_after is not None:
        body["details"] = {"retryAfterSeconds": retry_after}
    return json.dumps(body).encode()


@dataclass(frozen=True)
class Storm:
    """What a fault window serves (see the module docstring)."""

    statuses: tuple[int, ...] = (429, 503)
    probability: float = 0.5
    seed: int = 0
    faults: int = 24  # the window closes itself after serving this many
    most_in_a_row: int = 2  # per endpoint: the next try after this many refusals gets through
    # (method, path prefix) pairs whose first request is always refused, e.g. ("POST", pods path)
    first_refused: tuple[tuple[str, str], ...] = ()
    include_watches: bool = True
    lost_answers: bool = False


class FaultPlan:
    """Which requests get an injected answer while a window is open. Statuses rotate over the
    storm's, so with (429, 503) faults alternate. Thread-safe: the proxy serves each connection on
    its own thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._storm: Storm | None = None
        self._random = random.Random(0)
        self._in_a_row: Counter[tuple[str, str]] = Counter()
        self._refused_first: set[tuple[str, str]] = set()
        self._injected = 0

    def open(self, storm: Storm) -> None:
        with self._lock:
            self._storm = storm
            self._random = random.Random(storm.seed)
            self._in_a_row.clear()
            self._refused_first.clear()
            self._injected = 0

    def close(self) -> None:
        with self._lock:
            self._storm = None

    @property
    def injected(self) -> int:
        with self._lock:
            return self._injected

    def fault_for(self, method: str, path: str, is_watch: bool) -> Fault | None:
        with self._lock:
            storm = self._storm
            if storm is None or self._injected >= storm.faults or (is_watch and not storm.include_watches):
                return None
            route = urllib.parse.urlsplit(path).path
            endpoint = (method, route)
            first = next((f for f in storm.first_refused if method == f[0] and route.startswith(f[1])), None)
            if first is not None and first not in self._refused_first:
                self._refused_first.add(first)
            elif (
                self._in_a_row[endpoint] >= storm.most_in_a_row or self._random.random() >= storm.probability
            ):
                self._in_a_row[endpoint] = 0
                return None
            self._in_a_row[endpoint] += 1
            status = storm.statuses[self._injected % len(storm.statuses)]
            self._injected += 1
            return Fault(status, after_upstream=storm.lost_answers and method in WRITE_METHODS)


class FaultProxy:
    """A plain-HTTP proxy in front of the API server, with a fault window (see the module docstring)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.plan = FaultPlan()
        self._log: list[Exchange] = []
        self._log_lock = threading.Lock()
        proxy = self

        class Handler(_RelayHandler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @contextmanager
    def fault_window(self, storm: Storm) -> Iterator[None]:
        self.plan.open(storm)
        try:
            yield
        finally:
            self.plan.close()

    def record(self, exchange: Exchange) -> None:
        with self._log_lock:
            self._log.append(exchange)

    def exchanges(self) -> list[Exchange]:
        with self._log_lock:
            return list(self._log)


class _RelayHandler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked bodies for streamed watches

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # the exchange log replaces the per-request stderr line

    def do_GET(self) -> None:
        self._relay()

    def do_POST(self) -> None:
        self._relay()

    def do_PUT(self) -> None:
        self._relay()

    def do_PATCH(self) -> None:
        self._relay()

    def do_DELETE(self) -> None:
        self._relay()

    def _relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        is_watch = query.get("watch", [""])[0] in ("true", "1")
        fault = self.owner.plan.fault_for(self.command, self.path, is_watch)
        if fault is not None and not fault.after_upstream:
            self._answer_fault(fault.status, None)
            return
        upstream = self.owner.upstream
        connection = http.client.HTTPSConnection(
            upstream.host, upstream.port, context=upstream.tls, timeout=UPSTREAM_TIMEOUT_SECONDS
        )
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["Host"] = f"{upstream.host}:{upstream.port}"
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            if fault is not None:
                response.read()
                self._answer_fault(fault.status, response.status)
                return
            self.owner.record(
                Exchange(self.command, self.path, response.status, False, response.status, time.time())
            )
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            # read1 returns what has arrived, so each watch event goes out as soon as it comes in.
            while chunk := response.read1(RELAY_CHUNK_BYTES):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (OSError, http.client.HTTPException):
            self.close_connection = True  # the client or the API server went away mid-stream
        finally:
            connection.close()

    def _answer_fault(self, status: int, upstream_status: int | None) -> None:
        reason = "TooManyRequests" if status == 429 else "ServiceUnavailable"
        retry_after = 1 if status == 429 else None
        body = status_body(status, reason, f"injected by the fault proxy: {reason}", retry_after)
        self.owner.record(Exchange(self.command, self.path, status, True, upstream_status, time.time()))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()


def proxy_kubeconfig(proxy: FaultProxy, path: Path) -> Path:
    """A kubeconfig whose server is the proxy (plain HTTP; the proxy holds the credentials)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fault-proxy", "cluster": {"server": f"http://127.0.0.1:{proxy.port}"}}],
        "users": [{"name": "through-proxy", "user": {}}],
        "contexts": [{"name": "fault-proxy", "context": {"cluster": "fault-proxy", "user": "through-proxy"}}],
        "current-context": "fault-proxy",
    }
    path.write_text(json.dumps(config, indent=2))
    return path
