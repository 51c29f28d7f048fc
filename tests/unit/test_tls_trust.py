"""One TLS context per source for gpuyard's HTTP clients (core/tls_trust.py): the
verification httpx's ``verify=True`` does, made once instead of per client."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import ssl
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import certifi
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpuyard.core.tls_trust import trusted_tls

LOOPBACK = ipaddress.ip_address("127.0.0.1")


def test_one_context_is_shared_and_verifies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first = trusted_tls()
    assert trusted_tls() is first
    assert trusted_tls(trust_env=False) is first  # no environment to trust: the same
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname
    assert first.get_ca_certs()  # certifi's bundle, as httpx loads it


def test_the_environment_chooses_the_bundle_only_when_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "ca.pem"
    shutil.copy(certifi.where(), bundle)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    from_env = trusted_tls()
    assert from_env is trusted_tls()
    assert trusted_tls(trust_env=False) is not from_env
    assert from_env.verify_mode == ssl.CERT_REQUIRED


def test_a_client_with_it_still_refuses_an_unverified_server() -> None:
    """Handed to httpx, it is the verification: a server whose certificate no trusted
    CA signed is refused (a server of this test, on loopback)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    with tempfile.TemporaryDirectory() as d:
        pem = Path(d) / "server.pem"
        pem.write_bytes(
            cert.public_bytes(serialization.Encoding.PEM)
            + key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(pem)

        class Hello(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        httpd = HTTPServer(("127.0.0.1", 0), Hello)
        httpd.socket = server_ctx.wrap_socket(httpd.socket, server_side=True)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"https://127.0.0.1:{httpd.server_address[1]}/"
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                httpx.get(url, verify=trusted_tls(trust_env=False), timeout=10)
        finally:
            httpd.shutdown()
            httpd.server_close()
