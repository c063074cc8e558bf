"""kube_client.py: credentials from a kubeconfig or a pod's service account, and requests as sent."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from phalanx.kube_client import (
    TOKEN_REREAD_SECONDS,
    ApiError,
    ConfigError,
    Credentials,
    KubeClient,
    Token,
    in_cluster_credentials,
    kubeconfig_credentials,
    kubeconfig_path,
    query_string,
)

pytestmark = pytest.mark.unit


def kubeconfig(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443/"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


def test_relative_certificate_files_are_read_from_the_kubeconfigs_folder(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"client-certificate": "pki/admin.crt", "client-key": "pki/admin.key"},
                      {"server": "https://10.0.0.1:6443/", "certificate-authority": "pki/ca.crt"})  # fmt: skip
    credentials = kubeconfig_credentials(path)
    assert credentials.server == "https://10.0.0.1:6443"
    assert credentials.ca_file == str(tmp_path / "pki" / "ca.crt")
    assert (credentials.cert_file, credentials.key_file) == (
        str(tmp_path / "pki/admin.crt"),
        str(tmp_path / "pki/admin.key"),
    )
    assert credentials.token is None and not credentials.insecure


def test_embedded_certificates_go_to_files_only_the_operator_can_read(tmp_path: Path) -> None:
    cert, key = b"-----BEGIN CERTIFICATE-----\nAAAA\n", b"-----BEGIN PRIVATE KEY-----\nBBBB\n"
    path = kubeconfig(tmp_path, {"client-certificate-data": base64.b64encode(cert).decode(),
                                 "client-key-data": base64.b64encode(key).decode()},
                      {"server": "https://h", "certificate-authority-data": base64.b64encode(cert).decode()})  # fmt: skip
    credentials = kubeconfig_credentials(path)
    assert credentials.ca_data == cert.decode() and credentials.ca_file is None
    for name, content in ((credentials.cert_file, cert), (credentials.key_file, key)):
        assert name is not None and Path(name).read_bytes() == content
        assert stat.S_IMODE(os.stat(name).st_mode) == 0o600
    # kopf logs in again after a 401: the same data makes no second file.
    assert kubeconfig_credentials(path).cert_file == credentials.cert_file


def test_a_token_and_a_token_file_are_taken_as_given(tmp_path: Path) -> None:
    assert kubeconfig_credentials(kubeconfig(tmp_path, {"token": "abc"})).token == "abc"
    assert kubeconfig_credentials(kubeconfig(tmp_path, {"tokenFile": "t"})).token_file == str(tmp_path / "t")


def test_certificate_authority_data_wins_over_a_file(tmp_path: Path) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    cluster = {"server": "https://10.0.0.1", "certificate-authority": "ca.crt",
               "certificate-authority-data": base64.b64encode(pem.encode()).decode()}  # fmt: skip
    credentials = kubeconfig_credentials(kubeconfig(tmp_path, {"token": "secret-token"}, cluster))
    assert (credentials.ca_file, credentials.ca_data) == (None, pem)
    assert "secret-token" not in repr(credentials)


@pytest.mark.parametrize(
    ("user", "cluster", "message"),
    [
        ({"username": "admin", "password": "p"}, {}, "basic auth"),
        ({"token": "t"}, {"proxy-url": "http://proxy:3128"}, "proxy-url"),
        ({"token": "t"}, {"tls-server-name": "kubernetes"}, "tls-server-name"),
    ],
)
def test_settings_the_client_does_not_honour_are_refused(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        kubeconfig_credentials(kubeconfig(tmp_path, user, {"server": "https://h", **cluster}))


def test_an_exec_plugin_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}})
    with pytest.raises(ConfigError, match="exec plugin.*service account"):
        kubeconfig_credentials(path)


def test_a_context_that_names_nothing_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"token": "t"})
    with pytest.raises(ConfigError, match="current-context 'nope'"):
        kubeconfig_credentials(path, context="nope")
    with pytest.raises(ConfigError, match="no kubeconfig at"):
        kubeconfig_credentials(tmp_path / "missing")


def test_kubeconfig_is_the_first_existing_file_listed(tmp_path: Path) -> None:
    (tmp_path / "b").write_text("{}")
    listed = os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")])
    assert kubeconfig_path({"KUBECONFIG": listed}) == tmp_path / "b"
    assert kubeconfig_path({}) == Path.home() / ".kube" / "config"


def test_in_a_pod_the_service_account_is_used(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    credentials = in_cluster_credentials(env, tmp_path)
    assert credentials == Credentials(server="https://[fd00::1]:443", ca_file=str(tmp_path / "ca.crt"),
                                      token_file=str(tmp_path / "token"))  # fmt: skip
    assert in_cluster_credentials({}, tmp_path) is None


def test_a_token_file_is_read_again_once_a_minute(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("one\n")
    now = [100.0]
    token = Token(Credentials(server="https://h", token_file=str(token_file)), clock=lambda: now[0])
    assert token.header() == "Bearer one"
    token_file.write_text("two\n")  # the kubelet rotated it
    now[0] += TOKEN_REREAD_SECONDS - 1
    assert token.header() == "Bearer one"
    now[0] += 1
    assert token.header() == "Bearer two"
    token_file.unlink()  # a read that fails keeps the token it has
    now[0] += TOKEN_REREAD_SECONDS
    assert token.header() == "Bearer two"


def test_query_parameters_are_spelled_as_the_api_server_expects() -> None:
    assert query_string({"watch": True, "allowWatchBookmarks": False, "continue": None, "limit": 500}) == (
        "?watch=true&allowWatchBookmarks=false&limit=500"
    )
    assert query_string({"labelSelector": "a=b,c"}) == "?labelSelector=a%3Db%2Cc"
    assert query_string({}) == ""


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so that connection reuse shows in the client's port
    seen: list[dict[str, Any]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        Recorder.seen.append({"method": self.command, "path": self.path, "body": body,
                              "auth": self.headers.get("Authorization"),
                              "type": self.headers.get("Content-Type"), "port": self.client_address[1]})  # fmt: skip
        status = 404 if "missing" in self.path else 302 if "moved" in self.path else 200
        payload = json.dumps(
            {"kind": "Status", "message": "not here"} if status == 404 else {"ok": 1}
        ).encode()
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "/login")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_request_carries_the_token_and_its_json_body(server: str) -> None:
    client = KubeClient(Credentials(server=server, token="tok"))
    response = client.request("PATCH", "/api/v1/namespaces/n/pods/p", {"dryRun": "All"}, [{"op": "test"}],
                              "application/json-patch+json", (2.0, 5.0))  # fmt: skip
    assert json.loads(response.data) == {"ok": 1}
    [seen] = Recorder.seen
    del seen["port"]
    assert seen == {"method": "PATCH", "path": "/api/v1/namespaces/n/pods/p?dryRun=All", "body": '[{"op":"test"}]',
                    "auth": "Bearer tok", "type": "application/json-patch+json"}  # fmt: skip


def test_an_error_status_raises_with_its_body_and_the_connection_serves_the_next_request(server: str) -> None:
    client = KubeClient(Credentials(server=server))
    with pytest.raises(ApiError) as raised:
        client.request("GET", "/api/v1/namespaces/n/pods/missing")
    assert raised.value.status == 404 and json.loads(raised.value.body)["message"] == "not here"
    assert client.request("GET", "/api/v1/pods").status == 200
    first, second = Recorder.seen
    assert first["auth"] is None
    assert first["port"] == second["port"], "the error's connection went back to the pool, its body read"


def test_a_redirect_is_not_followed_and_is_an_error(server: str) -> None:
    with pytest.raises(ApiError) as raised:
        KubeClient(Credentials(server=server)).request("DELETE", "/api/v1/namespaces/n/pods/moved")
    assert raised.value.status == 302
    assert [s["path"] for s in Recorder.seen] == ["/api/v1/namespaces/n/pods/moved"]


def test_a_timeout_is_given_to_urllib3_as_connect_and_read(monkeypatch: pytest.MonkeyPatch) -> None:
    client = KubeClient(Credentials(server="http://127.0.0.1:1"))
    seen: list[dict[str, Any]] = []

    class Answer:
        status = 200

    def request(*args: Any, **kwargs: Any) -> Answer:
        seen.append(kwargs)
        return Answer()

    monkeypatch.setattr(client.pool_manager, "request", request)
    client.request("GET", "/api/v1/pods", timeout=(2.0, 5.0))
    client.request("GET", "/api/v1/pods")
    timeout = seen[0]["timeout"]
    assert (timeout.connect_timeout, timeout.read_timeout) == (2.0, 5.0)
    assert "timeout" not in seen[1]


def test_the_operators_modules_load_with_the_kubernetes_package_marked_absent() -> None:
    """runner.keep_kubernetes_package_out saves ~17 MiB: it holds only while no module of the operator
    needs the package (.importlinter says the same statically)."""
    code = ("from phalanx.runner import keep_kubernetes_package_out; "
            "assert keep_kubernetes_package_out(); import kopf, phalanx.handlers, phalanx.metrics, phalanx.health")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_kopf_logs_in_with_the_credentials_the_operator_uses(tmp_path: Path) -> None:
    from phalanx.handlers import connection_info

    (tmp_path / "token").write_text("sa-token\n")
    info = connection_info(
        Credentials(server="https://h:6443", ca_file="/ca.crt", token_file=str(tmp_path / "token"))
    )
    assert (info.server, info.ca_path, info.token, info.insecure) == (
        "https://h:6443",
        "/ca.crt",
        "sa-token",
        None,
    )
    pem = "-----BEGIN CERTIFICATE-----\n"
    info = connection_info(
        Credentials(server="https://h", ca_data=pem, cert_file="/c", key_file="/k", insecure=True)
    )
    assert (info.ca_data, info.certificate_path, info.private_key_path, info.insecure) == (
        pem,
        "/c",
        "/k",
        True,
    )
    assert info.token is None


def test_credentials_that_break_after_start_make_kopf_log_in_again_later(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import kopf

    from phalanx import handlers

    monkeypatch.setattr(handlers, "load_credentials", lambda: kubeconfig_credentials(tmp_path / "missing"))
    with pytest.raises(kopf.TemporaryError, match="no kubeconfig at") as raised:
        handlers.login()
    assert raised.value.delay == handlers.LOGIN_RETRY_SECONDS


def test_the_operator_stops_at_once_with_the_reason_when_it_has_no_credentials(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
    env["KUBECONFIG"] = str(tmp_path / "missing")
    out = subprocess.run([sys.executable, "-m", "phalanx.cli", "operator", "--metrics-port", "0", "--health-port", "0"],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    assert f"phalanx operator: no kubeconfig at {tmp_path / 'missing'}" in out.stderr


def test_a_lease_request_is_not_sent_twice() -> None:
    """A renewal's read timeout goes back to the elector at once (its deadline is 10 s; the default
    3 retries of a 4 s read would outlast it); a connection that fails before sending is tried once more."""
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, ReadTimeoutError

    from phalanx.k8s import LEASE_RETRIES

    with pytest.raises(MaxRetryError):
        LEASE_RETRIES.increment("PUT", "/l", error=ReadTimeoutError(None, "/l", "timed out"))  # type: ignore[arg-type]
    again = LEASE_RETRIES.increment("PUT", "/l", error=ConnectTimeoutError())
    with pytest.raises(MaxRetryError):
        again.increment("PUT", "/l", error=ConnectTimeoutError())
