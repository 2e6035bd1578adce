"""Real Slurm-style JWTs for tests: HS256 over a 32-byte key, as slurm.conf's ``AuthAltParameters=jwt_key`` signs.

``scontrol token`` makes ``{"alg":"HS256","typ":"JWT"}`` headers and ``{"exp", "iat", "sun"}`` payloads; these
are made the same way with python's hmac, so a key written like the lab's (``head -c 32 /dev/urandom``) gives a
token slurmctld itself accepts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt_hs256(claims: dict[str, object], key: bytes = b"k" * 32) -> str:
    """A JWT signed with ``key`` (HS256)."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(signature)}"


def slurm_token(user: str = "root", lifespan_s: int = 3600, key: bytes = b"k" * 32, now: float | None = None) -> str:
    """What ``scontrol token username=user lifespan=lifespan_s`` would print after ``SLURM_JWT=``."""
    issued = int(time.time() if now is None else now)
    return jwt_hs256({"exp": issued + lifespan_s, "iat": issued, "sun": user}, key)
