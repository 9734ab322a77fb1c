"""Time-limited TURN credentials from a shared secret (the "TURN REST API" scheme).

draft-uberti-behave-turn-rest-00, section 2.2, as coturn implements it with
``use-auth-secret`` / ``static-auth-secret``: whoever holds the secret (here the signaling
front) hands a client

    username   = "<expiry as Unix seconds>:<user id>"
    credential = base64(HMAC-SHA1(secret, username))

and the TURN server, which holds the same secret, recomputes the credential from the username
it receives and refuses it once the expiry has passed. Nothing is stored per user: the
username carries its own expiry. The credential is then used as the password of TURN's
long-term credential mechanism (RFC 8489 section 9.2).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

SEPARATOR = ":"          # coturn's default rest-api-separator
DEFAULT_TTL_S = 3600     # what a front hands out unless told otherwise
MIN_TTL_S, MAX_TTL_S = 10, 86400


@dataclass(frozen=True)
class TurnCredential:
    username: str
    credential: str
    expires: int             # Unix seconds: the server refuses it from then on
    ttl_s: int

    def to_json(self) -> dict:
        return {"username": self.username, "credential": self.credential}


def sign(secret: str, username: str) -> str:
    """The credential for ``username``: base64 of HMAC-SHA1 keyed with the secret."""
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def issue(secret: str, user: str, ttl_s: int = DEFAULT_TTL_S,
          now: float | None = None) -> TurnCredential:
    """A credential for ``user`` that expires ``ttl_s`` seconds from ``now``."""
    if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise ValueError(f"ttl_s must be {MIN_TTL_S}..{MAX_TTL_S} s")
    if SEPARATOR in user or not user:
        raise ValueError(f"a user id is not empty and has no {SEPARATOR!r}")
    expires = int(time.time() if now is None else now) + ttl_s
    username = f"{expires}{SEPARATOR}{user}"
    return TurnCredential(username, sign(secret, username), expires, ttl_s)


def expiry_of(username: str) -> int | None:
    """The expiry a REST API username carries (None: not such a username)."""
    head = username.split(SEPARATOR, 1)[0]
    return int(head) if head.isdigit() else None


def valid(secret: str, username: str, credential: str, now: float | None = None) -> bool:
    """What the TURN server checks: the credential is the secret's for this username, and
    the username's expiry has not passed."""
    expires = expiry_of(username)
    if expires is None or expires <= (time.time() if now is None else now):
        return False
    return hmac.compare_digest(sign(secret, username), credential)


def new_secret() -> str:
    """A fresh shared secret (one per run)."""
    return secrets.token_hex(32)


def write_secret(path: Path, secret: str) -> Path:
    """Write ``secret`` to ``path``, readable by its owner only (0600 from the start)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return path


def read_secret(path: Path | str) -> str:
    """The secret in ``path`` (surrounding whitespace dropped); ValueError when empty."""
    secret = Path(path).read_text().strip()
    if not secret:
        raise ValueError(f"{path}: the TURN secret file is empty")
    return secret
