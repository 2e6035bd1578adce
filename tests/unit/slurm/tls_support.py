"""A throwaway PKI (``openssl``, run with argument lists) and a local HTTPS server standing in for a TLS proxy in
front of slurmrestd."""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
_CA_EXT = "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\nsubjectKeyIdentifier=hash\n"
_LEAF_EXT = (
    "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
    "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n{san}"
)


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Pki:
    """One CA and what it signed: a server certificate for 127.0.0.1, a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(directory: Path, name: str = "ca") -> Pki:
    """A CA in ``directory`` and two leaves it signed (two days of validity)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.ext").write_text(_CA_EXT)
    _openssl("req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", f"/CN={name}",
             "-extensions", "v3_ca", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)  # fmt: skip
    leaves = {"server": ("serverAuth", "subjectAltName=IP:127.0.0.1\n"), "client": ("clientAuth", "")}
    for leaf, (usage, san) in leaves.items():
        (directory / f"{leaf}.ext").write_text(_LEAF_EXT.format(usage=usage, san=san))
        _openssl("req", *_EC, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", f"/CN={leaf}", cwd=directory)
        _openssl("x509", "-req", "-in", f"{leaf}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{leaf}.pem", "-days", "2", "-extfile", f"{leaf}.ext", cwd=directory)  # fmt: skip
    return Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )


@contextmanager
def https_server(
    pki: Pki, body: bytes, *, require_client_cert: bool = False, like_nginx: bool = False
) -> Iterator[tuple[str, list[str]]]:
    """An HTTPS server on 127.0.0.1 answering every GET with ``body``; yields its URL and the paths it served.

    ``require_client_cert``: TLS 1.2 with a required client certificate, refused in the handshake (an alert).
    ``like_nginx``: TLS 1.3 and ``ssl_verify_client on`` as nginx does it: the handshake completes, and a request
    without a client certificate gets nginx's HTTP 400 page.
    """
    served: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if like_nginx and not self.connection.getpeercert():
                page = b"<html><h1>400 Bad Request</h1>\r\n<center>No required SSL certificate was sent</center></html>"
                self.send_response(400)
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return
            served.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002  # the base class's name
            return

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    if require_client_cert:
        context.maximum_version = ssl.TLSVersion.TLSv1_2  # the client certificate is checked in the handshake
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki.ca)
    if like_nginx:
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(pki.ca)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
