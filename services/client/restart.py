"""The client's ICE restart (RFC 8445 section 9) through its call's resource.

The client picks a new ice-ufrag and ice-pwd, sends them with its candidates in a ``PATCH`` of
the call (``application/trickle-ice-sdpfrag``, services/wire/sdpfrag.py, as WHIP does: RFC
9725 section 4.3), takes the edge's new ones from the answer and checks again; the call, its
DTLS association and its media stay (services/icerestart.py restarts aioice in place).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp

from services import icerestart
from services.icerestart import IceCredentials
from services.wire.sdpfrag import CONTENT_TYPE, IceFragment, SdpFragError


@dataclass
class RestartResult:
    ok: bool
    patch_ms: float | None = None   # the PATCH's round trip
    ms: float | None = None         # PATCH sent -> a pair nominated under the new credentials
    reason: str | None = None


async def restart_ice(pc, http: aiohttp.ClientSession, resource: str,
                      timeout: float = icerestart.RESTART_TIMEOUT_S,
                      headers: dict[str, str] | None = None) -> RestartResult:
    """Restart ``pc``'s ICE through ``resource`` (the call's URL: its ``Location``) within
    ``timeout`` seconds, the PATCH and the checks together; ``headers``: the signaling's own
    (an Authorization)."""
    transceivers = pc.getTransceivers()
    if not transceivers or pc.connectionState != "connected":
        return RestartResult(False, reason="not connected")
    connection = transceivers[0].receiver.transport.transport._connection
    local = IceCredentials.random()
    offer = IceFragment(local.ufrag, local.pwd, tuple(connection.local_candidates))
    started = time.monotonic()
    try:
        async with http.patch(resource, data=offer.to_text(),
                              headers={**(headers or {}), "Content-Type": CONTENT_TYPE},
                              timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            body = await r.read()
            if r.status != 200:
                reason = body.decode("utf-8", "replace").strip().splitlines()[:1]
                return RestartResult(False, reason=f"PATCH answered {r.status}: "
                                                   f"{reason[0] if reason else ''}")
        answer = IceFragment.parse(body)
    except (aiohttp.ClientError, TimeoutError, SdpFragError, OSError) as exc:
        return RestartResult(False, reason=f"PATCH failed: {exc or type(exc).__name__}")
    patch_ms = (time.monotonic() - started) * 1000.0
    icerestart.begin(connection, local, IceCredentials(answer.ufrag, answer.pwd))
    try:
        await icerestart.complete(connection, list(answer.candidates),
                                  max(0.0, timeout - patch_ms / 1000.0))
    except ConnectionError as exc:
        return RestartResult(False, round(patch_ms, 3), reason=str(exc))
    return RestartResult(True, round(patch_ms, 3),
                         round((time.monotonic() - started) * 1000.0, 3))
