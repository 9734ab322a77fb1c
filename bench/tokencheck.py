"""What checking a call token adds to signaling (docs/auth.md).

Three fronts in one process in front of one real transceiver on loopback, the same but for
their API keys: two open (``open``, and ``control``: what two identical fronts differ by, the
noise), one checking keys (``keyed``, its calls carrying a token). Calls go to them in turn,
each round of three in an order rotated from the last (a call's place in the round shows: an
open front always second was +0.08 ms), each a real SDP offer whose session is deleted at
once, so that all see the same machine, the same transceiver and the same moment; the medians
of the ``POST /v1/calls`` round trip at the client, and of the front's own time (``front_ms``
of its ``call_created`` line: the request arriving to the answer leaving, the transceiver's
answer included) are compared side by side.
Alone, ``KeyRing.authenticate`` is timed on a token and on a key (the check itself: base64,
JSON, an HMAC-SHA256 and a constant-time comparison).
"""
from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass

import aiohttp

from voiceedge.errors import UserError


@dataclass(frozen=True)
class TokenCheckResult:
    calls: int                         # per front
    authenticate_token_us: float       # median, KeyRing.authenticate on a token
    authenticate_key_us: float         # ... on a key
    post_open_ms: float                # median POST /v1/calls round trip, open front
    post_control_ms: float             # ... the other open front
    post_keyed_ms: float               # ... front checking keys (a token)
    front_open_ms: float               # median front_ms, open front
    front_control_ms: float            # ... the other open front
    front_keyed_ms: float              # ... front checking keys

    @property
    def added_ms(self) -> float:
        """The front's own time with keys less without (medians of the same run)."""
        return round(self.front_keyed_ms - self.front_open_ms, 3)

    @property
    def noise_ms(self) -> float:
        """The same between the two open fronts."""
        return round(self.front_control_ms - self.front_open_ms, 3)


def time_authenticate(rounds: int = 20_000) -> tuple[float, float]:
    """Median microseconds of one ``authenticate`` on a token and on a key (batches of 100)."""
    from services.signaling.auth import ApiKey, Caller, KeyRing

    key = ApiKey.new("bench")
    ring = KeyRing([key])
    token = f"Bearer {ring.mint(Caller('bench'), 600).value}"
    bearer_key = f"Bearer {key.text}"
    out = []
    for header in (token, bearer_key):
        batches = []
        for _ in range(max(1, rounds // 100)):
            started = time.perf_counter()
            for _ in range(100):
                ring.authenticate(header)
            batches.append((time.perf_counter() - started) / 100 * 1e6)
        out.append(round(statistics.median(batches), 2))
    return out[0], out[1]


class _FrontTimes(logging.Handler):
    """``front_ms`` of every ``call_created`` line, by the front's region."""

    def __init__(self) -> None:
        super().__init__()
        self.ms: dict[str, list[float]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        from services.logs import Event

        msg = record.msg
        if isinstance(msg, Event) and msg.name == "call_created":
            self.ms.setdefault(msg.fields.get("region"), []).append(msg.fields["front_ms"])


async def _offer() -> str:
    from aiortc import RTCConfiguration, RTCPeerConnection
    from aiortc.mediastreams import AudioStreamTrack

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(AudioStreamTrack())
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


async def _measure(calls: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    from services.signaling.auth import ApiKey, Caller, KeyRing
    from services.signaling.server import ClusterRoute, SignalingConfig, SignalingServer
    from services.transceiver import ice
    from services.transceiver.server import TransceiverConfig, TransceiverServer

    key = ApiKey.new("bench")
    ring = KeyRing([key])
    token = ring.mint(Caller("bench"), 3600).value
    times = _FrontTimes()
    logger = logging.getLogger("voiceedge.signaling")
    level, logger.level = logger.level, logging.INFO
    logger.addHandler(times)
    names = ("open", "control", "keyed")
    posts: dict[str, list[float]] = {name: [] for name in names}
    try:
        config = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host="127.0.0.1",
                                   control=("127.0.0.1", 0), mode=ice.SHARED,
                                   max_sessions=calls + 10)
        async with TransceiverServer(config) as transceiver:
            route = ClusterRoute("c1", (f"http://127.0.0.1:{transceiver.control_port}",))
            fronts = {}
            for name, auth in (("open", None), ("control", None), ("keyed", ring)):
                fronts[name] = SignalingServer(SignalingConfig(
                    clusters=(route,), listen=("127.0.0.1", 0), region=name, auth=auth))
                await fronts[name].start()
            try:
                offer = await _offer()
                headers = {"open": {}, "control": {},
                           "keyed": {"Authorization": f"Bearer {token}"}}
                async with aiohttp.ClientSession() as http:
                    for i in range(3 * (calls + 2)):   # the first two of each: warm-up
                        name = names[(i + i // 3) % 3]
                        base = f"http://127.0.0.1:{fronts[name].port}"
                        started = time.perf_counter()
                        async with http.post(f"{base}/v1/calls", data=offer, headers={
                                "Content-Type": "application/sdp", **headers[name]}) as r:
                            await r.read()
                            location = r.headers.get("Location")
                            if r.status != 201:
                                raise RuntimeError(f"{name} front: HTTP {r.status}")
                        if i >= 6:
                            posts[name].append((time.perf_counter() - started) * 1000.0)
                        async with http.delete(f"{base}{location}",
                                               headers=headers[name]) as r:
                            await r.read()
            finally:
                for front in fronts.values():
                    await front.stop()
    finally:
        logger.removeHandler(times)
        logger.level = level
    front_ms = {name: times.ms.get(name, [])[2:] for name in names}
    return posts, front_ms


def run(calls: int = 200) -> TokenCheckResult:
    """``calls`` calls through each front, alternating; the medians."""
    token_us, key_us = time_authenticate()
    posts, front_ms = asyncio.run(_measure(calls))
    med = lambda values: round(statistics.median(values), 3)
    return TokenCheckResult(calls, token_us, key_us, med(posts["open"]),
                            med(posts["control"]), med(posts["keyed"]), med(front_ms["open"]),
                            med(front_ms["control"]), med(front_ms["keyed"]))


def lines(r: TokenCheckResult) -> list[str]:
    return [f"token check, alone (KeyRing.authenticate, median): token {r.authenticate_token_us}"
            f" us, key {r.authenticate_key_us} us",
            f"{r.calls} calls to each front, in turn (medians, ms):",
            f"  {'':<24} {'open':>8} {'open (2)':>9} {'with keys':>10} {'noise':>8} "
            f"{'added':>8}",
            f"  {'POST round trip':<24} {r.post_open_ms:>8.3f} {r.post_control_ms:>9.3f} "
            f"{r.post_keyed_ms:>10.3f} {r.post_control_ms - r.post_open_ms:>+8.3f} "
            f"{r.post_keyed_ms - r.post_open_ms:>+8.3f}",
            f"  {'front_ms (in the front)':<24} {r.front_open_ms:>8.3f} "
            f"{r.front_control_ms:>9.3f} {r.front_keyed_ms:>10.3f} {r.noise_ms:>+8.3f} "
            f"{r.added_ms:>+8.3f}"]


def add_parser(sub) -> None:
    p = sub.add_parser("tokencheck", help="what checking a call token adds to signaling",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("--calls", type=int, default=200,
                   help="calls through each front (default 200)")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.set_defaults(func=_main)


def _main(args) -> int:
    if not 5 <= args.calls <= 5000:
        raise UserError("--calls 5..5000")
    result = run(args.calls)
    print(json.dumps({**asdict(result), "added_ms": result.added_ms,
                      "noise_ms": result.noise_ms}) if args.json
          else "\n".join(lines(result)))
    return 0
