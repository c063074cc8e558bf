"""The operator's connection to the API server: REST paths, JSON bodies and one urllib3 pool.

The operator keeps every object as the JSON the API server sends (k8s.py, reflector.py). The
kubernetes package's client would serve the same requests, but importing it loads its ~700 generated
models and their dependencies: about 20 MiB of an idle operator's resident set, for classes it
never uses. Credentials come from the pod's service account, else a kubeconfig: certificates,
tokens and token files, as a client of the API server is given them. Exec and auth-provider plugins
(a developer's cloud login) are refused with a message saying so.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0  # a projected service-account token is rotated well before it expires
CONNECTIONS_PER_HOST = 32
USER_AGENT = "phalanx-operator"

Timeout = tuple[float, float]  # connect, read: seconds
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # what a write fence lets through


class ApiError(Exception):
    """The API server answered with an error status; `body` is its Status object, as text."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


class ConfigError(Exception):
    """No usable credentials: names the file and the field, and what to do."""


@dataclass(frozen=True)
class Credentials:
    server: str  # https://host:port, no trailing slash
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None  # read again every TOKEN_REREAD_SECONDS


def in_cluster_credentials(
    environ: Mapping[str, str] = os.environ, account_dir: Path = SERVICE_ACCOUNT_DIR
) -> Credentials | None:
    """The pod's service account; None outside a pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    token_file = account_dir / "token"
    if not host or not port or not token_file.exists():
        return None
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return Credentials(server=f"https://{host}:{port}", ca_file=str(account_dir / "ca.crt"),
                       token_file=str(token_file))  # fmt: skip


def kubeconfig_path(environ: Mapping[str, str] = os.environ) -> Path:
    """KUBECONFIG's first file that exists (kubectl merges them; the operator takes one), else
    ~/.kube/config."""
    listed = [Path(p) for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    for path in listed:
        if path.exists():
            return path
    return listed[0] if listed else Path.home() / ".kube" / "config"


def kubeconfig_credentials(path: Path, context: str | None = None) -> Credentials:
    """The current context's cluster and user of the kubeconfig at `path`. Relative file names are
    taken from the kubeconfig's own folder, as kubectl does."""
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(
            f"no kubeconfig at {path} ({exc.strerror}): set KUBECONFIG, or run in a pod"
        ) from exc
    name = context or config.get("current-context")
    contexts = {c.get("name"): c.get("context") or {} for c in config.get("contexts") or []}
    if name not in contexts:
        raise ConfigError(f"{path}: current-context {name!r} names no entry of contexts; set current-context")
    chosen = contexts[name]
    cluster = _entry(config, "clusters", "cluster", chosen.get("cluster"), path)
    user = _entry(config, "users", "user", chosen.get("user"), path) if chosen.get("user") else {}
    for plugin in ("exec", "auth-provider"):
        if plugin in user and not user.get("token"):
            raise ConfigError(
                f"{path}: user {chosen.get('user')!r} logs in with an {plugin} plugin, which the operator "
                "does not run; give it a token or a client certificate (in a cluster, its service account)"
            )
    if user.get("username") and not (
        user.get("token") or user.get("client-certificate") or user.get("client-certificate-data")
    ):
        raise ConfigError(f"{path}: user {chosen.get('user')!r} has a username and password only (basic "
                          "auth, gone from Kubernetes since 1.19); give it a token or a client certificate")  # fmt: skip
    for setting in ("proxy-url", "tls-server-name"):
        if cluster.get(setting):
            raise ConfigError(f"{path}: cluster {chosen.get('cluster')!r} sets {setting}, which kopf's watches "
                              "cannot follow; reach the API server directly, by a name its certificate holds")  # fmt: skip
    if not cluster.get("server"):
        raise ConfigError(f"{path}: cluster {chosen.get('cluster')!r} has no server")
    folder = path.parent

    def file_of(key: str, data_key: str, source: dict[str, Any]) -> str | None:
        if source.get(data_key):
            return _private_file(base64.b64decode(source[data_key]))
        return str(folder / source[key]) if source.get(key) else None

    ca_data = cluster.get("certificate-authority-data")
    return Credentials(
        server=str(cluster["server"]).rstrip("/"),
        # Data wins over a file, as with kubectl (and kopf refuses both at once).
        ca_file=None
        if ca_data or not cluster.get("certificate-authority")
        else str(folder / cluster["certificate-authority"]),
        ca_data=base64.b64decode(ca_data).decode() if ca_data else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        cert_file=file_of("client-certificate", "client-certificate-data", user),
        key_file=file_of("client-key", "client-key-data", user),
        token=user.get("token"),
        token_file=str(folder / user["tokenFile"]) if user.get("tokenFile") else None,
    )


def _entry(config: dict[str, Any], section: str, field: str, name: Any, path: Path) -> dict[str, Any]:
    for item in config.get(section) or []:
        if item.get("name") == name:
            found: dict[str, Any] = item.get(field) or {}
            return found
    raise ConfigError(f"{path}: the current context names {field} {name!r}, which {section} does not hold")


_PRIVATE_FILES: dict[bytes, str] = {}


def _private_file(data: bytes) -> str:
    """ssl loads client certificates from files only: the decoded data goes to one only we can read
    (one per content, however often kopf logs in again)."""
    if data in _PRIVATE_FILES and os.path.exists(_PRIVATE_FILES[data]):
        return _PRIVATE_FILES[data]
    handle, name = tempfile.mkstemp(prefix="phalanx-kube-", suffix=".pem")
    _PRIVATE_FILES[data] = name
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    atexit.register(_remove, name)
    return name


def _remove(name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name)


def ssl_context(credentials: Credentials) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=credentials.ca_file, cadata=credentials.ca_data)
    if credentials.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if credentials.cert_file:
        context.load_cert_chain(credentials.cert_file, credentials.key_file)
    return context


class Token:
    """A bearer token, from the credentials or their token file, read again once a minute."""

    def __init__(self, credentials: Credentials, clock: Callable[[], float] = time.monotonic) -> None:
        self._fixed = credentials.token
        self._file = credentials.token_file
        self._clock = clock
        self._lock = threading.Lock()
        self._value: str | None = None
        self._read_at = -TOKEN_REREAD_SECONDS

    def header(self) -> str | None:
        if self._fixed:
            return f"Bearer {self._fixed}"
        if not self._file:
            return None
        with self._lock:
            now = self._clock()
            if self._value is None or now - self._read_at >= TOKEN_REREAD_SECONDS:
                try:
                    self._value = Path(self._file).read_text().strip()
                    self._read_at = now
                except OSError:
                    if self._value is None:
                        raise
            return f"Bearer {self._value}"


def query_string(params: Mapping[str, Any]) -> str:
    """Query parameters as the API server spells them; None is left out, booleans are lowercase."""
    pairs = [
        (k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in params.items() if v is not None
    ]
    return f"?{urlencode(pairs)}" if pairs else ""


class KubeClient:
    """Sends one request at a time per caller; thread-safe (urllib3's pool is)."""

    def __init__(
        self,
        credentials: Credentials,
        pool_size: int = CONNECTIONS_PER_HOST,
        retries: urllib3.Retry | None = None,
    ) -> None:
        self.server = credentials.server
        self._token = Token(credentials)
        tls: dict[str, Any] = {}
        if self.server.startswith("https://"):
            tls["ssl_context"] = ssl_context(credentials)
        # Default: a connection that fails before a request is sent is tried again, and so is an
        # idempotent request (GET, PUT, DELETE) whose connection broke or timed out after it; a POST or
        # PATCH never is (its caller sees the error). No retry on 429/503: the callers decide.
        if retries is None:
            retries = urllib3.Retry(3, redirect=False, status_forcelist=(), respect_retry_after_header=False)
        self.pool_manager = urllib3.PoolManager(maxsize=pool_size, block=False, retries=retries, **tls)
        # Set by the operator (k8s.count_requests), applied to every request in one place so no
        # caller can miss them: a fence run before each write (it may refuse it: leader.py), the
        # timeout of a request that brings none and does not watch, and an observer told each
        # request's method, path and status (None: no answer came).
        self.write_fence: Callable[[], None] | None = None
        self.default_timeout: Timeout | None = None
        self.observe: Callable[[str, str, int | None], None] | None = None

    def request(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Timeout | None = None,
    ) -> Any:
        """The answer, unread (urllib3's response: `.data` reads it all and frees the connection,
        `.stream()` reads it as it comes). An error status raises ApiError, its body read."""
        if self.write_fence is not None and method.upper() not in READ_METHODS:
            self.write_fence()
        if timeout is None and not (params or {}).get("watch"):
            timeout = self.default_timeout
        if self.observe is None:
            return self._send(method, path, params, body, content_type, timeout)
        try:
            response = self._send(method, path, params, body, content_type, timeout)
        except ApiError as exc:
            self.observe(method, path, exc.status)
            raise
        except Exception:
            self.observe(method, path, None)
            raise
        self.observe(method, path, response.status)
        return response

    def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        body: Any,
        content_type: str,
        timeout: Timeout | None,
    ) -> Any:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        auth = self._token.header()
        if auth:
            headers["Authorization"] = auth
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        extra: dict[str, Any] = {}
        if timeout is not None:
            extra["timeout"] = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        response = self.pool_manager.request(
            method,
            self.server + path + query_string(params or {}),
            body=data,
            headers=headers,
            preload_content=False,
            redirect=False,
            **extra,
        )
        if not 200 <= response.status < 300:  # a redirect too: an auth proxy's login page is no answer
            text = response.data.decode(errors="replace")
            response.release_conn()
            raise ApiError(response.status, response.reason or "", text)
        return response


def load_credentials() -> Credentials:
    """In-cluster service account first, else the kubeconfig (KUBECONFIG, else ~/.kube/config)."""
    return in_cluster_credentials() or kubeconfig_credentials(kubeconfig_path())


def load_client(retries: urllib3.Retry | None = None) -> KubeClient:
    return KubeClient(load_credentials(), retries=retries)
