"""``GET /v1/ice-servers``: the ICE servers a client should use, with fresh TURN credentials.

Under the ``turn`` architecture the front is started with a TURN server's URL and the file
holding the secret it shares with that server; each request gets a credential of its own
(services/turn/credentials.py: ``<expiry>:<user>`` and its HMAC), valid ``ttl_s`` seconds,
and the relay-only policy::

    {"iceServers": [{"urls": ["turn:10.3.2.2:3478?transport=udp"], "username": "...",
                     "credential": "..."}],
     "iceTransportPolicy": "relay", "ttl": 3600}

Without TURN: ``{"iceServers": [], "iceTransportPolicy": "all"}``. The shape is
``RTCConfiguration``'s, so a browser page can pass it to ``new RTCPeerConnection`` as it is.
Credentials are never logged; ``turn_credential_issued`` records the user id and expiry.
"""
from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

from aiohttp import web

from services.logs import log_event
from services.turn.credentials import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S, issue, read_secret

log = logging.getLogger("voiceedge.signaling")
PATH = "/v1/ice-servers"


@dataclass(frozen=True)
class TurnHandout:
    """What a front hands out under TURN: the server's URL(s), the secret's file, the TTL."""

    urls: tuple[str, ...]
    secret_file: str
    ttl_s: int = DEFAULT_TTL_S

    def __post_init__(self) -> None:
        if not self.urls or not all(u.startswith(("turn:", "turns:")) for u in self.urls):
            raise ValueError("TURN URLs start with turn: or turns:")
        if not MIN_TTL_S <= self.ttl_s <= MAX_TTL_S:
            raise ValueError(f"the TURN credential TTL is {MIN_TTL_S}..{MAX_TTL_S} s")


class IceServers:
    """The handler of ``GET /v1/ice-servers`` for one front (the secret is read once, at
    start: a front restarted after a new secret hands out the new one)."""

    def __init__(self, turn: TurnHandout | None, region: str = "") -> None:
        self.turn = turn
        self._secret = read_secret(turn.secret_file) if turn else None
        self._prefix = region or "voiceedge"
        self.issued = 0

    def body(self, caller: str | None = None, not_after: int | None = None) -> dict:
        """The answer; ``caller`` (a key's or a token's name) goes into the TURN username, so
        a leaked credential names who it was issued to, and the credential expires no later
        than ``not_after`` (the token's expiry)."""
        if self.turn is None:
            return {"iceServers": [], "iceTransportPolicy": "all"}
        user = f"{self._prefix}-{caller or secrets.token_hex(4)}"
        ttl = self.turn.ttl_s
        if not_after is not None:   # the caller refuses a token with less than MIN_TTL_S left
            ttl = min(ttl, int(not_after - time.time()))
        credential = issue(self._secret, user, ttl)
        self.issued += 1
        log_event(log, "turn_credential_issued", user=user, expires=credential.expires)
        return {"iceServers": [{"urls": list(self.turn.urls), **credential.to_json()}],
                "iceTransportPolicy": "relay", "ttl": ttl}

    async def handle(self, request: web.Request) -> web.Response:
        return web.json_response(self.body(), headers={"Cache-Control": "no-store"})
