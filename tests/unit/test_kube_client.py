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
    pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    encoded = base64.b64encode(pem).decode()
    path = kubeconfig(tmp_path, {"client-certificate-data": encoded, "client-key-data": encoded},
                      {"server": "https://h", "certificate-authority-data": encoded})  # fmt: skip
    credentials = kubeconfig_credentials(path)
    assert credentials.ca_data == pem.decode() and credentials.ca_file is None
    for name in (credentials.cert_file, credentials.key_file):
        assert name is not None and Path(name).read_bytes() == pem
        assert stat.S_IMODE(os.stat(name).st_mode) == 0o600
        os.unlink(name)


def test_a_token_and_a_token_file_are_taken_as_given(tmp_path: Path) -> None:
    assert kubeconfig_credentials(kubeconfig(tmp_path, {"token": "abc"})).token == "abc"
    assert kubeconfig_credentials(kubeconfig(tmp_path, {"tokenFile": "t"})).token_file == str(tmp_path / "t")


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
    seen: list[dict[str, Any]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        Recorder.seen.append({"method": self.command, "path": self.path, "body": body,
                              "auth": self.headers.get("Authorization"),
                              "type": self.headers.get("Content-Type")})  # fmt: skip
        status = 404 if "missing" in self.path else 200
        payload = json.dumps(
            {"kind": "Status", "message": "not here"} if status == 404 else {"ok": 1}
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_PATCH = _answer

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
    assert seen == {"method": "PATCH", "path": "/api/v1/namespaces/n/pods/p?dryRun=All", "body": '[{"op":"test"}]',
                    "auth": "Bearer tok", "type": "application/json-patch+json"}  # fmt: skip


def test_an_error_status_raises_with_the_api_servers_status_body(server: str) -> None:
    client = KubeClient(Credentials(server=server))
    with pytest.raises(ApiError) as raised:
        client.request("GET", "/api/v1/namespaces/n/pods/missing")
    assert raised.value.status == 404 and json.loads(raised.value.body)["message"] == "not here"
    assert Recorder.seen[0]["auth"] is None
    assert client.request("GET", "/api/v1/pods").status == 200  # the connection went back to the pool


def test_the_operator_process_does_not_load_the_kubernetes_package() -> None:
    """~20 MiB of resident memory (runner.keep_kubernetes_package_out): kopf would import it."""
    code = ("import sys; from phalanx.runner import keep_kubernetes_package_out; "
            "assert keep_kubernetes_package_out(); import kopf, phalanx.handlers; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes' and sys.modules[m]))")  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


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
