"""Configuration of client sessions."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from services.client.verify import DEFAULT_VERIFIES, parse_verifies

FULL, LIGHT = "full", "light"   # client kinds: docs/client.md (Two kinds of client)
KINDS = (FULL, LIGHT)
JITTER_BUFFERS = ("playout", "aiortc")  # a conversation caller's (ConversationConfig)
ICE_POLICIES = ("all", "relay")  # RTCIceTransportPolicy: every candidate, or TURN relays only


@dataclass(frozen=True)
class IceServer:
    """A STUN or TURN server for the client's ICE agent (none by default)."""

    urls: str
    username: str | None = None
    credential: str | None = None


@dataclass(frozen=True)
class ConversationConfig:
    """What a conversation session says and when."""

    turns: int = 5                  # caller lines per call (the call ends after the last reply)
    barge_in_share: float = 0.25    # of the lines after the first: spoken into the reply
    barge_in_after_ms: float = 800  # how far into the reply (as heard) the caller cuts in
    pause_ms: float = 500           # silence between a reply heard to its end and the next line
    reply_timeout_s: float = 3.0    # no reply heard by then: the next line anyway
    # The caller's audio jitter buffer: "playout" gives a missing packet up once 4 frames after
    # it are complete (services/client/playout.py); "aiortc" is aiortc's own, whose delay grows
    # from 80 to 300 ms at the first lost packet (docs/conversation.md)
    jitter_buffer: str = "playout"

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ValueError("a conversation needs at least 1 turn")
        if not 0.0 <= self.barge_in_share <= 1.0:
            raise ValueError("barge_in_share must be between 0 and 1")
        if self.jitter_buffer not in JITTER_BUFFERS:
            raise ValueError(f"jitter_buffer is one of {', '.join(JITTER_BUFFERS)}")
        for name in ("barge_in_after_ms", "pause_ms", "reply_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be at least 0")

    def barge_in(self, session: int, turn: int) -> bool:
        """Whether line ``turn`` (from 0) of session ``session`` cuts into the reply before
        it: spread evenly so that every run of lines has its share (the first never does)."""
        if turn == 0 or self.barge_in_share == 0:
            return False
        phase = (session * 0.6180339887) % 1.0  # where in its lines each session's fall
        k = turn - 1
        return (math.floor((k + 1) * self.barge_in_share + phase)
                > math.floor(k * self.barge_in_share + phase))


@dataclass(frozen=True)
class ClientConfig:
    """What every session of a run does; see ``services/client/session.py``."""

    url: str                              # e.g. http://HOST:PORT/v1/calls
    duration_s: float = 5.0               # call time after DTLS connected
    start_rate: float = 10.0              # sessions started per second (run_sessions)
    # Wall-clock time (Unix s) the first session is due, the others following at start_rate
    # from there; None: as soon as run_sessions starts. A scenario with faults gives one, so
    # its faults and its calls keep one clock whatever the client's start-up costs.
    start_at_unix: float | None = None
    # A file that will hold start_at_unix, written once every client of a run is up (waited
    # for after the warm-up, START_FILE_WAIT_S at most).
    start_file: str | None = None
    concurrency: int | None = None        # at most this many sessions at once; None: no limit
    ice_servers: tuple[IceServer, ...] = ()
    ice_transport_policy: str = "all"     # "relay": relay candidates only (TURN)
    # Fetch the ICE servers and policy from the front before each session (GET
    # /v1/ice-servers on the URL's origin) instead of ice_servers; "relay" above still forces
    # relay-only whatever the front says.
    ice_from_signaling: bool = False
    setup_timeout_s: float = 10.0         # session start -> DTLS connected, else "setup timeout"
    signaling_timeout_s: float = 5.0      # the offer POST alone
    teardown_timeout_s: float = 5.0       # each of DELETE and peer-connection close
    sample_interval_s: float = 1.0        # per-second media samples
    echo_skip_ms: float = 200.0           # received audio ignored for the echo check
    echo_min_rms: float = 0.02            # RMS (full scale 1.0) from which the echo counts (full)
    echo_min_voiced_pct: float = 25.0     # voiced payloads after echo_skip_ms (light)
    full_sessions: int | None = None      # run_sessions: this many full, the rest light; None: all
    # This process's place among several calling at one rate (0 to 1): sessions start that
    # share of 1/start_rate later, the full ones fall that share of their spacing later (kinds).
    phase: float = 0.0
    tone_hz: float = 440.0
    headers: dict[str, str] = field(default_factory=dict)  # extra HTTP headers, e.g. Authorization
    # Reconnection (docs/client.md): no RTP for media_timeout_s during the call is a failed
    # connection, as are ICE failed and connection failed/closed; the session then calls again,
    # at most reconnect_attempts times in all (0: never), attempt k after reconnect_backoff_s[k]
    # (the last value for the ones beyond it).
    media_timeout_s: float = 1.5
    reconnect_attempts: int = 3
    reconnect_backoff_s: tuple[float, ...] = (0.0, 0.5, 1.0)
    # A first setup that the edge answered but whose media never connected (the server died
    # under it) is called again like a failed connection. Off by default: a failed setup is a
    # failed session. Fault scenarios turn it on (docs/client.md).
    retry_setup: bool = False
    # Keep every received RTP packet's SSRC, sequence number and arrival time (the client's
    # user-space receive time: the only view of its last mile down, docs/captures.md).
    record_arrivals: bool = False
    # Who carries a light session's RTP once it is connected: aiortc ("python"), or the
    # process's native pump ("native", services/client/pump.py; direct pairs only).
    light_path: str = "python"
    # What the session checks came back (services/client/verify.py): the edge's to declare;
    # by default the project's edge, whose agent echoes audio and wraps events in agent.echo.
    verifies: tuple[str, ...] = DEFAULT_VERIFIES
    # Full sessions speak in turns to a reply agent instead of sending the tone
    # (services/client/conversation.py; the call ends after its last reply, duration_s at most);
    # the completed replies they heard go to audio_dir as WAV files, for scoring.
    conversation: ConversationConfig | None = None
    audio_dir: str | None = None

    def __post_init__(self) -> None:
        if self.light_path not in ("python", "native"):
            raise ValueError("light_path is python or native")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} is not an http(s) URL")
        for name in ("duration_s", "start_rate", "setup_timeout_s", "signaling_timeout_s",
                     "teardown_timeout_s", "sample_interval_s", "media_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.start_at_unix is not None and not self.start_at_unix > 0:
            raise ValueError("start_at_unix must be a positive Unix time")
        if self.start_file is not None and self.start_at_unix is not None:
            raise ValueError("give start_at_unix or start_file, not both")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.full_sessions is not None and self.full_sessions < 0:
            raise ValueError("full_sessions must be at least 0")
        if not 0.0 <= self.phase < 1.0:
            raise ValueError("phase must be at least 0 and below 1")
        if (not isinstance(self.reconnect_attempts, int) or isinstance(self.reconnect_attempts, bool)
                or self.reconnect_attempts < 0):
            raise ValueError("reconnect_attempts must be an integer, at least 0")
        if not self.reconnect_backoff_s or any(not b >= 0 for b in self.reconnect_backoff_s):
            raise ValueError("reconnect_backoff_s must be one or more waits of 0 s or more")
        if self.ice_transport_policy not in ICE_POLICIES:
            raise ValueError(f"ice_transport_policy must be one of {', '.join(ICE_POLICIES)}")
        if self.ice_from_signaling and self.ice_servers:
            raise ValueError("ICE servers come from signaling or from ice_servers, not both")
        object.__setattr__(self, "verifies", parse_verifies(self.verifies))  # ValueError: unknown
        if not 0 < self.echo_min_voiced_pct <= 100:
            raise ValueError("echo_min_voiced_pct must be in (0, 100]")

    def backoff_s(self, k: int) -> float:
        """The wait before reconnection attempt ``k`` (0-based)."""
        return self.reconnect_backoff_s[min(k, len(self.reconnect_backoff_s) - 1)]
