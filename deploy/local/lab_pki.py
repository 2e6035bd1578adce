"""The lab's certificates: a CA, the TLS proxy's server certificate, a client certificate per role, and the
deliberately bad ones the security tests present (another CA's, an expired one). Made with ``openssl`` (argument
lists only); everything lives under ``$STATE/tls/`` and is kept across `up`s, so a running worker's files stay put.

$STATE/tls/ca.pem, ca.key              the lab CA (signs the proxy's server certificate and every client's)
$STATE/tls/server.pem, .key            the proxy: 127.0.0.1 and localhost
$STATE/tls/worker.pem, .key            the central worker's client certificate (CN rebound-worker)
$STATE/tls/agent.pem, .key             the node agents' client certificate (CN rebound-agent)
$STATE/tls/api_key                     the bearer token the proxy also requires of Temporal clients
$STATE/tls/bad/other-ca.pem, .key      a CA nobody trusts
$STATE/tls/bad/rogue.pem, .key         a client certificate signed by that other CA
$STATE/tls/bad/expired.pem, .key       a client certificate of the lab CA whose validity has ended
"""

from __future__ import annotations

import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from deploy.local.processes import run

#: Roles with a client certificate of their own, so the proxy's log (and a production authorizer) tells them apart.
CLIENT_ROLES = ("worker", "agent")
CA_DAYS = 3650
LEAF_DAYS = 365


@dataclass(frozen=True)
class PkiPaths:
    """Where one lab's certificates live. Pure paths."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.root / "server.key"

    @property
    def api_key(self) -> Path:
        return self.root / "api_key"

    @property
    def bad(self) -> Path:
        return self.root / "bad"

    def client_cert(self, role: str) -> Path:
        return self.root / f"{role}.pem"

    def client_key(self, role: str) -> Path:
        return self.root / f"{role}.key"

    def bad_cert(self, name: str) -> Path:
        """``other-ca``, ``rogue`` or ``expired``."""
        return self.bad / f"{name}.pem"

    def bad_key(self, name: str) -> Path:
        return self.bad / f"{name}.key"


_CA_EXT = "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
_SERVER_EXT = (
    "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
)
_CLIENT_EXT = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"


def make_ca(cert: Path, key: Path, name: str, days: int = CA_DAYS) -> None:
    """A self-signed CA (EC P-256), its key readable by root only."""
    cert.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-days",
                str(days),
                "-subj",
                f"/O=Rebound lab/CN={name}",
                "-extensions",
                "v3_ca_lab",
                "-config",
                str(_req_config(Path(tmp), "v3_ca_lab", _CA_EXT)),
            ]
        )
    key.chmod(0o600)


def issue(
    cert: Path,
    key: Path,
    *,
    common_name: str,
    ca_cert: Path,
    ca_key: Path,
    server: bool = False,
    days: int = LEAF_DAYS,
) -> None:
    """A leaf certificate signed by ``ca_cert``: a server's (127.0.0.1, localhost) or a client's.

    ``days=0`` makes a certificate whose validity ends the second it is issued: expired from then on (OpenSSL 3.0's
    ``x509`` cannot backdate, and the expired client certificate needs no more than that).
    """
    cert.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        csr = Path(tmp) / "req.csr"
        ext = Path(tmp) / "ext.cnf"
        ext.write_text(_SERVER_EXT if server else _CLIENT_EXT)
        run(
            [
                "openssl",
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(csr),
                "-subj",
                f"/O=Rebound lab/CN={common_name}",
            ]
        )
        run(
            [
                "openssl",
                "x509",
                "-req",
                "-in",
                str(csr),
                "-CA",
                str(ca_cert),
                "-CAkey",
                str(ca_key),
                "-set_serial",
                str(secrets.randbits(63)),
                "-days",
                str(days),
                "-sha256",
                "-extfile",
                str(ext),
                "-out",
                str(cert),
            ]
        )
    key.chmod(0o600)


def _req_config(tmp: Path, section: str, body: str) -> Path:
    # `openssl req -x509` takes its extensions from a config section; a minimal config keeps the system's out.
    cfg = tmp / "req.cnf"
    cfg.write_text(f"[req]\ndistinguished_name=dn\n[dn]\n[{section}]\n{body}")
    return cfg


def ensure_lab_pki(paths: PkiPaths) -> list[str]:
    """Create whatever is missing (idempotent: existing files are kept, so rotation is the caller's choice).

    Returns the names of the files made.
    """
    made: list[str] = []
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.root.chmod(0o700)
    if not paths.ca_cert.exists() or not paths.ca_key.exists():
        make_ca(paths.ca_cert, paths.ca_key, "Rebound lab CA")
        made.append("ca")
    ca_cert, ca_key = paths.ca_cert, paths.ca_key
    if "ca" in made or not paths.server_cert.exists():
        issue(paths.server_cert, paths.server_key, common_name="localhost", server=True, ca_cert=ca_cert, ca_key=ca_key)
        made.append("server")
    for role in CLIENT_ROLES:
        if "ca" in made or not paths.client_cert(role).exists():
            issue(
                paths.client_cert(role),
                paths.client_key(role),
                common_name=f"rebound-{role}",
                ca_cert=ca_cert,
                ca_key=ca_key,
            )
            made.append(role)
    if "ca" in made or not paths.bad_cert("expired").exists():
        issue(
            paths.bad_cert("expired"),
            paths.bad_key("expired"),
            common_name="rebound-expired",
            days=0,
            ca_cert=ca_cert,
            ca_key=ca_key,
        )
        made.append("expired")
    if not paths.bad_cert("other-ca").exists():
        make_ca(paths.bad_cert("other-ca"), paths.bad_key("other-ca"), "Not the lab CA")
        made.append("other-ca")
    if "other-ca" in made or not paths.bad_cert("rogue").exists():
        issue(
            paths.bad_cert("rogue"),
            paths.bad_key("rogue"),
            common_name="rebound-worker",  # the worker's own name: only the CA tells them apart
            ca_cert=paths.bad_cert("other-ca"),
            ca_key=paths.bad_key("other-ca"),
        )
        made.append("rogue")
    if not paths.api_key.exists():
        fd = os.open(paths.api_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(24) + "\n")
        made.append("api_key")
    return made


def read_api_key(paths: PkiPaths) -> str:
    return paths.api_key.read_text().strip()
