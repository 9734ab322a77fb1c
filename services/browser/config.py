"""Configuration of a run of browser sessions (``voiceedge browser``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from services.client.config import ConversationConfig
from services.client.verify import DEFAULT_VERIFIES, parse_verifies

GATHERED, IMMEDIATE, ALTERNATE = "gathered", "immediate", "alternate"
OFFER_STYLES = (GATHERED, IMMEDIATE)           # what one session does
OFFER_CHOICES = (GATHERED, IMMEDIATE, ALTERNATE)  # what a run asks for
DEFAULT_CHROMIUM = "/usr/bin/chromium"         # Debian's package (make browsers)


@dataclass(frozen=True)
class BrowserConfig:
    """What every browser session of a run does; see ``services/browser/session.py``."""

    url: str                              # signaling, e.g. http://VIP:8080/v1/calls
    duration_s: float = 5.0               # call time after DTLS connected
    start_rate: float = 2.0               # sessions started per second
    offer: str = ALTERNATE                # gathered, immediate, or alternate by session number
    index_base: int = 0                   # session i is index index_base + i
    start_delay_s: float = 0.0            # from the browser's ready to the first session
    chromium: str = DEFAULT_CHROMIUM      # the browser's executable
    setup_timeout_s: float = 10.0         # session start (peer connection) -> DTLS connected
    signaling_timeout_s: float = 5.0      # the offer POST
    teardown_timeout_s: float = 5.0       # the DELETE
    media_timeout_s: float = 1.5          # no RTP for this long during the call: failed
    ice_from_signaling: bool = False      # GET /v1/ice-servers before each session
    tone_hz: float = 440.0                # the fake microphone's tone; 0: silence
    echo_skip_ms: float = 200.0           # received audio ignored for the echo check
    # RMS (full scale 1.0) of the agent's reply from which the echo counts: the tone's echo
    # measures ~0.2, the edge's silence 0.0 (docs/browser.md, "Echo").
    echo_min_rms: float = 0.02
    verifies: tuple[str, ...] = DEFAULT_VERIFIES  # what counts as verified (client/verify.py)
    # sessions speak in turns to a reply agent instead of the tone (browser/talk.py)
    conversation: ConversationConfig | None = None
    audio_dir: str | None = None          # where a conversation's completed replies are kept
    # the API key or call token the page carries to the front (docs/auth.md): handed to it in
    # its URL's fragment, which no request carries; never in a repr or a log
    credential: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} is not an http(s) URL")
        if self.offer not in OFFER_CHOICES:
            raise ValueError(f"offer must be one of {', '.join(OFFER_CHOICES)}")
        for name in ("duration_s", "start_rate", "setup_timeout_s", "signaling_timeout_s",
                     "teardown_timeout_s", "media_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.index_base < 0:
            raise ValueError("index_base must be at least 0")
        if not 0 <= self.start_delay_s <= 3600:
            raise ValueError("start_delay_s must be 0 to 3600")
        if not 0 <= self.tone_hz <= 20_000:
            raise ValueError("tone_hz must be 0 (silence) to 20000")
        object.__setattr__(self, "verifies", parse_verifies(self.verifies))  # ValueError: unknown
        if self.audio_dir is not None and self.conversation is None:
            raise ValueError("audio_dir needs a conversation")

    def offer_style(self, i: int) -> str:
        """The offer style of the run's session ``i`` (0-based): alternate starts gathered."""
        if self.offer != ALTERNATE:
            return self.offer
        return GATHERED if i % 2 == 0 else IMMEDIATE

    def page_options(self, i: int) -> dict:
        """What the page's ``runSession`` is given for session ``i`` (page/call.js DEFAULTS)."""
        return {"url": self.url, "index": self.index_base + i, "offerStyle": self.offer_style(i),
                "durationMs": self.duration_s * 1000, "setupTimeoutMs": self.setup_timeout_s * 1000,
                "signalingTimeoutMs": self.signaling_timeout_s * 1000,
                "teardownTimeoutMs": self.teardown_timeout_s * 1000,
                "mediaTimeoutMs": self.media_timeout_s * 1000, "echoSkipMs": self.echo_skip_ms,
                "iceFromSignaling": self.ice_from_signaling}
