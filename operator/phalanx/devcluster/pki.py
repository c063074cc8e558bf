"""Certificates for the local control plane, made with the openssl command line."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def service_account_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.dir / "sa.pub"


SERVER_SANS = (
    "IP:127.0.0.1",
    "IP:10.96.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def _signed_cert(pki: Pki, name: str, subject: str, extensions: str) -> None:
    key, csr, crt, ext = (pki.dir / f"{name}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
    ext.write_text(extensions)
    _openssl("genrsa", "-out", str(key), "2048", cwd=pki.dir)
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr), cwd=pki.dir)
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
        "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", str(ext), "-out", str(crt),
        cwd=pki.dir,
    )  # fmt: skip


def ensure_pki(directory: Path) -> Pki:
    """Creates the CA, the API server's serving cert, an admin client cert and the SA signing key."""
    pki = Pki(directory)
    if pki.service_account_pub.exists() and pki.admin_cert.exists():
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", str(pki.ca_key), "2048", cwd=directory)
    _openssl(
        "req", "-x509", "-new", "-key", str(pki.ca_key), "-subj", "/CN=phalanx-dev-ca",
        "-days", "3650", "-sha256", "-out", str(pki.ca_cert), cwd=directory,
    )  # fmt: skip
    _signed_cert(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=" + ",".join(SERVER_SANS) + "\n",
    )
    _signed_cert(
        pki,
        "admin",
        "/O=system:masters/CN=phalanx-admin",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    _openssl("genrsa", "-out", str(pki.service_account_key), "2048", cwd=directory)
    _openssl("rsa", "-in", str(pki.service_account_key), "-pubout", "-out", str(pki.service_account_pub),
             cwd=directory)  # fmt: skip
    return pki


def issue_serving_cert(pki: Pki, out_dir: Path, common_name: str, sans: tuple[str, ...]) -> tuple[Path, Path]:
    """A serving cert signed by the dev cluster's CA, as out_dir/tls.crt and tls.key.

    For local servers the API server calls (Kueue's webhooks): it trusts them through the CA bundle
    in their webhook configuration. The names are controller-runtime's defaults for a cert dir.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    key, csr, crt, ext = (out_dir / name for name in ("tls.key", "tls.csr", "tls.crt", "tls.ext"))
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=" + ",".join(sans) + "\n"
    )
    _openssl("genrsa", "-out", str(key), "2048", cwd=out_dir)
    _openssl("req", "-new", "-key", str(key), "-subj", f"/CN={common_name}", "-out", str(csr), cwd=out_dir)
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
        "-CAcreateserial", "-CAserial", str(out_dir / "ca.srl"), "-days", "3650", "-sha256",
        "-extfile", str(ext), "-out", str(crt), cwd=out_dir,
    )  # fmt: skip
    return crt, key
