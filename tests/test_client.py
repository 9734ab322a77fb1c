"""The measuring client against a real aiortc answering peer (an echo server in its own thread).

The echo peer follows the signaling contract (POST offer -> 201 + answer + Location, DELETE -> 204,
one candidate, full ICE), echoes audio back and data-channel events as agent.echo. It runs its own
event loop in a thread, so the client's asyncio.all_tasks() only ever holds client tasks.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from topology.netns import entered, lab_namespace
from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from services.client.config import ClientConfig
from services.client.runner import run_sessions
from services.client.seqstats import SeqTracker, extend_seq, loss_stats, unwrap
from services.client.session import CallSession, _first_after, ping_event, run_session
from services.gaps import GAP_MIN_MS, ArrivalGaps
from services.logs import Event
from tests.conftest import REPO, needs
from tests.logcheck import service_records
from voiceedge.errors import UserError

pytestmark = pytest.mark.shareable  # make test runs it beside another (pyproject)

CALL_S = 2.0
FAULT_AFTER_S = 1.0   # the echo peer's faults (EchoPeerServer)


# -- the answering peer --------------------------------------------------------------------------

class EchoTrack(MediaStreamTrack):
    """Sends back whatever audio frames the remote track delivers; with ``stall_after_s``,
    nothing more from that long after its first frame on (the connection stays up)."""

    kind = "audio"

    def __init__(self, source: MediaStreamTrack, stall_after_s: float | None = None) -> None:
        super().__init__()
        self._source = source
        self._stall_at: float | None = None
        self._stall_after_s = stall_after_s

    async def recv(self):
        if self._stall_after_s is not None:
            now = time.monotonic()
            if self._stall_at is None:
                self._stall_at = now + self._stall_after_s
            elif now >= self._stall_at:
                await asyncio.Future()  # until the peer connection closes (cancelled)
        return await self._source.recv()


def only_candidate(sdp: str, host: str, port: int | None) -> str:
    """Keep exactly one candidate (UDP on ``host``), optionally with its port rewritten."""
    out, kept = [], None
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            parts = line.split()
            if parts[2].lower() != "udp" or parts[4] != host:
                continue
            if port is not None:
                parts[5] = str(port)
                line = " ".join(parts)
            kept = line
        out.append(line)
    assert kept is not None, f"the answer has no UDP candidate on {host}"
    return "\r\n".join(out) + "\r\n"


def keep_one_socket(pc: RTCPeerConnection, host: str) -> None:
    """Close the answerer's ICE sockets on other addresses than ``host`` (test-only hook).

    A transceiver has one socket and advertises one candidate. A plain aiortc peer has a socket
    per host address, and its checks from the others would make the client select a
    peer-reflexive pair instead of the advertised candidate. Called right after
    setLocalDescription, before aiortc's connect task builds the check list.
    """
    for transceiver in pc.getTransceivers():
        connection = transceiver.receiver.transport.transport._connection
        for protocol in [p for p in connection._protocols if p.local_candidate.host != host]:
            connection._protocols.remove(protocol)
            protocol.transport.close()
        connection._local_candidates = [c for c in connection._local_candidates if c.host == host]


class EchoPeerServer:
    """Routes: POST /v1/calls (echo), /reject/v1/calls (400), /deaf/v1/calls (a dead candidate),
    /{stall,close,deaf}/{n}/{token}/v1/calls (faults).

    /deaf answers like /v1/calls, then closes its peer connection and rewrites the candidate's port
    to a closed one: the client can reach nothing, and no server check can reach the client.
    The fault routes echo like /v1/calls, but the first ``n`` calls to the same URL fail after
    ``FAULT_AFTER_S``: /stall stops sending audio (ICE, DTLS and the data channel stay up),
    /close closes the peer connection (the client gets a DTLS close_notify); /deaf answers with a
    dead candidate as /deaf/v1/calls does.
    """

    def __init__(self, media_host: str, closed_port: int) -> None:
        self.media_host = media_host
        self.closed_port = closed_port
        self.sessions: dict[str, RTCPeerConnection] = {}
        self.deleted: list[str] = []
        self.advertised: dict[str, str] = {}   # session id -> "host:port" of its one candidate
        self.offers: dict[str, str] = {}
        self.fault_calls: dict[str, int] = {}  # fault URL -> calls so far
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="echo-peer", daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def start(self) -> "EchoPeerServer":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def url(self, prefix: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{prefix}/v1/calls"

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/calls", self._post)
        app.router.add_post("/deaf/v1/calls", self._post)
        app.router.add_post("/raw/v1/calls", self._post)  # data-channel events echoed raw
        app.router.add_post("/reject/v1/calls", self._reject)
        app.router.add_post("/{fault:stall|close|deaf}/{n:[0-9]+}/{token}/v1/calls",
                            self._post)
        app.router.add_delete("/v1/calls/{sid}", self._delete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        for pc in list(self.sessions.values()):
            await pc.close()
        self.sessions.clear()
        await self._runner.cleanup()

    async def _reject(self, request: web.Request) -> web.Response:
        return web.Response(status=400, text="offer has no audio m-line\n")

    async def _post(self, request: web.Request) -> web.Response:
        if request.content_type != "application/sdp":
            return web.Response(status=415, text="expected application/sdp")
        offer = RTCSessionDescription(sdp=await request.text(), type="offer")
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        sid = uuid.uuid4().hex
        self.sessions[sid] = pc
        self.offers[sid] = offer.sdp
        fault = request.match_info.get("fault")
        if fault is not None:
            self.fault_calls[request.path] = calls = self.fault_calls.get(request.path, 0) + 1
            if calls > int(request.match_info["n"]):
                fault = None
        if fault == "close":
            self.loop.call_later(FAULT_AFTER_S, lambda: asyncio.ensure_future(pc.close()))

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                pc.addTrack(EchoTrack(track, FAULT_AFTER_S if fault == "stall" else None))

        @pc.on("datachannel")
        def on_datachannel(channel) -> None:
            channel.send(json.dumps({"type": "session.created"}))

            @channel.on("message")
            def on_message(message) -> None:
                if request.path == "/raw/v1/calls":  # an edge without the agent's envelope
                    channel.send(message)
                else:
                    channel.send(json.dumps({"type": "agent.echo",
                                             "event": json.loads(message)}))

        await pc.setRemoteDescription(offer)
        await pc.setLocalDescription(await pc.createAnswer())
        keep_one_socket(pc, self.media_host)
        port = None
        if request.path == "/deaf/v1/calls" or fault == "deaf":
            await pc.close()
            port = self.closed_port
        answer = only_candidate(pc.localDescription.sdp, self.media_host, port)
        self.advertised[sid] = re.search(r"^a=candidate:\S+ \S+ \S+ \S+ (\S+ \d+)", answer,
                                         re.M).group(1).replace(" ", ":")
        return web.Response(status=201, text=answer, content_type="application/sdp",
                            headers={"Location": f"/v1/calls/{sid}"})

    async def _delete(self, request: web.Request) -> web.Response:
        pc = self.sessions.pop(request.match_info["sid"], None)
        if pc is None:
            return web.Response(status=404, text="no such session")
        self.deleted.append(request.match_info["sid"])
        await pc.close()
        return web.Response(status=204)


def closed_udp_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
@needs("netns")
def media_host():
    """A veth address in a lab namespace the tests run in (aioice skips 127.0.0.1, and no
    traffic may touch the machine's own interfaces)."""
    with lab_namespace("veclient") as ns, entered(ns.name):
        yield ns.addresses[0]


@pytest.fixture(scope="module")
def echo_peer(media_host):
    server = EchoPeerServer(media_host, closed_udp_port(media_host)).start()
    yield server
    server.stop()


def config(url: str, **kw) -> ClientConfig:
    return ClientConfig(url=url, **{"duration_s": CALL_S, "setup_timeout_s": 5.0, **kw})


# -- one session ---------------------------------------------------------------------------------


def test_a_renomination_is_timed_by_the_first_packet_after_the_silence():
    """The media came back (1.8 s) before the renomination's check was answered (its
    retransmission, 2.3 s): the return is the first packet after the silence, not the latest
    one when the answer came (a run timed port-per-session renominations 750 ms so)."""
    from services.gaps import ArrivalGaps
    gaps = ArrivalGaps(unix_offset=1000.0)
    for k in range(51):
        gaps.arrived(k * 0.02)                          # to 1.0 s, then silence
    for k in range(26):
        gaps.arrived(1.8 + k * 0.02)                    # back at 1.8 s, to 2.3 s
    assert _first_after(gaps, 1.0) == pytest.approx(1001.8)
    assert _first_after(gaps, None) == pytest.approx(1002.3)   # no silence known: the latest

def test_one_session_measures_the_timeline_and_verifies_echo(echo_peer):
    result = asyncio.run(run_session(config(echo_peer.url()), index=7))

    assert result.ok, result.error
    assert result.error is None and result.stage == "done"
    assert 0 < result.offer_ms
    assert 0 < result.signaling_ms
    assert result.offer_ms + result.signaling_ms <= result.ice_connected_ms
    assert result.ice_connected_ms <= result.setup_ms <= result.first_audio_ms
    assert result.setup_ms < 2000, "DTLS on one machine takes tens of ms"
    assert 0 < result.first_ice_rtt_ms < 100
    sid = result.session_url.rsplit("/", 1)[1]
    assert result.ice_pair.split(" -> ")[1] == echo_peer.advertised[sid]
    offer = echo_peer.offers[sid]
    assert re.search(r"^a=group:BUNDLE 0 1\r?$", offer, re.M)
    assert re.findall(r"^m=(\w+)", offer, re.M) == ["audio", "application"]
    assert "a=sendrecv" in offer and "opus/48000/2" in offer and "PCMU" not in offer
    assert len(set(re.findall(r"^a=ice-ufrag:(\S+)", offer, re.M))) == 1
    assert "a=end-of-candidates" in offer and f" {echo_peer.media_host} " in offer
    assert result.client == "full"
    assert result.echo_verified and result.echo_rms > 0.05
    assert result.echo_voiced_pct > 80    # measured for every kind; decides for light ones
    assert result.datachannel_verified
    assert result.events[:1] == ["session.created"] and "agent.echo" in result.events
    # about 50 packets per second come back (minus the echo's start-up)
    assert result.packets_received > 0.6 * 50 * CALL_S
    assert result.packets_lost == 0 and result.loss_pct == 0 and result.loss_bursts == []
    assert result.jitter_ms is not None and 0 <= result.jitter_ms < 50
    assert result.http_status == 201 and result.delete_status == 204
    assert result.session_url.startswith(echo_peer.url() + "/")
    assert sid in echo_peer.deleted
    assert len(result.samples) >= int(CALL_S)
    assert all(s.session == 7 for s in result.samples)
    counts = [s.packets_received for s in result.samples]
    assert counts == sorted(counts) and counts[-1] == result.packets_received
    assert result.samples[-1].t_ms >= result.setup_ms + CALL_S * 1000

    line = result.to_json()
    assert "\n" not in line and json.loads(line)["first_ice_rtt_ms"] == result.first_ice_rtt_ms


@pytest.mark.netns
def test_a_raw_data_channel_echo_verifies_only_where_the_envelope_is_not_asked_for(echo_peer):
    async def both():
        return await asyncio.gather(
            run_session(config(echo_peer.url("/raw")), 0),
            run_session(config(echo_peer.url("/raw"), verifies=("audio", "datachannel")), 1),
            run_session(config(echo_peer.url()), 2))

    default, raw_ok, envelope = asyncio.run(both())
    assert default.ok and raw_ok.ok and envelope.ok
    # today's rule (the project's edge): only the envelope counts
    assert default.datachannel_echo == "raw" and not default.datachannel_verified
    assert default.verifies == ["audio", "datachannel", "envelope"]
    assert default.verified == ["audio"] and not default.fully_verified
    # an architecture that declares a raw echo enough
    assert raw_ok.datachannel_echo == "raw" and raw_ok.datachannel_verified
    assert raw_ok.verifies == raw_ok.verified == ["audio", "datachannel"]
    assert raw_ok.fully_verified
    assert envelope.datachannel_echo == "envelope" and envelope.fully_verified
    assert envelope.verified == ["audio", "datachannel", "envelope"]
    line = json.loads(raw_ok.to_json(with_samples=False))
    assert (line["verifies"], line["verified"], line["datachannel_echo"]) == (
        ["audio", "datachannel"], ["audio", "datachannel"], "raw")


def test_without_echo_the_echo_is_not_verified(echo_peer):
    """The echo check can fail: a threshold above the tone's level is not met."""
    result = asyncio.run(run_session(config(echo_peer.url(), duration_s=1.0, echo_min_rms=0.9)))
    assert result.ok and result.echo_rms is not None and not result.echo_verified


def test_rtt_from_rtcp_during_a_longer_call(echo_peer):
    result = asyncio.run(run_session(config(echo_peer.url(), duration_s=4.0)))
    assert result.ok, result.error
    assert result.rtt_ms is not None and 0 < result.rtt_ms < 100
    assert any(s.rtt_ms is not None for s in result.samples)


@pytest.mark.parametrize("kind", ["full", "light"])
def test_no_task_or_thread_outlives_its_session(echo_peer, kind):
    async def main():
        before = asyncio.all_tasks()
        ok = await run_session(config(echo_peer.url(), duration_s=1.0), kind=kind)
        failed = await run_session(config(echo_peer.url("/deaf"), setup_timeout_s=1.0),
                                   kind=kind)
        return ok, failed, asyncio.all_tasks() - before

    threads = set(threading.enumerate())
    ok, failed, left = asyncio.run(main())
    assert ok.ok and not failed.ok and ok.client == failed.client == kind
    assert left == set(), [t.get_coro() for t in left]
    assert not [t.name for t in set(threading.enumerate()) - threads if t.name.endswith("decoder")]


# -- reconnection --------------------------------------------------------------------------------

def fault_url(peer: EchoPeerServer, fault: str, n: int) -> str:
    """A URL whose first ``n`` calls fail ``fault`` (stall, close) after FAULT_AFTER_S."""
    return peer.url(f"/{fault}/{n}/{uuid.uuid4().hex[:8]}")


def test_a_plain_call_makes_one_attempt_and_records_its_arrivals(echo_peer):
    r = asyncio.run(run_session(config(echo_peer.url())))
    assert r.ok, r.error
    assert r.reconnections == 0 and len(r.attempts) == 1
    a = r.attempts[0]
    assert (a["attempt"], a["reason"], a["error"]) == (0, "first", None)
    assert a["location"] == r.session_url
    assert r.started_unix <= a["started_unix"] < a["connected_unix"] < r.ended_unix
    assert r.cluster is None and r.transceiver is None  # the echo peer names none
    assert r.started_unix < r.first_rx_unix < r.last_rx_unix <= r.ended_unix
    assert r.last_rx_unix - r.first_rx_unix > 0.8 * CALL_S
    assert all(g[2] == 0 and g[1] >= GAP_MIN_MS for g in r.rx_gaps)  # gaps allowed: slow host
    d = json.loads(r.to_json(with_samples=False))
    assert d["attempts"] == r.attempts and d["rx_gaps"] == r.rx_gaps


def test_a_stalled_stream_is_a_lost_connection_and_the_call_goes_on(echo_peer):
    """The server stops sending audio (ICE and DTLS stay up): the watchdog calls again."""
    cfg = config(fault_url(echo_peer, "stall", 1), duration_s=5.0)
    r = asyncio.run(run_session(cfg, index=4))
    assert r.ok, r.error
    assert r.reconnections == 1 and [a["attempt"] for a in r.attempts] == [0, 1]
    first, second = r.attempts
    assert first["error"] == "media timeout" and second["reason"] == "media timeout"
    assert second["error"] is None and second["connected_unix"] is not None
    assert first["location"] != second["location"]
    assert second["location"].rsplit("/", 1)[1] in echo_peer.deleted  # the old one DELETEd too
    assert first["location"].rsplit("/", 1)[1] in echo_peer.deleted
    # The gap across the reconnection: the old connection's last packet -> the new one's first
    # (it starts before the new connection is up; a later gap inside the new connection, as a
    # busy host makes now and then, is not this one).
    across = [g for g in r.rx_gaps if g[2] == 1 and g[0] < second["connected_unix"]]
    assert len(across) == 1 and across[0][1] >= cfg.media_timeout_s * 1000, r.rx_gaps
    assert r.first_rx_unix < across[0][0] < second["connected_unix"] < r.last_rx_unix
    # The call keeps its end: first connected + duration_s.
    assert r.call_ms == pytest.approx(cfg.duration_s * 1000, abs=300)
    assert r.echo_verified and r.datachannel_verified
    assert r.packets_lost == 0 and r.packets_expected == r.packets_received
    assert r.samples[-1].packets_received == r.packets_received
    assert r.setup_ms < r.first_audio_ms < FAULT_AFTER_S * 1000 + r.setup_ms


def test_a_closed_connection_calls_again_at_once(echo_peer):
    t0 = time.monotonic()
    r = asyncio.run(run_session(config(fault_url(echo_peer, "close", 1), duration_s=3.0)))
    assert r.ok, r.error
    assert r.reconnections == 1
    assert r.attempts[0]["error"] == r.attempts[1]["reason"] == "connection closed"
    # no media timeout to wait for: the next call starts as soon as DTLS says so
    assert r.attempts[1]["started_unix"] - r.attempts[0]["connected_unix"] < FAULT_AFTER_S + 0.5
    assert time.monotonic() - t0 < 3.0 + 3.0


def test_reconnection_is_bounded_and_a_lost_call_fails(echo_peer):
    """Every call to the URL stalls: the first failure and two more, then the call is lost."""
    cfg = config(fault_url(echo_peer, "stall", 99), duration_s=20.0, media_timeout_s=0.5,
                 reconnect_attempts=2, reconnect_backoff_s=(0.0, 0.2))
    t0 = time.monotonic()
    r = asyncio.run(run_session(cfg))
    elapsed = time.monotonic() - t0
    assert not r.ok and r.stage == "call"
    assert r.error == "lost after 2 reconnection attempts: media timeout"
    assert r.reconnections == 2 and len(r.attempts) == 3
    assert [a["reason"] for a in r.attempts] == ["first", "media timeout", "media timeout"]
    assert all(a["error"] == "media timeout" and a["connected_unix"] for a in r.attempts)
    starts = [a["started_unix"] for a in r.attempts]
    assert starts == sorted(starts)
    assert elapsed < 10, "lost long before the call's end, not at it"
    assert {g[2] for g in r.rx_gaps if g[1] >= 500} == {1, 2}
    assert r.delete_status == 204  # the last attempt's session, DELETEd in the background


def test_no_reconnection_when_disabled(echo_peer):
    r = asyncio.run(run_session(config(fault_url(echo_peer, "close", 1), duration_s=3.0,
                                       reconnect_attempts=0)))
    assert not r.ok and r.error == "lost after 0 reconnection attempts: connection closed"
    assert r.reconnections == 0 and len(r.attempts) == 1
    assert r.attempts[0]["error"] == "connection closed"


def test_with_retry_setup_an_answered_setup_that_never_connects_is_called_again(echo_peer):
    """A server that dies between its answer and the media (a cluster outage during the
    setup): with retry_setup the client calls again like a failed connection, and the call
    lasts its duration from the connection that worked."""
    url = fault_url(echo_peer, "deaf", 1)
    r = asyncio.run(run_session(config(url, setup_timeout_s=1.0, duration_s=2.0,
                                       retry_setup=True)))
    assert r.ok, r.error
    assert r.reconnections == 1 and r.setup_ms is None  # the first setup never connected
    assert [(a["attempt"], a["reason"], a["error"]) for a in r.attempts] == [
        (0, "first", "setup timeout"), (1, "setup timeout", None)]
    second = r.attempts[1]
    assert second["connected_unix"] is not None
    assert r.ended_unix - second["connected_unix"] >= 2.0
    assert r.packets_received > 50  # about 2 s of audio on the second connection
    # without it the same fault is a failed session (next test): retry_setup is what differs
    r = asyncio.run(run_session(config(fault_url(echo_peer, "deaf", 1), setup_timeout_s=1.0)))
    assert not r.ok and r.error == "setup timeout" and r.reconnections == 0


def test_a_failed_first_setup_is_not_retried(echo_peer):
    r = asyncio.run(run_session(config(echo_peer.url("/deaf"), setup_timeout_s=1.0)))
    assert not r.ok and r.error == "setup timeout" and r.stage == "connect"
    assert r.reconnections == 0
    assert [(a["attempt"], a["error"], a["connected_unix"]) for a in r.attempts] == [
        (0, "setup timeout", None)]


def test_a_stalled_client_loop_is_not_a_lost_connection(echo_peer):
    """The client's own event loop stalls for longer than the media timeout (a saturated
    host): when it wakes, the watchdog's timer is overdue, but it looks a second time, after
    what the loop has queued, before it calls the connection dead. (Without the second look
    this session reconnects.)"""
    async def main():
        session = CallSession(config(echo_peer.url(), duration_s=4.0))
        call = asyncio.create_task(session.run())
        # once media flows (a fixed 2 s wait stalled a slow setup on a loaded machine before
        # the first packet: no gap to see then)
        deadline = time.monotonic() + 10
        while not session.receiving and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        time.sleep(2.0)   # blocks the loop: no packet is handled, no timer fires
        return await call

    r = asyncio.run(main())
    assert r.ok, r.error
    assert r.reconnections == 0, r.attempts
    assert max(g[1] for g in r.rx_gaps) >= 2000  # the stall is a gap all the same


@pytest.mark.parametrize("kind", ["full", "light"])
def test_nothing_outlives_a_reconnecting_session_also_when_cancelled(echo_peer, kind):
    async def main():
        before = asyncio.all_tasks()
        reconnected = await run_session(config(fault_url(echo_peer, "close", 1)), kind=kind)
        # cancelled while it is between attempts or calling again
        task = asyncio.create_task(run_session(config(
            fault_url(echo_peer, "close", 99), duration_s=20.0, reconnect_attempts=10,
            reconnect_backoff_s=(0.3,)), kind=kind))
        await asyncio.sleep(FAULT_AFTER_S + 1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return reconnected, asyncio.all_tasks() - before

    threads = set(threading.enumerate())
    reconnected, left = asyncio.run(main())
    assert reconnected.ok and reconnected.reconnections == 1, reconnected.error
    assert left == set(), [t.get_coro() for t in left]
    assert not [t.name for t in set(threading.enumerate()) - threads if t.name.endswith("decoder")]


# -- many sessions -------------------------------------------------------------------------------

def test_three_concurrent_sessions_with_a_start_rate(echo_peer, tmp_path):
    results_file, samples_file = tmp_path / "sessions.jsonl", tmp_path / "samples.jsonl"
    cfg = config(echo_peer.url(), start_rate=5.0)
    t0 = time.monotonic()
    results = asyncio.run(run_sessions(cfg, 3, results_path=results_file,
                                       samples_path=samples_file))
    elapsed = time.monotonic() - t0

    assert [r.index for r in results] == [0, 1, 2]
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(r.echo_verified and r.datachannel_verified for r in results)
    starts = [r.started_unix for r in results]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert all(0.15 <= g <= 0.45 for g in gaps), gaps          # 5 sessions/s
    assert elapsed < 2 * CALL_S, "sessions ran one after another, not concurrently"

    lines = [json.loads(x) for x in results_file.read_text().splitlines()]
    assert sorted(x["index"] for x in lines) == [0, 1, 2]
    assert all("samples" not in x and x["ok"] for x in lines)
    samples = [json.loads(x) for x in samples_file.read_text().splitlines()]
    assert {s["session"] for s in samples} == {0, 1, 2}
    assert len(samples) == sum(len(r.samples) for r in results)


def test_sessions_start_on_the_clock_they_are_given(echo_peer):
    """--start-at: session 0 is due at the given wall-clock time, the next 1/rate later."""
    due = time.time() + 0.8
    cfg = config(echo_peer.url(), start_rate=5.0, duration_s=0.5, start_at_unix=due)
    results = asyncio.run(run_sessions(cfg, 2))
    assert all(r.ok for r in results), [r.error for r in results]
    first, second = (r.started_unix for r in results)
    assert due <= first < due + 0.15
    assert 0.15 <= second - first <= 0.45


def test_a_phase_starts_every_session_that_share_of_the_spacing_later(echo_peer):
    """--phase 0.5 at 2 sessions/s: session 0 at the given time + 0.25 s, session 1 at + 0.75
    (a client process of another region set up its calls between this one's)."""
    due = time.time() + 0.8
    cfg = config(echo_peer.url(), start_rate=2.0, duration_s=0.5, start_at_unix=due, phase=0.5)
    results = asyncio.run(run_sessions(cfg, 2))
    assert all(r.ok for r in results), [r.error for r in results]
    first, second = (r.started_unix - due for r in results)
    assert 0.25 <= first < 0.45 and 0.75 <= second < 0.95


def test_a_client_up_after_its_start_time_starts_at_once_and_says_how_late(echo_peer, caplog):
    due = time.time() - 2.0
    cfg = config(echo_peer.url(), duration_s=0.5, start_at_unix=due)
    with caplog.at_level(logging.INFO, logger="voiceedge.client"):
        t0 = time.time()
        [result] = asyncio.run(run_sessions(cfg, 1))
    assert result.ok and result.started_unix - t0 < 0.5
    [late] = [r.msg for r in caplog.records
              if isinstance(r.msg, Event) and r.msg.name == "calls_late"]
    assert late.fields["due_unix"] == due and 2.0 <= late.fields["late_s"] < 3.0


def test_sessions_wait_for_the_start_file_and_start_on_its_time(echo_peer, tmp_path):
    """--start-file: a client that is up waits until the run writes its first call's time."""
    start_file = tmp_path / "calls-start"
    cfg = config(echo_peer.url(), start_rate=5.0, duration_s=0.5, start_file=str(start_file))

    async def main():
        run = asyncio.create_task(run_sessions(cfg, 1))
        await asyncio.sleep(1.0)
        assert not run.done()                     # up, and waiting: no call yet
        due = time.time() + 0.3
        start_file.write_text(f"{due:.6f}")
        return due, await run

    due, [result] = asyncio.run(main())
    assert result.ok, result.error
    assert due <= result.started_unix < due + 0.15


def test_a_start_file_that_never_comes_or_holds_no_time_is_an_error(tmp_path):
    from services.client.runner import StartFileError, start_time_from

    with pytest.raises(StartFileError, match="no start time in .* after 0.2 s"):
        asyncio.run(start_time_from(tmp_path / "never", timeout=0.2))
    (tmp_path / "bad").write_text("soon")
    with pytest.raises(StartFileError, match="does not hold a Unix time"):
        asyncio.run(start_time_from(tmp_path / "bad"))
    with pytest.raises(ValueError, match="not both"):
        ClientConfig(url="http://10.0.0.1/v1/calls", start_at_unix=time.time(),
                     start_file=str(tmp_path / "x"))


def test_a_start_time_must_be_a_unix_time():
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="start_at_unix"):
            ClientConfig(url="http://10.0.0.1/v1/calls", start_at_unix=bad)


def test_a_failed_session_does_not_affect_others(echo_peer, tmp_path):
    cfg = config(echo_peer.url(), start_rate=20.0, duration_s=1.0)
    sessions = {0: cfg, 1: config(echo_peer.url("/reject")), 2: cfg}

    async def main():
        from services.client.session import CallSession
        return await asyncio.gather(*(CallSession(c, i).run() for i, c in sessions.items()))

    ok0, bad, ok2 = asyncio.run(main())
    assert ok0.ok and ok2.ok and not bad.ok


def test_concurrency_limit_serializes_sessions(echo_peer):
    cfg = config(echo_peer.url(), start_rate=50.0, duration_s=0.5, concurrency=1)
    results = asyncio.run(run_sessions(cfg, 2))
    assert all(r.ok for r in results), [r.error for r in results]
    first_end = results[0].started_unix + (results[0].setup_ms + results[0].call_ms) / 1000
    assert results[1].started_unix >= first_end


# -- failures ------------------------------------------------------------------------------------

def test_server_rejecting_the_offer_is_a_failed_session_with_its_reason(echo_peer):
    result = asyncio.run(run_session(config(echo_peer.url("/reject"))))
    assert not result.ok
    assert result.error == "HTTP 400: offer has no audio m-line"
    assert result.stage == "signaling" and result.http_status is None
    assert result.setup_ms is None and result.first_audio_ms is None


def test_unreachable_signaling_url_fails_with_a_clear_reason():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # closed again below: nothing listens there
    result = asyncio.run(run_session(config(f"http://127.0.0.1:{port}/v1/calls")))
    assert not result.ok
    assert result.error == f"cannot connect to 127.0.0.1:{port}: Connection refused"
    assert result.stage == "signaling"


def test_the_client_process_logs_json_lines_and_prints_its_summary():
    """``voiceedge client`` as a process: stderr is JSON lines only, stdout the summary."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # closed again below: nothing listens there
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "client", "--url",
                           f"http://127.0.0.1:{port}/v1/calls"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 1
    records = service_records(proc.stderr, "client")
    lag = [r for r in records if r["event"].startswith("loop_lag")]
    assert [r["event"] for r in lag][-1:] == ["loop_lag_summary"]  # the client watched itself
    records = [r for r in records if r not in lag]
    # the one-time costs (the tone, aiortc's first peer connection) before the first call
    assert [r["event"] for r in records] == ["client_started", "client_warm_up",
                                             "session_finished", "client_finished"]
    started, warm, finished, done = records
    assert warm["ms"] > 0
    assert started["url"] == f"http://127.0.0.1:{port}/v1/calls" and started["sessions"] == 1
    assert finished["level"] == "WARNING" and finished["ok"] is False
    assert finished["stage"] == "signaling" and "Connection refused" in finished["error"]
    assert (done["sessions"], done["ok"]) == (1, 0)
    assert "0/1 sessions ok" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "client", "--url",
                           f"http://127.0.0.1:{port}/v1/calls", "-n", "2", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    summary = json.loads(proc.stdout)  # stdout is the JSON summary and nothing else
    assert proc.returncode == 1 and (summary["sessions"], summary["ok"]) == (2, 0)
    assert summary["failures"] == {f"cannot connect to 127.0.0.1:{port}: Connection refused": 2}


def test_setup_timeout_when_the_answer_candidate_is_unreachable(echo_peer):
    t0 = time.monotonic()
    result = asyncio.run(run_session(config(echo_peer.url("/deaf"), setup_timeout_s=1.5)))
    elapsed = time.monotonic() - t0

    assert not result.ok and result.error == "setup timeout"
    assert result.stage == "connect"
    assert result.signaling_ms is not None and result.ice_connected_ms is None
    assert 1.5 <= elapsed < 1.5 + 0.5
    assert result.delete_status == 204    # the server's session was ended all the same


def test_config_rejects_nonsense():
    with pytest.raises(ValueError):
        ClientConfig(url="ftp://x/")
    with pytest.raises(ValueError):
        ClientConfig(url="http://x/", start_rate=0)
    for bad in ({"media_timeout_s": 0}, {"reconnect_attempts": -1},
                {"reconnect_attempts": 1.5}, {"reconnect_backoff_s": ()},
                {"reconnect_backoff_s": (0.0, -1.0)}):
        with pytest.raises(ValueError):
            ClientConfig(url="http://x/", **bad)
    cfg = ClientConfig(url="http://x/", reconnect_backoff_s=(0.0, 0.5))
    assert [cfg.backoff_s(k) for k in range(4)] == [0.0, 0.5, 0.5, 0.5]
    assert (cfg.media_timeout_s, cfg.reconnect_attempts) == (1.5, 3)


# -- pure parts ----------------------------------------------------------------------------------

def test_gap_tracker_records_long_gaps_on_the_wall_clock():
    g = ArrivalGaps(unix_offset=1000.0)
    assert (g.first, g.last, g.listed(), g.count) == (None, None, [], 0)
    for t in (10.0, 10.02, 10.04, 10.0999, 10.16):   # 59.9 ms: not a gap; 60.1 ms: a gap
        g.arrived(t)
    assert g.listed() == [[1010.0999, 60.1, 0]]
    g.attempt = 2                                      # a new connection's packets
    g.arrived(12.0)
    g.arrived(12.02)
    assert g.listed()[-1] == [1010.16, 1840.0, 2]      # starts at the last packet before it
    assert (g.first, g.last) == (10.0, 12.02)
    assert (g.unix(g.first), g.unix(None)) == (1010.0, None)


def test_gap_tracker_threshold_is_inclusive_and_the_list_capped():
    assert GAP_MIN_MS == 60.0   # the one threshold: the client's and the transceiver's
    g = ArrivalGaps(min_ms=GAP_MIN_MS, cap=2)
    for i in range(5):
        g.arrived(i * 0.12)                            # every gap is 120 ms
    assert len(g.listed()) == 2 and g.dropped == 2 and g.count == 4
    g = ArrivalGaps(min_ms=100.0)
    g.arrived(1.0)
    g.arrived(1.1)
    assert [x[1] for x in g.listed()] == [pytest.approx(100.0)]
    assert ArrivalGaps.monotonic().unix_offset == pytest.approx(time.time() - time.monotonic(),
                                                               abs=0.1)
    with pytest.raises(ValueError):
        ArrivalGaps(min_ms=0)


@pytest.mark.parametrize("seqs, expected, received, bursts", [
    ([], 0, 0, ()),
    ([5], 1, 1, ()),
    ([1, 2, 3, 4], 4, 4, ()),
    ([1, 2, 5, 6, 10], 10, 5, (2, 3)),
    ([1, 3, 2, 4], 4, 4, ()),                        # reordered: no loss
    ([1, 2, 2, 3], 3, 3, ()),                        # duplicate counts once
    ([1, 3, 5, 4], 5, 4, (1,)),                      # late 4 fills its gap, 2 stays lost
    ([65533, 65534, 65535, 0, 1], 5, 5, ()),         # wrap-around, nothing lost
    ([65533, 65535, 2, 3], 7, 4, (1, 2)),            # loss on both sides of the wrap
    ([65534, 1, 65535, 0, 2], 5, 5, ()),             # reordered across the wrap
    ([10, 9, 11], 2, 2, ()),                         # before the first packet: not counted
])
def test_loss_stats(seqs, expected, received, bursts):
    stats = loss_stats(seqs)
    assert (stats.expected, stats.received, stats.bursts) == (expected, received, bursts)
    assert stats.lost == sum(bursts)

    tracker = SeqTracker()
    for s in seqs:
        tracker.add(s)
    assert tracker.lost == stats.lost


def test_loss_stats_over_several_wraps():
    seqs = [(40000 + i) % 65536 for i in range(200_000) if i % 1000 not in (7, 8, 9)]
    stats = loss_stats(seqs)
    assert stats.bursts == (3,) * 200
    assert stats.expected == 200_000 and stats.lost == 600
    assert stats.loss_pct == pytest.approx(0.3)


def test_unwrap_and_extend():
    assert unwrap([65535, 0, 1]) == [65535, 65536, 65537]
    assert unwrap([0, 65535]) == [0, -1]
    assert extend_seq(3, 65530) == 65539
    assert extend_seq(65530, 65539) == 65530


def test_aiortc_reports_jitter_in_rtp_units(monkeypatch):
    """Pins the unit behind RTP_UNITS_PER_MS: packets alternately 0 and 10 ms late converge to an
    RFC 3550 jitter of 10 ms, which aiortc 1.16 reports as 480 (48 kHz RTP units)."""
    import types
    from aiortc import rtcrtpreceiver
    from aiortc.rtp import RtpPacket
    from services.client.session import RTP_UNITS_PER_MS

    clock = [1000.0]
    monkeypatch.setattr(rtcrtpreceiver, "time", types.SimpleNamespace(time=lambda: clock[0]))
    stream = rtcrtpreceiver.StreamStatistics(48_000)
    for i in range(400):
        clock[0] = 1000.0 + i * 0.020 + (0.010 if i % 2 else 0.0)
        stream.add(RtpPacket(sequence_number=i, timestamp=i * 960))
    assert stream.jitter / RTP_UNITS_PER_MS == pytest.approx(10.0, abs=0.1)


def test_ping_event_shape():
    assert ping_event(3) == {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "ping 3"}]}}
    assert re.fullmatch(r"ping \d+", ping_event(12)["item"]["content"][0]["text"])


# -- command line --------------------------------------------------------------------------------

def parse_cli(*argv: str):
    import argparse
    from services.client import cli
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["client", *argv])


def logged(caplog, name: str) -> list[dict]:
    """Fields of the ``name`` events the client logged (services/logs.py)."""
    return [r.msg.fields for r in caplog.records
            if isinstance(r.msg, Event) and r.msg.name == name]


def test_cli_runs_sessions_and_writes_results(echo_peer, tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, "voiceedge.client")
    results = tmp_path / "r.jsonl"
    args = parse_cli("--url", echo_peer.url(), "-n", "2", "--rate", "20", "--duration", "0.5",
                     "--results", str(results), "--header", "X-Test: 1")
    assert args.func(args) == 0
    assert len(results.read_text().splitlines()) == 2
    out = capsys.readouterr()
    assert "2/2 sessions ok (2 full, 0 light)" in out.out and "setup_ms" in out.out
    assert out.err == ""  # logs go through logging: JSON lines on stderr in `voiceedge client`
    finished = logged(caplog, "session_finished")
    assert sorted(f["session"] for f in finished) == [0, 1]
    assert all(f["ok"] and f["setup_ms"] > 0 and f["echo_verified"] for f in finished)
    assert logged(caplog, "client_started")[0]["sessions"] == 2
    assert logged(caplog, "client_finished") == [{"sessions": 2, "ok": 2}]


def test_cli_full_clients_and_the_rest_light(echo_peer, tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    args = parse_cli("--url", echo_peer.url(), "-n", "3", "--rate", "20", "--duration", "1",
                     "--full-clients", "1", "--results", str(results), "-q", "--json")
    assert args.func(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["clients"] == {"full": 1, "light": 2} and summary["unverified"] == 0
    lines = sorted((json.loads(x) for x in results.read_text().splitlines()),
                   key=lambda x: x["index"])
    assert [x["client"] for x in lines] == ["full", "light", "light"]
    assert [x["echo_rms"] is None for x in lines] == [False, True, True]


def test_cli_failures_and_user_errors(echo_peer, capsys, caplog):
    caplog.set_level(logging.INFO, "voiceedge.client")
    args = parse_cli("--url", echo_peer.url("/reject"), "-q")
    assert args.func(args) == 1
    assert "failed x1: HTTP 400: offer has no audio m-line" in capsys.readouterr().out
    assert logged(caplog, "session_finished") == []  # -q: no line per session
    assert logged(caplog, "client_finished") == [{"sessions": 1, "ok": 0}]
    args = parse_cli("--url", "http://x/", "--media-timeout", "0.5", "--reconnect-attempts", "0")
    from services.client.cli import config_from_args
    cfg = config_from_args(args)
    assert (cfg.media_timeout_s, cfg.reconnect_attempts) == (0.5, 0)
    for bad in (["--url", "ftp://x"], ["--url", "http://x/", "--rate", "0"],
                ["--url", "http://x/", "--media-timeout", "0"],
                ["--url", "http://x/", "--reconnect-attempts", "-1"],
                ["--url", "http://x/", "--header", "nocolon"], ["--url", "http://x/", "-n", "0"],
                ["--url", "http://x/", "--verify", "audio,video"],
                ["--url", "http://x/", "--index-base", "-1"]):
        args = parse_cli(*bad)
        with pytest.raises(UserError):
            args.func(args)
    cfg = config_from_args(parse_cli("--url", "http://x/", "--verify", "envelope,audio"))
    assert cfg.verifies == ("audio", "datachannel", "envelope")
