"""An ICE restart of a live call (RFC 8445 section 9): the client's PATCH of its session with a
new ice-ufrag, ice-pwd and candidates (services/client/restart.py), the transceiver's answer
with a new routing ufrag of its own (services/transceiver/session.py), new checks; the same
session, the same DTLS association, the media on throughout, in both modes and on both media
paths. Loopback only."""
from __future__ import annotations

import asyncio
import os
import signal
import socket

import aiohttp
import pytest

from services.client.restart import restart_ice
from services.signaling.server import ClusterRoute, SignalingConfig, SignalingServer
from services.transceiver import ice
from services.transceiver.server import TransceiverConfig, TransceiverServer
from services.wire.sdpfrag import CONTENT_TYPE
from services.wire.stun import binding_request
from services.wire.ufrag import DEV_SECRET, UfragCodec
from tests.conftest import free_port, until
from tests.test_transceiver_move import connected_call


async def _connected(server, http):
    return await connected_call(http, f"http://127.0.0.1:{server.control_port}/sessions")


@pytest.mark.parametrize("mode, media_path", [(ice.SHARED, "python"), (ice.SHARED, "native"),
                                              (ice.PORT_PER_SESSION, "native")])
def test_an_ice_restart_keeps_the_session_its_dtls_and_its_media(mode, media_path):
    async def call():
        config = TransceiverConfig(cluster_id=3, transceiver_id=5, media_host="127.0.0.1",
                                   control=("127.0.0.1", 0), mode=mode, media_path=media_path)
        async with TransceiverServer(config) as server, aiohttp.ClientSession() as http:
            pc, ear, resource = await _connected(server, http)
            [session] = server.sessions.values()
            dtls = session._pc.getTransceivers()[0].sender.transport
            client_dtls = pc.getTransceivers()[0].sender.transport
            before = session.ufrag
            heard = {"before": await ear.count(0.5)}
            result = await restart_ice(pc, http, resource)
            heard["after"] = await ear.count(0.5)
            connection = session._ice_connection()
            out = dict(result=result, heard=heard, before=before, after=session.ufrag,
                       remote=connection.remote_username,
                       client_local=pc.getTransceivers()[0].receiver.transport.transport
                       ._connection.local_username,
                       sessions=list(server.sessions.values()) == [session],
                       dtls=(session._pc.getTransceivers()[0].sender.transport is dtls,
                             pc.getTransceivers()[0].sender.transport is client_dtls,
                             dtls.state, client_dtls.state),
                       restarts=session.ice_restarts, mux=None)
            if server.mux is not None:   # the old ufrag routes nowhere now, the new one does
                drops = server.mux.counters.stun_unknown_ufrag
                server.mux.datagram_received(
                    binding_request(f"{before}:x".encode(), os.urandom(12)), ("127.0.0.1", 9))
                out["mux"] = (server.mux.counters.stun_unknown_ufrag - drops,
                              server.mux.state_sizes()["ufrags"])
            await pc.close()
            return out

    out = asyncio.run(call())
    result = out["result"]
    assert result.ok, result
    assert result.ms is not None and result.patch_ms <= result.ms < 2000, result
    hint = UfragCodec(DEV_SECRET)
    assert out["after"] != out["before"]
    assert hint.decode(out["after"]) == hint.decode(out["before"])   # same cluster, transceiver
    assert out["remote"] == out["client_local"]                       # the client's new ufrag
    assert out["sessions"] and out["restarts"] == 1
    assert out["dtls"] == (True, True, "connected", "connected")      # no new handshake
    # 25 frames a half second before and after (at least half: the check tier shares 2 cores)
    assert out["heard"]["before"] >= 12 and out["heard"]["after"] >= 12, out["heard"]
    if mode == ice.SHARED:
        assert out["mux"] == (1, 1), out["mux"]


def test_a_patch_that_is_not_a_restart_is_refused_with_its_reason():
    async def call():
        config = TransceiverConfig(cluster_id=3, transceiver_id=5, media_host="127.0.0.1",
                                   control=("127.0.0.1", 0), mode=ice.SHARED)
        async with TransceiverServer(config) as server, aiohttp.ClientSession() as http:
            pc, _, resource = await _connected(server, http)
            connection = pc.getTransceivers()[0].receiver.transport.transport._connection
            same = (f"a=ice-ufrag:{connection.local_username}\r\n"
                    f"a=ice-pwd:{connection.local_password}\r\n")
            answers = []
            fresh = "a=ice-ufrag:wxyz\r\na=ice-pwd:" + "q" * 22 + "\r\n"
            for body, kind, url in (
                    (same, CONTENT_TYPE, resource),                        # trickle: 422
                    (fresh, CONTENT_TYPE, resource),                       # a restart: 200
                    (fresh.replace("wxyz", "wxyv"), CONTENT_TYPE, resource),   # during it: 409
                    ("a=ice-ufrag:abcd\r\n", CONTENT_TYPE, resource),      # no pwd: 400
                    ("a=ice-ufrag:abcd\r\na=ice-pwd:" + "p" * 22 + "\r\n", "application/sdp",
                     resource),                                            # 415
                    ("x" * 9000, CONTENT_TYPE, resource),                  # too big: 400
                    ("a=ice-ufrag:abcd\r\na=ice-pwd:" + "p" * 22 + "\r\n", CONTENT_TYPE,
                     resource.rsplit("/", 1)[0] + "/nosuch")):             # 404
                async with http.patch(url, data=body, headers={"Content-Type": kind}) as r:
                    answers.append((r.status, (await r.text()).strip()))
            still = pc.connectionState, len(server.sessions)
            await pc.close()
            return answers, still

    answers, still = asyncio.run(call())
    assert [status for status, _ in answers] == [422, 200, 409, 400, 415, 400, 404], answers
    assert "in progress" in answers[2][1]
    assert all(text and "\n" not in text and "Traceback" not in text
               for i, (_, text) in enumerate(answers) if i != 1)
    assert still == ("connected", 1)


def test_a_restart_through_the_front_reaches_the_transceiver_that_has_the_call():
    port = free_port(socket.SOCK_STREAM)

    async def call():
        config = TransceiverConfig(cluster_id=3, transceiver_id=5, media_host="127.0.0.1",
                                   control=("127.0.0.1", port), mode=ice.SHARED)
        front_config = SignalingConfig(
            clusters=(ClusterRoute("c1", (f"http://127.0.0.1:{port}",)),),
            listen=("127.0.0.1", 0), poll_interval=0.1)
        async with TransceiverServer(config) as server, SignalingServer(front_config) as front, \
                aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{front.port}"
            await until(lambda: any(b.healthy for b in front.backends))   # probed
            pc, ear, call = await connected_call(http, f"{base}/v1/calls")
            [session] = server.sessions.values()
            result = await restart_ice(pc, http, call)
            heard = await ear.count(0.5)
            async with http.patch(f"{base}/v1/calls/c1~0~AAAAAAAAAAAAAAAA", data="x",
                                  headers={"Content-Type": CONTENT_TYPE}) as r:
                unknown = r.status
            # a fragment in several chunks is read whole (by the front and the transceiver)
            async with http.patch(call, data=_chunks("a=ice-ufrag:wxyz\r\n", "a=ice-pwd:",
                                                     "q" * 22 + "\r\n"),
                                  headers={"Content-Type": CONTENT_TYPE}) as r:
                chunked = r.status, await r.text()
            out = result, heard, session.ice_restarts, unknown, chunked
            await pc.close()
            return out

    result, heard, restarts, unknown, chunked = asyncio.run(call())
    assert result.ok and restarts == 2, result
    assert heard >= 12 and unknown == 404
    assert chunked[0] == 200 and "a=ice-ufrag:" in chunked[1], chunked


async def _chunks(*parts: str):
    for part in parts:
        yield part.encode()
        await asyncio.sleep(0.05)


class _Opening:
    """A TCP relay in front of the transceiver's control port that notes the first request
    line of every connection: which requests opened a new one."""

    def __init__(self, port: int) -> None:
        self.port, self.first_lines, self._server = port, [], None

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    async def _serve(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        first = await reader.readline()
        self.first_lines.append(first.decode().split(" ")[:2])
        up_writer.write(first)

        async def pipe(src, dst):
            while data := await src.read(65536):
                dst.write(data)
            dst.close()
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer),
                             return_exceptions=True)


@pytest.mark.parametrize("light_path, sig", [("python", signal.SIGUSR1),
                                             ("native", signal.SIGUSR1),
                                             ("native", signal.SIGUSR2)])
def test_a_signal_makes_every_live_call_of_a_client_process_restart_ice(light_path, sig):
    """What an ``ice_restart`` fault (SIGUSR1) and a ``handover`` (SIGUSR2: a new network)
    do to a client process (scenarios/faultkinds/): every live session restarts through its
    call's resource and records it; none calls again. After a new network each restart's
    PATCH opens a new connection (the old ones would reach another front), and the DELETE
    follows it; after SIGUSR1 the calls' connections are kept."""
    from services.client.config import ClientConfig
    from services.client.runner import run_sessions

    async def run():
        config = TransceiverConfig(cluster_id=3, transceiver_id=5, media_host="127.0.0.1",
                                   control=("127.0.0.1", 0), mode=ice.SHARED,
                                   media_path=light_path)
        async with TransceiverServer(config) as server:
            opening = _Opening(server.control_port)
            async with opening as port:
                client = ClientConfig(url=f"http://127.0.0.1:{port}/sessions",
                                      duration_s=4.0, setup_timeout_s=5.0, start_rate=20.0,
                                      full_sessions=1, light_path=light_path)

                async def poke():
                    while sum(s.state == "connected" for s in server.sessions.values()) < 3:
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.5)
                    os.kill(os.getpid(), sig)

                poking = asyncio.create_task(poke())
                results = await run_sessions(client, 3)
                await poking
                return results, opening.first_lines

    results, first_lines = asyncio.run(run())
    assert all(r.ok for r in results), [r.error for r in results]
    for r in results:
        assert r.reconnections == 0 and len(r.ice_restarts) == 1, r.ice_restarts
        sent, ok, patch_ms, ms, reason, trigger = r.ice_restarts[0]
        assert ok and reason is None and 0 < patch_ms <= ms < 2000, r.ice_restarts
        assert trigger == ("network" if sig == signal.SIGUSR2 else "asked")
        assert r.delete_status == 204, r.teardown_error
    opened_by = sorted(method for method, _ in first_lines)
    assert opened_by == (["PATCH"] * 3 if sig == signal.SIGUSR2 else []) + ["POST"] * 3, \
        first_lines


def test_a_call_whose_renomination_fails_restarts_ice_before_it_calls_again(monkeypatch):
    """The recovery ladder (docs/mobility.md): the client's address changes under a call
    (its ICE socket moves to a new port) and its renomination brings nothing back (here
    refused, as from a client that cannot renominate); the call restarts ICE over a new
    connection, its checks come from the new address, the transceiver moves the media there,
    and the call goes on: no new call."""
    from services.client import session as session_module
    from services.client.config import ClientConfig
    from tests.test_transceiver_move import rebind

    async def no_renomination(pc):
        return False
    monkeypatch.setattr(session_module, "renominate", no_renomination)

    async def run():
        config = TransceiverConfig(cluster_id=3, transceiver_id=5, media_host="127.0.0.1",
                                   control=("127.0.0.1", 0), mode=ice.SHARED,
                                   media_path="native")
        async with TransceiverServer(config) as server:
            client = ClientConfig(url=f"http://127.0.0.1:{server.control_port}/sessions",
                                  duration_s=5.0, setup_timeout_s=5.0)
            call = session_module.CallSession(client, 0)
            running = asyncio.create_task(call.run())
            while call._conn is None or call._conn.pc is None \
                    or call._conn.pc.connectionState != "connected":
                await asyncio.sleep(0.05)
            [session] = server.sessions.values()
            await asyncio.sleep(0.5)
            await rebind(call._conn.pc)
            return await running, session
    result, session = asyncio.run(run())
    assert result.ok and result.reconnections == 0, (result.error, result.attempts)
    [(sent, ok, patch_ms, ms, reason, trigger)] = result.ice_restarts
    assert ok and trigger == session_module.SILENCE, result.ice_restarts
    assert session.ice_restarts == 1 and session.state != "connected"   # ended with the call
    # the silence ended with the restart (started once the renomination failed), before the
    # watchdog's time
    longest = max(g[1] for g in result.rx_gaps)
    assert 1000 * session_module.RENOMINATE_AFTER_S <= longest < 1000 * ClientConfig.media_timeout_s
