"""What a session measured: one ``SessionResult`` per session, ``MediaSample``s during the call;
``JsonLines`` writes them.

Times ending in ``_ms`` that name a moment (``*_connected_ms``, ``setup_ms``, ``first_audio_ms``,
``offer_ms``) are milliseconds on time.monotonic() since the session started building its peer
connection; ``signaling_ms`` and ``*_rtt_ms`` are durations. None means not reached or not measured.

A session is one logical call that may reconnect (docs/client.md, Reconnection and media gaps):
the setup timeline, ``ice_pair``, ``first_ice_rtt_ms``, ``consent_rtt_ms``, ``session_url``,
``cluster`` and ``transceiver`` are the first attempt's; packet counts and loss are summed over
the attempts' connections; ``jitter_ms`` and ``rtt_ms`` are the last connected one's; the
``rx_*`` fields and the samples span the whole call. ``*_unix`` fields are wall-clock seconds.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from services.client.verify import DEFAULT_VERIFIES
from services.clienttypes import AIORTC


@dataclass
class MediaSample:
    """One sample during the call; counters are cumulative since the first received packet."""

    session: int
    t_ms: float
    packets_received: int
    packets_lost: int
    jitter_ms: float | None
    rtt_ms: float | None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


@dataclass
class SessionResult:
    index: int
    started_unix: float                   # wall clock at session start, to join with other logs
    ended_unix: float | None = None       # wall clock when the session was torn down
    ok: bool = False
    error: str | None = None
    stage: str = "setup"                  # where it ended: setup, signaling, connect, call, done
    client: str = "full"                  # full (decodes, RMS echo) or light (RTP headers only)
    client_type: str = AIORTC             # which WebRTC stack: services/clienttypes.py
    media_path: str = "python"            # who carried its RTP: aiortc, or the native pump
    offer_style: str = "gathered"         # offer sent after ICE gathering, or "immediate"

    # timeline
    gathered_ms: float | None = None      # ICE gathering complete (TURN: allocation included)
    offer_ms: float | None = None         # offer POST sent (after ICE gathering)
    ice_checking_ms: float | None = None  # ICE state "checking" (browser clients)
    signaling_ms: float | None = None     # POST sent -> answer received (duration)
    ice_connected_ms: float | None = None
    setup_ms: float | None = None         # DTLS connected
    first_audio_ms: float | None = None   # first RTP packet from the server
    first_ice_rtt_ms: float | None = None
    # TURN requests of the first attempt: [method, sent_ms, rtt_ms or None, outcome] each
    # (Allocate, CreatePermission, ChannelBind, Refresh), on the session's timeline
    turn_transactions: list[list] = field(default_factory=list)
    datachannel_open_ms: float | None = None

    # media, at the end of the call
    rtt_ms: float | None = None           # RTCP RR of our sending stream (aiortc's smoothed value)
    consent_rtt_ms: float | None = None   # last STUN consent check on the selected pair
    jitter_ms: float | None = None
    packets_received: int = 0
    packets_expected: int = 0
    packets_lost: int = 0
    loss_pct: float | None = None
    loss_bursts: list[int] = field(default_factory=list)
    call_ms: float | None = None          # how long the call actually ran

    # verification
    echo_rms: float | None = None         # full clients only
    echo_voiced_pct: float | None = None  # voiced payloads after echo_skip_ms, both kinds
    echo_verified: bool = False
    datachannel_verified: bool = False    # the event came back in a form that counts (verify.py)
    datachannel_echo: str | None = None   # how it came back: "envelope", "raw", None (never)
    # the checks the session was asked for (services/client/verify.py) and those that passed
    verifies: list[str] = field(default_factory=lambda: list(DEFAULT_VERIFIES))
    verified: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # types of received data-channel events

    # signaling details
    http_status: int | None = None
    session_url: str | None = None
    delete_status: int | None = None
    teardown_error: str | None = None
    ice_pair: str | None = None           # selected pair "local -> remote"
    cluster: str | None = None            # the answer's X-Voiceedge-Cluster
    transceiver: str | None = None        # the answer's X-Voiceedge-Transceiver (its number)

    # reconnection and media gaps (first attempt: 0)
    reconnections: int = 0                # times the client called again, failed calls included
    # times its media stopped and came back when it renominated its pair (no new call: a NAT
    # that moved its port, docs/mobility.md)
    renominations: int = 0
    # each: [its last packet before the silence, when the watchdog noticed it, its first packet
    # after the renomination] (wall clock)
    renominated: list[list] = field(default_factory=list)
    # each ICE restart of the call (services/client/restart.py): [sent (wall clock), ok,
    # the PATCH's round trip ms, PATCH to a pair nominated under the new credentials ms,
    # why it failed or None]
    ice_restarts: list[list] = field(default_factory=list)
    # per attempt: attempt, reason ("first" or why it called again), started_unix,
    # connected_unix (None: never), location, cluster, transceiver, error (None: ended with the call)
    attempts: list[dict] = field(default_factory=list)
    # [start_unix (last packet before), ms, attempt (whose packet ended it)] per gap >= 60 ms
    # between consecutive received RTP packets, across reconnections (services/gaps.py)
    rx_gaps: list[list] = field(default_factory=list)
    rx_gaps_unlisted: int = 0             # gaps beyond the first 500, counted only
    first_rx_unix: float | None = None    # first and last received RTP packet of the call
    last_rx_unix: float | None = None

    # conversation sessions (services/client/conversation.py): one dict per caller line
    turns: list[dict] = field(default_factory=list)

    samples: list[MediaSample] = field(default_factory=list)
    # [ssrc, sequence number, unix arrival] of every received RTP packet, with
    # ClientConfig.record_arrivals (written to a file of their own, not in the JSON line)
    rx_arrivals: list[list] = field(default_factory=list)

    @property
    def fully_verified(self) -> bool:
        """Whether every check the session was asked for passed."""
        return set(self.verified) >= set(self.verifies)

    def to_dict(self, with_samples: bool = True) -> dict:
        d = asdict(self)
        del d["rx_arrivals"]
        if not with_samples:
            del d["samples"]
        return d

    def to_json(self, with_samples: bool = True) -> str:
        """One JSON line."""
        return json.dumps(self.to_dict(with_samples), separators=(",", ":"))


class JsonLines:
    """Appends results (one line each), their samples and their RTP arrivals to optional
    files, flushed per session (the browser client writes through it too)."""

    def __init__(self, results_path: Path | str | None, samples_path: Path | str | None,
                 arrivals_path: Path | str | None = None) -> None:
        self._results: TextIO | None = open(results_path, "a") if results_path else None
        self._samples: TextIO | None = open(samples_path, "a") if samples_path else None
        self._arrivals: TextIO | None = open(arrivals_path, "a") if arrivals_path else None

    def write(self, result: SessionResult, extra: dict | None = None) -> None:
        """``extra``: more keys of the result's line (the browser's own figures)."""
        if self._results is not None:
            line = (result.to_json(with_samples=False) if not extra else json.dumps(
                {**result.to_dict(with_samples=False), **extra}, separators=(",", ":")))
            self._results.write(line + "\n")
            self._results.flush()
        if self._samples is not None:
            self._samples.writelines(s.to_json() + "\n" for s in result.samples)
            self._samples.flush()
        if self._arrivals is not None:
            self._arrivals.write(json.dumps({"index": result.index,
                                             "arrivals": result.rx_arrivals},
                                            separators=(",", ":")) + "\n")
            self._arrivals.flush()

    def close(self) -> None:
        for f in (self._results, self._samples, self._arrivals):
            if f is not None:
                f.close()
