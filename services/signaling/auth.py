"""Who may place calls at a front: API keys and the short-lived call tokens they mint
(docs/auth.md).

An **API key** is configured server-side, in a file every front of a deployment reads (one key
a line, ``#`` comments): ``vek_<id>_<secret>``, the id a public name (``[a-z0-9-]``, 1-32),
the secret 32 random bytes in base64url. Whoever holds the key may place calls and mint
tokens.

A **call token** is what an application server hands a browser instead of its key (as
OpenAI's Realtime API has it mint an ephemeral client secret): ``vet_<payload>.<mac>``, the
payload base64url JSON ``{"k": key id, "t": token id, "e": expiry (Unix s), "n": calls it may
place, or null}``, the MAC an HMAC-SHA256 of it under a signing key derived from the key's
secret. Any front holding the key file checks a token without a shared database; the token id
names the caller in the logs and in its TURN username, and the token itself is never logged.

A **call id** placed under a key carries its owner: ``{cluster}~{index}~{session}~{key
id}.{token id or -}.{tag}``, the tag an HMAC of the rest, so that any front can tell whether
the credential of a ``DELETE`` or ``PATCH`` is the one that created the call (its token, or
its key) without remembering it.

Comparisons of secrets and MACs are constant-time (``hmac.compare_digest``); a refusal is one
line (``AuthError``: 401 without or with a bad credential, 403 for the wrong one).
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

KEY_PREFIX, TOKEN_PREFIX = "vek_", "vet_"
API_KEYS_ENV = "VOICEEDGE_API_KEYS_FILE"   # the key file, where --api-keys is not given
_KEY = re.compile(r"vek_([a-z0-9-]{1,32})_([A-Za-z0-9_-]{43})")
_SECRET_BYTES = 32
_TAG_BYTES, _MAC_BYTES = 12, 16
MAX_TOKEN_CHARS = 512
TOKEN_TTL_S = (10, 3600)   # what a token may live, at least and at most
DEFAULT_TOKEN_TTL_S = 600
MAX_TOKEN_CALLS = 10_000


class AuthError(Exception):
    """A refused credential: ``status`` (401, 403) and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class ApiKey:
    """One configured key: its public id, its secret, and its quotas (None: no limit): calls
    a minute it and its tokens may place at each front, and calls they may hold at once
    (counted by the transceivers, so across every front)."""

    id: str
    secret: bytes
    calls_per_minute: int | None = None
    concurrent_calls: int | None = None

    @classmethod
    def parse(cls, text: str) -> "ApiKey":
        m = _KEY.fullmatch(text.strip())
        if m is None:
            raise ValueError("an API key is vek_<id>_<43 base64url characters> (id: a-z, "
                             "0-9, -; 1-32)")
        return cls(m.group(1), _unb64(m.group(2)))

    @classmethod
    def new(cls, key_id: str) -> "ApiKey":
        key = cls(key_id, secrets.token_bytes(_SECRET_BYTES))
        cls.parse(key.text)   # checks the id
        return key

    @property
    def text(self) -> str:
        """What a client presents: ``vek_<id>_<secret>``."""
        return f"{KEY_PREFIX}{self.id}_{_b64(self.secret)}"

    def _mac(self, purpose: bytes, data: bytes, size: int) -> bytes:
        signing = hmac.new(self.secret, b"voiceedge/signing/1", hashlib.sha256).digest()
        return hmac.new(signing, purpose + b"\0" + data, hashlib.sha256).digest()[:size]

    def __repr__(self) -> str:   # never the secret, in a log or a traceback
        return f"ApiKey(id={self.id!r})"


@dataclass(frozen=True)
class Caller:
    """Who a request's credential says it is: a key, or one of its tokens."""

    key_id: str
    token_id: str | None = None    # None: the key itself
    expires: int | None = None     # a token's expiry (Unix seconds)
    max_calls: int | None = None   # a token's call limit (None: no limit)

    @property
    def name(self) -> str:
        """For logs and TURN usernames: ``<key id>`` or ``<key id>.<token id>``."""
        return self.key_id if self.token_id is None else f"{self.key_id}.{self.token_id}"


@dataclass(frozen=True)
class Token:
    """A minted token: its text (the secret part a client holds), id and expiry."""

    value: str
    id: str
    expires: int
    max_calls: int | None


class KeyRing:
    """The keys a front accepts; checks credentials, mints tokens, tags calls."""

    def __init__(self, keys: list[ApiKey]) -> None:
        if not keys:
            raise ValueError("no API keys")
        ids = [k.id for k in keys]
        if len(set(ids)) != len(ids):
            raise ValueError("API key ids repeat")
        self._keys = {k.id: k for k in keys}

    @classmethod
    def load(cls, path: str | Path) -> "KeyRing":
        """Keys from a file: one a line, blank lines and ``#`` comments skipped. ValueError
        (one line, naming the line, never its content) for a bad one."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"API key file {path}: {exc.strerror or exc}") from None
        keys = []
        for n, line in enumerate(text.splitlines(), start=1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            try:
                keys.append(_with_quota(ApiKey.parse(words[0]), words[1:]))
            except ValueError as exc:
                raise ValueError(f"API key file {path}, line {n}: {exc}") from None
        if not keys:
            raise ValueError(f"API key file {path} holds no key")
        return cls(keys)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def calls_per_minute(self, caller: Caller) -> int | None:
        """The calls a minute the caller's key may place at a front (None: no limit)."""
        return self._keys[caller.key_id].calls_per_minute

    def concurrent_calls(self, caller: Caller) -> int | None:
        """The calls the caller's key may hold at once (None: no limit)."""
        return self._keys[caller.key_id].concurrent_calls

    def authenticate(self, header: str | None, now: float | None = None) -> Caller:
        """The caller an ``Authorization: Bearer ...`` header names; AuthError (401)
        without one, for an unknown, malformed or expired one."""
        if not header:
            raise AuthError(401, "an Authorization: Bearer credential (an API key or a call "
                                 "token) is required")
        scheme, _, value = header.strip().partition(" ")
        value = value.strip()
        if scheme.lower() != "bearer" or not value or len(value) > MAX_TOKEN_CHARS:
            raise AuthError(401, "the credential must be Authorization: Bearer <key or token>")
        if value.startswith(KEY_PREFIX):
            return self._key_caller(value)
        if value.startswith(TOKEN_PREFIX):
            return self._token_caller(value[len(TOKEN_PREFIX):],
                                      time.time() if now is None else now)
        raise AuthError(401, "unknown credential")

    def _key_caller(self, value: str) -> Caller:
        try:
            given = ApiKey.parse(value)
        except ValueError:
            raise AuthError(401, "unknown credential") from None
        known = self._keys.get(given.id)
        if known is None or not hmac.compare_digest(known.secret, given.secret):
            raise AuthError(401, "unknown credential")
        return Caller(known.id)

    def _token_caller(self, value: str, now: float) -> Caller:
        payload, _, mac = value.partition(".")
        try:
            fields = json.loads(_unb64(payload))
            key = self._keys[fields["k"]]
            given = _unb64(mac)
        except (ValueError, KeyError, TypeError):
            raise AuthError(401, "unknown credential") from None
        if not hmac.compare_digest(key._mac(b"token", payload.encode(), _MAC_BYTES), given):
            raise AuthError(401, "unknown credential")
        expires, calls, token_id = fields.get("e"), fields.get("n"), fields.get("t")
        if not isinstance(expires, int) or not isinstance(token_id, str) \
                or not (calls is None or isinstance(calls, int)):
            raise AuthError(401, "unknown credential")
        if now >= expires:
            raise AuthError(401, "the call token has expired")
        return Caller(key.id, token_id, expires, calls)

    def mint(self, caller: Caller, ttl_s: int = DEFAULT_TOKEN_TTL_S,
             max_calls: int | None = None, now: float | None = None) -> Token:
        """A token of ``caller``'s key: only a key mints (AuthError 403 for a token)."""
        if caller.token_id is not None:
            raise AuthError(403, "a call token cannot mint tokens: use the API key")
        lo, hi = TOKEN_TTL_S
        if not lo <= ttl_s <= hi:
            raise ValueError(f"expires_in: {lo}..{hi} s")
        if max_calls is not None and not 1 <= max_calls <= MAX_TOKEN_CALLS:
            raise ValueError(f"max_calls: 1..{MAX_TOKEN_CALLS}")
        key = self._keys[caller.key_id]
        token_id = secrets.token_hex(6)
        expires = int((time.time() if now is None else now) + ttl_s)
        payload = _b64(json.dumps({"k": key.id, "t": token_id, "e": expires, "n": max_calls},
                                  separators=(",", ":")).encode())
        mac = _b64(key._mac(b"token", payload.encode(), _MAC_BYTES))
        return Token(f"{TOKEN_PREFIX}{payload}.{mac}", token_id, expires, max_calls)

    def owner_tag(self, caller: Caller, base: str) -> str:
        """What a call id placed by ``caller`` ends with: ``<key id>.<token id or ->.<tag>``."""
        token = caller.token_id or "-"
        tag = self._keys[caller.key_id]._mac(b"call", f"{base}~{token}".encode(), _TAG_BYTES)
        return f"{caller.key_id}.{token}.{_b64(tag)}"

    def check_owner(self, caller: Caller, base: str, owner: str) -> None:
        """AuthError (403) unless ``caller`` created the call: the token that placed it, or
        its key (a key holder may end any call of its tokens)."""
        key_id, token, tag = (owner.split(".") + ["", "", ""])[:3]
        key = self._keys.get(key_id)
        wrong = AuthError(403, "this credential did not create the call")
        if key is None or key_id != caller.key_id:
            raise wrong
        try:
            given = _unb64(tag)
        except ValueError:
            raise wrong from None
        if not hmac.compare_digest(key._mac(b"call", f"{base}~{token}".encode(), _TAG_BYTES),
                                   given):
            raise wrong
        if caller.token_id is not None and caller.token_id != token:
            raise wrong


_QUOTAS = ("calls_per_minute", "concurrent_calls")


def _with_quota(key: ApiKey, fields: list[str]) -> ApiKey:
    """``key`` with the quotas a key file's line gives after it (``calls_per_minute=N``,
    ``concurrent_calls=N``)."""
    quotas = {}
    for field in fields:
        name, _, value = field.partition("=")
        if (name not in _QUOTAS or name in quotas or not value.isdigit()
                or not 1 <= int(value) <= 100_000):
            raise ValueError("after the key only calls_per_minute=N and concurrent_calls=N "
                             "(1-100000, each once)")
        quotas[name] = int(value)
    return dataclasses.replace(key, **quotas)


class CallRate:
    """A key's calls a minute at this front: a token bucket that holds a minute's calls and
    refills continuously, so a key may place its quota at once and then one call every
    60 / quota seconds."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}   # key id -> (calls left, at)

    def take(self, key_id: str, per_minute: int, now: float) -> float:
        """Take one call; 0 when taken, else the seconds until one is free (none taken)."""
        left, at = self._buckets.get(key_id, (float(per_minute), now))
        left = min(float(per_minute), left + (now - at) * per_minute / 60.0)
        if left < 1.0:
            self._buckets[key_id] = (left, now)
            return (1.0 - left) * 60.0 / per_minute
        self._buckets[key_id] = (left - 1.0, now)
        return 0.0
