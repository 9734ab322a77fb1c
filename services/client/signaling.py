"""The HTTP side of a session: POST the offer, DELETE the session (OpenAI Realtime convention)."""
from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
from multidict import CIMultiDict
from yarl import URL

CLUSTER_HEADER = "X-Voiceedge-Cluster"          # the edge's answer: which cluster took the call
TRANSCEIVER_HEADER = "X-Voiceedge-Transceiver"  # ... and which transceiver (its number in it)


class SignalingError(Exception):
    """The offer was not answered; the message is the one-line reason recorded for the session."""


@dataclass(frozen=True)
class Answer:
    sdp: str
    status: int
    location: str | None   # absolute URL of the session, or None if the server gave none
    headers: Mapping[str, str] = field(default_factory=CIMultiDict)  # case-insensitive

    @property
    def cluster(self) -> str | None:
        return self.headers.get(CLUSTER_HEADER)

    @property
    def transceiver(self) -> str | None:
        return self.headers.get(TRANSCEIVER_HEADER)


def _reason(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:200] or "(no reason given)"


async def post_offer(http: aiohttp.ClientSession, url: str, sdp: str, timeout_s: float,
                     headers: dict[str, str] | None = None) -> Answer:
    """POST ``sdp`` as application/sdp; return the answer, or raise SignalingError with a reason."""
    headers = {**(headers or {}), "Content-Type": "application/sdp"}
    try:
        async with http.post(url, data=sdp.encode(), headers=headers,
                             timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            body = await resp.text(errors="replace")
            if resp.status not in (200, 201):
                raise SignalingError(f"HTTP {resp.status}: {_reason(body)}")
            if not body.lstrip().startswith("v=0"):
                raise SignalingError(f"HTTP {resp.status} but the body is not an SDP answer: "
                                     f"{_reason(body)}")
            location = resp.headers.get("Location")
            return Answer(body, resp.status,
                          str(URL(url).join(URL(location))) if location else None,
                          CIMultiDict(resp.headers))
    except asyncio.TimeoutError:
        raise SignalingError(f"signaling timeout: no answer within {timeout_s:g} s") from None
    except aiohttp.ClientConnectorError as exc:
        err = exc.os_error
        reason = (os.strerror(err.errno) if err.errno
                  else err.strerror or str(err) or type(err).__name__)
        raise SignalingError(f"cannot connect to {exc.host}:{exc.port}: {reason}") from None
    except aiohttp.InvalidURL as exc:
        raise SignalingError(f"invalid URL {exc}") from None
    except aiohttp.ClientError as exc:
        raise SignalingError(f"signaling failed: {type(exc).__name__}: {exc}") from None


async def delete_session(http: aiohttp.ClientSession, location: str, timeout_s: float,
                         headers: dict[str, str] | None = None) -> int:
    """DELETE the session; returns the HTTP status. Raises SignalingError if there is none."""
    try:
        async with http.delete(location, headers=headers or {},
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            await resp.read()
            return resp.status
    except asyncio.TimeoutError:
        raise SignalingError(f"DELETE timeout after {timeout_s:g} s") from None
    except aiohttp.ClientError as exc:
        raise SignalingError(f"DELETE failed: {type(exc).__name__}: {exc}") from None
