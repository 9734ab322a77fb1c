"""A page's own view of its call (page/call.js) -> the ``SessionResult`` every client writes.

The page's marks are ms since it created its peer connection (``performance.now()``), the
convention of ``SessionResult``: ``gathered`` (gathered style only), ``offer``, ``answer``,
``ice_checking``, ``ice_connected``, ``dtls_connected`` (the DTLS transport's state: the
setup), ``connected`` (``connectionState``, which Chrome reports later), ``first_audio`` (the remote track's ``unmute``: its first RTP packet),
``first_audio_stats`` (the first ``getStats()`` poll with packets, a check on it) and
``datachannel_open``. What ``SessionResult`` has no field for goes into ``browser``
(``BrowserExtras``), written beside the result's fields in the same JSON line.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from services.client.results import MediaSample, SessionResult
from services.clienttypes import CHROMIUM
from services.client.verify import (DEFAULT_VERIFIES, ENVELOPE, RAW, datachannel_counts,
                                    verified)

CLIENT_TYPE = CHROMIUM


@dataclass
class BrowserExtras:
    """What the browser session measured beyond ``SessionResult``."""

    offer_candidates: int | None = None    # a=candidate lines in the POSTed offer
    local_candidate: str | None = None     # selected pair: candidate types
    remote_candidate: str | None = None
    first_ice_rtt_responses: int | None = None  # responses averaged in first_ice_rtt_ms (1: exact)
    first_audio_stats_ms: float | None = None   # first getStats() poll that saw packets
    echo_seconds: float | None = None      # received audio the echo RMS covers
    ice_policy: str | None = None          # "all" or "relay" (from /v1/ice-servers)
    marks: dict = field(default_factory=dict)   # the page's timeline, as it gave it
    # a conversation's page: the audio output's latency (AudioContext.outputLatency), part of
    # each reply's time heard
    audio_output_latency_ms: float | None = None
    # what Chrome's jitter buffer did to the audio it played (inbound-rtp: its mean delay,
    # samples concealed, stretched and squeezed)
    playout: dict | None = None
    audio_underruns: dict | None = None   # AudioContext.playbackStats: events, ms

    def to_dict(self) -> dict:
        return asdict(self)


def _number(x) -> float | None:
    return None if x is None else round(float(x), 3)


def to_result(view: dict, index: int, echo_min_rms: float,
              verifies: tuple[str, ...] = DEFAULT_VERIFIES) -> tuple[SessionResult, BrowserExtras]:
    """The ``SessionResult`` (client_type chromium, client full) and the extras of one view;
    ``verifies``: the checks that count (services/client/verify.py)."""
    marks = view.get("marks") or {}
    r = SessionResult(index=index, started_unix=view.get("started_unix") or 0.0,
                      ended_unix=view.get("ended_unix"), ok=bool(view.get("ok")),
                      error=view.get("error"), stage=view.get("stage") or "setup",
                      client="full", client_type=CLIENT_TYPE,
                      offer_style=view.get("offer_style") or "gathered", verifies=list(verifies))
    r.gathered_ms = _number(marks.get("gathered"))
    r.offer_ms = _number(marks.get("offer"))
    r.ice_checking_ms = _number(marks.get("ice_checking"))
    r.signaling_ms = _number(view.get("signaling_ms"))
    r.ice_connected_ms = _number(marks.get("ice_connected"))
    r.setup_ms = _number(marks.get("dtls_connected", marks.get("connected")))
    r.first_audio_ms = _number(marks.get("first_audio"))
    r.datachannel_open_ms = _number(marks.get("datachannel_open"))

    first_rtt = view.get("first_rtt") or {}
    r.first_ice_rtt_ms = _number(first_rtt.get("ms"))
    pair = view.get("pair") or {}
    if pair.get("local") and pair.get("remote"):
        r.ice_pair = f"{pair['local']} -> {pair['remote']}"
    r.consent_rtt_ms = _number(pair.get("current_rtt_ms"))
    r.rtt_ms = _number(view.get("rtt_ms"))
    r.jitter_ms = _number(view.get("jitter_ms"))
    r.packets_received = int(view.get("packets_received") or 0)
    r.packets_lost = int(view.get("packets_lost") or 0)
    r.packets_expected = r.packets_received + r.packets_lost
    r.loss_pct = (round(100.0 * r.packets_lost / r.packets_expected, 3)
                  if r.packets_expected else None)
    r.call_ms = _number(view.get("call_ms"))

    echo = view.get("echo") or {}
    seconds = echo.get("seconds") or 0.0
    if seconds > 0:
        r.echo_rms = round(math.sqrt(max(0.0, echo.get("energy") or 0.0) / seconds), 5)
        r.echo_verified = r.echo_rms >= echo_min_rms
    echo_kind = view.get("datachannel_echo")
    r.datachannel_echo = echo_kind if echo_kind in (ENVELOPE, RAW) else (
        ENVELOPE if view.get("datachannel_verified") else None)  # a page before the field
    r.datachannel_verified = datachannel_counts(verifies, r.datachannel_echo)
    r.verified = verified(verifies, r.echo_verified, r.datachannel_echo)
    r.events = list(view.get("events") or [])

    r.http_status = view.get("http_status")
    r.session_url = view.get("location")
    r.cluster, r.transceiver = view.get("cluster"), view.get("transceiver")
    r.delete_status, r.teardown_error = view.get("delete_status"), view.get("teardown_error")

    # Wall clock: the page's performance.timeOrigin + its marks.
    if r.first_audio_ms is not None and r.started_unix:
        r.first_rx_unix = round(r.started_unix + r.first_audio_ms / 1000.0, 6)
    last = view.get("last_rx_unix")
    if last and r.started_unix and r.ended_unix and r.started_unix <= last <= r.ended_unix:
        r.last_rx_unix = round(last, 6)
    connected = (round(r.started_unix + r.setup_ms / 1000.0, 6)
                 if r.setup_ms is not None and r.started_unix else None)
    r.attempts = [{"attempt": 0, "reason": "first", "started_unix": round(r.started_unix, 6),
                   "connected_unix": connected, "location": r.session_url,
                   "cluster": r.cluster, "transceiver": r.transceiver, "error": r.error}]
    r.samples = [MediaSample(session=index, t_ms=_number(t), packets_received=int(rx),
                             packets_lost=int(lost), jitter_ms=_number(jitter),
                             rtt_ms=_number(rtt))
                 for t, rx, lost, jitter, rtt in view.get("samples") or []]

    extras = BrowserExtras(
        offer_candidates=view.get("offer_candidates"),
        local_candidate=pair.get("local_type"), remote_candidate=pair.get("remote_type"),
        first_ice_rtt_responses=first_rtt.get("responses"),
        first_audio_stats_ms=_number(marks.get("first_audio_stats")),
        echo_seconds=_number(seconds) if seconds else None,
        ice_policy=view.get("ice_policy"), marks=dict(marks),
        audio_output_latency_ms=_number(view.get("audio_output_latency_ms")),
        playout=view.get("playout"), audio_underruns=view.get("audio_underruns"))
    return r, extras


def failed(index: int, offer_style: str, started_unix: float, ended_unix: float, error: str,
           stage: str = "setup", verifies: tuple[str, ...] = DEFAULT_VERIFIES) -> SessionResult:
    """The result of a session whose page never gave a view (the browser failed it)."""
    r = SessionResult(index=index, started_unix=started_unix, ended_unix=ended_unix,
                      error=error, stage=stage, client="full", client_type=CLIENT_TYPE,
                      offer_style=offer_style, verifies=list(verifies))
    r.attempts = [{"attempt": 0, "reason": "first", "started_unix": round(started_unix, 6),
                   "connected_unix": None, "location": None, "cluster": None,
                   "transceiver": None, "error": error}]
    return r
