"""Arrival gaps of the caller's RTP at the transceiver: the gap record itself, the SRTP
shortcut that feeds it, and what ``session_closed`` reports for real aiortc callers."""
from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import pylibsrtp
from aiortc import RTCConfiguration, RTCPeerConnection, clock

from services.logs import Event
from services.gaps import GAP_MIN_MS, ArrivalGaps
from services.transceiver.inbound import SrtpShortcut
from services.transceiver.server import TransceiverConfig, TransceiverServer
from tests.conftest import lab_fixture, until
from tests.offers import STATIC_OFFER, offer_answer
from tests.test_transceiver_media import EDGE, ToneTrack
from topology.netns import in_namespace

lab = lab_fixture("vegaps")


def closed_events(caplog) -> dict[str, dict]:
    """``session_closed`` fields by session id."""
    return {r.msg.fields["session"]: r.msg.fields for r in caplog.records
            if isinstance(r.msg, Event) and r.msg.name == "session_closed"}


# ------------------------------------------------------------ the record

def test_gaps_of_60_ms_or_more_are_recorded_from_the_packet_before_them():
    gaps = ArrivalGaps()
    assert gaps.fields() == {"rx_gaps": [], "first_rx_unix": None, "last_rx_unix": None,
                             "rx_gaps_dropped": 0}
    t = 1_700_000_000.0
    gaps.arrived(t)
    for step in (0.02, 0.02, 0.055, 0.02, 0.3, 0.02, 0.0625, 0.02):
        t += step
        gaps.arrived(t)
    fields = gaps.fields()
    start = 1_700_000_000.0 + 0.02 + 0.02 + 0.055 + 0.02
    assert fields["rx_gaps"] == [[round(start, 3), 300.0],
                                 [round(start + 0.3 + 0.02, 3), 62.5]]
    assert fields["first_rx_unix"] == 1_700_000_000.0
    assert fields["last_rx_unix"] == round(t, 3)
    assert fields["rx_gaps_dropped"] == 0
    assert GAP_MIN_MS == 60.0


def test_gaps_beyond_the_cap_are_counted_and_a_clock_step_back_is_no_gap():
    gaps = ArrivalGaps(cap=2)
    t = 100.0
    gaps.arrived(t)
    for _ in range(5):
        t += 0.5
        gaps.arrived(t)
    gaps.arrived(t - 10.0)  # the wall clock was set back
    fields = gaps.fields()
    assert [ms for _, ms in fields["rx_gaps"]] == [500.0, 500.0]
    assert fields["rx_gaps_dropped"] == 3
    assert fields["first_rx_unix"] == 100.0 and fields["last_rx_unix"] == t - 10.0


# ------------------------------------------------------------ the shortcut feeds it

class FakeSrtp:
    def unprotect(self, data: bytes) -> bytes:
        if data.startswith(b"bad"):
            raise pylibsrtp.Error("authentication failed")
        return data


class FakeDtls:
    state = "connected"

    def __init__(self) -> None:
        self._rx_srtp = FakeSrtp()
        self.handled: list[tuple[bytes, int]] = []

    async def _handle_rtp_data(self, data: bytes, arrival_time_ms: int) -> None:
        self.handled.append((data, arrival_time_ms))


def test_the_shortcut_records_authentic_packets_and_keeps_aiortcs_arrival_clock():
    dtls = FakeDtls()
    shortcut = SrtpShortcut(dtls)
    before_unix, before_ms = time.time(), clock.current_ms()
    shortcut(b"good 1")
    shortcut(b"bad 2")  # failed authentication: not the caller's packet
    time.sleep(0.1)
    shortcut(b"good 3")
    after_ms = clock.current_ms()
    assert [d for d, _ in dtls.handled] == [b"good 1", b"good 3"]
    # aiortc's own arrival time: ms since the NTP epoch, from the same clock read
    assert all(before_ms - 1 <= ms <= after_ms + 1 for _, ms in dtls.handled)
    fields = shortcut.gaps.fields()
    [[start, ms]] = fields["rx_gaps"]
    assert 100.0 <= ms < 300.0 and start == fields["first_rx_unix"]
    assert before_unix - 0.001 <= fields["first_rx_unix"] <= fields["last_rx_unix"]
    assert shortcut.packets == 2


def test_a_session_that_never_connected_reports_no_arrivals(caplog):
    caplog.set_level(logging.INFO, "voiceedge.transceiver")

    async def scenario():
        cfg = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host="127.0.0.1",
                                control=("127.0.0.1", 0))
        async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{server.control_port}"
            async with http.post(f"{base}/sessions", data=STATIC_OFFER,
                                 headers={"Content-Type": "application/sdp"}) as r:
                assert r.status == 201
            async with http.get(f"{base}/status") as r:
                return (await r.json())["session_details"]

    [details] = asyncio.run(scenario())
    [closed] = closed_events(caplog).values()
    assert closed["reason"] == "transceiver stopping"
    for fields in (details, closed):
        assert fields["rx_gaps"] == [] and fields["rx_gaps_dropped"] == 0
        assert fields["first_rx_unix"] is None and fields["last_rx_unix"] is None


# ------------------------------------------------------------ real callers

PAUSE_AFTER = 50        # frames (1 s of audio), then the caller stops sending ...
PAUSE_GAP_S = 0.300     # ... so that this passes between two of its packets


class PausingToneTrack(ToneTrack):
    """The tone, with one pause: frame ``PAUSE_AFTER`` comes ``PAUSE_GAP_S`` after the one
    before it instead of 20 ms. Notes the wall clock of its first frame and of the resumption."""

    def __init__(self, pause: bool) -> None:
        super().__init__()
        self.pause = pause
        self.first_unix: float | None = None
        self.resumed_unix: float | None = None

    async def recv(self):
        pausing = self.pause and self._k == PAUSE_AFTER
        if pausing:
            self._start += PAUSE_GAP_S - 0.02  # this frame and the ones after it, that late
        frame = await super().recv()
        now = time.time()
        if pausing:
            self.resumed_unix = now
        if self.first_unix is None:
            self.first_unix = now
        return frame


def test_a_caller_pause_is_one_gap_and_a_steady_call_reports_its_arrivals(lab, caplog):
    """Two aiortc callers on one transceiver: one pauses for 300 ms after 1 s of audio and
    hangs up (its session closes on DTLS close), the other sends steadily until the
    transceiver stops (closed by stop, as on SIGTERM)."""
    caplog.set_level(logging.INFO, "voiceedge.transceiver")

    async def caller(http, url, pause: bool):
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        track = PausingToneTrack(pause)
        pc.addTrack(track)
        pc.createDataChannel("oai-events")
        offered = time.time()
        location, _ = await offer_answer(http, url, pc)
        return pc, track, offered, location.rsplit("/", 1)[1]

    async def scenario():
        cfg = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host=EDGE,
                                control=("127.0.0.1", 0))
        async with aiohttp.ClientSession() as http:
            async with TransceiverServer(cfg) as server:
                url = f"http://127.0.0.1:{server.control_port}/sessions"
                (pc_p, track_p, _, sid_p), (pc_s, track_s, offered_s, sid_s) = (
                    await asyncio.gather(caller(http, url, True), caller(http, url, False)))
                await until(lambda: track_p.resumed_unix is not None, 15)
                await asyncio.sleep(1.0)
                hung_up = time.time()
                await pc_p.close()
                await until(lambda: sid_p not in server.sessions, 10)
                steady_inline = server.sessions[sid_s]._srtp_shortcut.packets
                stopping = time.time()
            await pc_s.close()
        return (track_p, hung_up, sid_p), (track_s, offered_s, stopping, sid_s, steady_inline)

    paused, steady = in_namespace(lab.name, asyncio.run, scenario())
    closed = closed_events(caplog)

    track, hung_up, sid = paused
    p = closed[sid]
    assert p["reason"] == "connection closed" and p["rx_gaps_dropped"] == 0
    long = [gap for gap in p["rx_gaps"] if gap[1] >= 150.0]
    assert len(long) == 1, p["rx_gaps"]
    [[start, ms]] = long
    assert 250.0 <= ms <= 450.0, long
    assert abs(start + ms / 1000.0 - track.resumed_unix) < 0.1  # it ended as the caller resumed
    assert p["first_rx_unix"] < start < p["last_rx_unix"] <= hung_up + 0.05

    track, offered, stopping, sid, inline = steady
    s = closed[sid]
    assert s["reason"] == "transceiver stopping" and s["rx_gaps_dropped"] == 0
    assert all(ms < 250.0 for _, ms in s["rx_gaps"]), s["rx_gaps"]
    # The first packet the transceiver saw is the caller's first, or nearly (the shortcut
    # goes in when the session connects), and the last one came just before the stop.
    assert offered < track.first_unix <= s["first_rx_unix"] + 0.002
    assert s["first_rx_unix"] - track.first_unix < 0.1
    assert stopping - 0.2 < s["last_rx_unix"] <= stopping + 0.05
    assert s["srtp_inline"] >= inline >= 80
