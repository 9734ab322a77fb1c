"""What a ``POST /v1/calls`` must satisfy before its offer goes anywhere near a transceiver.

Checked in this order, cheapest first; each refusal is a one-line 4xx whose ``reason`` the
front counts (``voiceedge_signaling_offers_rejected_total{reason}``):

- ``content_type`` (415): not ``application/sdp`` (parameters such as ``charset`` are fine).
- ``too_large`` (413): a ``Content-Length`` over ``max_body_bytes``, or a chunked body that
  grows past it (aiohttp's ``client_max_size``; nothing beyond it is buffered).
- ``read_timeout`` (408): the body not complete ``read_timeout_s`` after its headers (a client
  that sends a byte a second).
- ``incomplete`` (400): the client went away, or broke the framing, in the middle of its body.
- ``control_characters``, ``too_many_media``, ``too_many_candidates``, ``too_many_lines``,
  ``line_too_long`` (400): SDP sanity, before any parsing.
- ``invalid_offer`` (400): what services/wire/sdp.py's ``check_offer`` refuses (not UTF-8, not
  SDP, no audio, no BUNDLE...), the check every transceiver makes too.
- ``not_webrtc`` (400): no ``a=ice-ufrag``, ``a=ice-pwd`` or ``a=fingerprint`` (every WebRTC
  offer has them; without them the transceiver could only fail to negotiate).

Before any of this, the connection itself: request headers must be complete
``idle_timeout_s`` after the connection opened or its previous answer, else it is closed
without an answer (aiohttp's keep-alive timer, which also closes idle connections); header
lines and counts have aiohttp's caps (8190 bytes a line, 128 headers: 400 beyond, answered
by aiohttp and not counted here).

Logs: refusals and malformed HTTP are the client's doing, and a flood of them must not become
a flood of log lines: ``LogBudget`` lets 20 a second through and counts the rest;
``BadRequestLog`` turns aiohttp's ERROR-with-traceback per malformed request into one
``bad_http_request`` warning, within such a budget.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from services.logs import Event
from services.wire.sdp import MAX_OFFER_BYTES, OfferError, check_offer

REASONS = ("content_type", "too_large", "read_timeout", "incomplete", "control_characters",
           "too_many_media", "too_many_candidates", "too_many_lines", "line_too_long",
           "invalid_offer", "not_webrtc")
_WEBRTC = {name: re.compile(rb"^a=" + name.encode() + rb":\S", re.M)
           for name in ("ice-ufrag", "ice-pwd", "fingerprint")}
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # all but \t \n \r


@dataclass(frozen=True)
class RequestLimits:
    """The front's limits on a call request; defaults are several times what real offers
    need (a browser's audio + data channel offer: ~60 lines, lines under 200 bytes, a few
    candidates, 2 media sections)."""

    max_body_bytes: int = MAX_OFFER_BYTES  # 64 KiB; transceivers refuse more anyway
    read_timeout_s: float = 5.0
    idle_timeout_s: float = 5.0
    max_lines: int = 512
    max_line_bytes: int = 1024
    max_media: int = 8
    max_candidates: int = 64

    def __post_init__(self) -> None:
        if not 1024 <= self.max_body_bytes <= MAX_OFFER_BYTES:
            raise ValueError(f"max_body_bytes must be 1024 to {MAX_OFFER_BYTES} (what "
                             "transceivers accept)")
        for name in ("read_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        for name in ("max_lines", "max_line_bytes", "max_media", "max_candidates"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


class Refused(OfferError):
    """An offer refused at the front: ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, text: str, status: int = 400) -> None:
        super().__init__(text, status)
        self.reason = reason


async def read_offer(request: web.Request, limits: RequestLimits) -> bytes:
    """The request's body if it is an offer within ``limits``; raises ``Refused``."""
    if request.content_type != "application/sdp":
        raise Refused("content_type", "Content-Type must be application/sdp", 415)
    body = await read_body(request, limits.max_body_bytes, limits.read_timeout_s, "offer")
    check_sdp(body, limits)
    try:
        check_offer(body)
    except OfferError as exc:
        raise Refused("too_large" if exc.status == 413 else "invalid_offer", str(exc),
                      exc.status) from None
    missing = [name for name, pattern in _WEBRTC.items() if not pattern.search(body)]
    if missing:
        raise Refused("not_webrtc", "not a WebRTC offer: no " + ", ".join(
            f"a={name}" for name in missing))
    return body


async def read_body(request: web.Request, max_bytes: int, timeout_s: float, what: str) -> bytes:
    """The whole body, at most ``max_bytes`` and within ``timeout_s``; raises ``Refused``
    (413, 408, 400) naming ``what`` it was meant to be."""
    too_large = f"{what} is larger than {max_bytes} bytes"
    if request.content_length is not None and request.content_length > max_bytes:
        raise Refused("too_large", too_large, 413)
    try:
        async with asyncio.timeout(timeout_s):
            body = await request.read()
    except TimeoutError:
        raise Refused("read_timeout", f"{what} not received within {timeout_s:g} s",
                      408) from None
    except web.HTTPRequestEntityTooLarge:
        raise Refused("too_large", too_large, 413) from None
    except (ConnectionError, HttpProcessingError):
        raise Refused("incomplete", f"{what} body incomplete") from None
    if len(body) > max_bytes:
        raise Refused("too_large", too_large, 413)
    return body


def check_sdp(body: bytes, limits: RequestLimits) -> None:
    """Refuse a body no offer looks like, before it is decoded or parsed: linear in its size,
    counts before lines are split (nothing kept per line beyond ``max_lines`` of them)."""
    if _CONTROL.search(body):
        raise Refused("control_characters", "offer contains control characters")
    if body.count(b"\nm=") + body.startswith(b"m=") > limits.max_media:
        raise Refused("too_many_media", f"offer has more than {limits.max_media} media sections")
    if body.count(b"\na=candidate:") > limits.max_candidates:
        raise Refused("too_many_candidates",
                      f"offer has more than {limits.max_candidates} candidates")
    if body.count(b"\n") + 1 > limits.max_lines:
        raise Refused("too_many_lines", f"offer has more than {limits.max_lines} lines")
    if any(len(line.rstrip(b"\r")) > limits.max_line_bytes for line in body.split(b"\n")):
        raise Refused("line_too_long",
                      f"offer has a line longer than {limits.max_line_bytes} bytes")


class LogBudget:
    """At most ``per_second`` log lines a second for one kind of event; a flood of refusals
    must not become a flood of log lines (the counters in /metrics keep every one)."""

    def __init__(self, per_second: int = 20, clock=time.monotonic) -> None:
        self.per_second, self._clock = per_second, clock
        self._window, self._used = 0.0, 0
        self.suppressed = 0        # since the last line allowed
        self.suppressed_total = 0

    def take(self) -> int | None:
        """None: do not log this one; else how many were not logged since the last."""
        now = self._clock()
        if now - self._window >= 1.0:
            self._window, self._used = now, 0
        if self._used >= self.per_second:
            self.suppressed += 1
            self.suppressed_total += 1
            return None
        self._used += 1
        skipped, self.suppressed = self.suppressed, 0
        return skipped


class BadRequestLog(logging.Filter):
    """On the logger given to aiohttp's request handler: a malformed request (aiohttp answers
    400 itself) becomes one ``bad_http_request`` warning without a traceback, at most as many
    a second as ``budget`` allows; anything else passes unchanged."""

    def __init__(self, budget: LogBudget | None = None) -> None:
        super().__init__()
        self.budget = budget or LogBudget()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        skipped = self.budget.take()
        if skipped is None:
            return False
        lines = [line.strip() for line in str(exc.message or "").splitlines() if line.strip()]
        fields = {"error": (lines or [type(exc).__name__])[0][:200]}
        if record.args:
            fields["remote"] = str(record.args[0])
        if skipped:
            fields["suppressed"] = skipped
        record.msg, record.args, record.exc_info = Event("bad_http_request", fields), (), None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True
