"""TURN credentials (the TURN REST API shared-secret scheme): what the front hands out on
``GET /v1/ice-servers``, and that a real coturn accepts exactly those (aioice's TURN client
against Debian's turnserver on loopback)."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import socket
import stat
import subprocess
import sys
import time

import aiohttp
import pytest
from aioice import stun, turn

from services.signaling.iceservers import TurnHandout
from services.signaling.server import ClusterRoute, SignalingConfig, SignalingServer
from services.transceiver.server import TransceiverConfig, TransceiverServer
from services.turn.credentials import (issue, read_secret, sign, valid, expiry_of,
                                       write_secret)
from tests.conftest import REPO, free_port
from tests.turnserver import Coturn


def run(coro, timeout: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# -- the scheme --------------------------------------------------------------------------------

def test_a_credential_is_the_hmac_of_its_username_and_expires_after_its_ttl(tmp_path):
    now = 1_800_000_000
    c = issue("s3cret", "apac-ne-1a2b", ttl_s=60, now=now)
    assert c.username == f"{now + 60}:apac-ne-1a2b" and c.expires == now + 60
    assert expiry_of(c.username) == now + 60 and c.ttl_s == 60
    # base64(HMAC-SHA1(secret, username)), computed here independently
    digest = hmac.new(b"s3cret", c.username.encode(), hashlib.sha1).digest()
    assert base64.b64decode(c.credential) == digest and len(digest) == 20
    assert valid("s3cret", c.username, c.credential, now=now)
    assert valid("s3cret", c.username, c.credential, now=now + 59)
    assert not valid("s3cret", c.username, c.credential, now=now + 60)   # expired
    assert not valid("other", c.username, c.credential, now=now)         # another secret
    later = c.username.replace(str(now + 60), str(now + 6000))           # a longer life
    assert not valid("s3cret", later, c.credential, now=now)
    assert valid("s3cret", later, sign("s3cret", later), now=now)
    assert not valid("s3cret", "apac-ne-1a2b", sign("s3cret", "apac-ne-1a2b"), now=now)
    for bad in ({"ttl_s": 5}, {"ttl_s": 100_000}, {"user": "a:b"}, {"user": ""}):
        with pytest.raises(ValueError):
            issue("s3cret", **{"user": "u", "ttl_s": 60, **bad})
    path = write_secret(tmp_path / "turn.secret", "abc")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and read_secret(path) == "abc"


# -- the front's endpoint ----------------------------------------------------------------------

async def _ice_servers(turn_handout: TurnHandout | None) -> list[tuple[int, dict, dict]]:
    port = free_port(socket.SOCK_STREAM)
    url = f"http://127.0.0.1:{port}"
    config = SignalingConfig(clusters=(ClusterRoute("c1", (url,)),), listen=("127.0.0.1", 0),
                             poll_interval=0.1, region="apac-ne", turn=turn_handout)
    transceiver = TransceiverServer(TransceiverConfig(
        cluster_id=1, transceiver_id=1, media_host="127.0.0.1", control=("127.0.0.1", port),
        max_sessions=7))
    out = []
    async with transceiver, SignalingServer(config) as front, aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{front.port}/v1/ice-servers"
        for _ in range(2):
            async with http.get(base, headers={"Origin": "http://page.example"}) as r:
                out.append((r.status, dict(r.headers), await r.json()))
        async with http.options(base, headers={"Origin": "http://page.example",
                                               "Access-Control-Request-Method": "GET"}) as r:
            out.append((r.status, dict(r.headers), {}))
    return out


def test_the_front_hands_out_fresh_time_limited_turn_credentials(tmp_path):
    secret = write_secret(tmp_path / "turn.secret", "front-secret")
    url = "turn:10.3.2.2:3478?transport=udp"
    before = time.time()
    (s1, h1, b1), (s2, _, b2), (pre, hpre, _) = run(_ice_servers(
        TurnHandout((url,), str(secret), ttl_s=120)))
    assert (s1, s2, pre) == (200, 200, 204)
    assert h1["Access-Control-Allow-Origin"] == "*" and h1["Cache-Control"] == "no-store"
    assert "GET" in hpre["Access-Control-Allow-Methods"]
    assert b1["iceTransportPolicy"] == "relay" and b1["ttl"] == 120
    [server] = b1["iceServers"]
    assert set(server) == {"urls", "username", "credential"} and server["urls"] == [url]
    assert valid("front-secret", server["username"], server["credential"])
    assert int(before) + 120 <= expiry_of(server["username"]) <= time.time() + 120
    assert server["username"].split(":", 1)[1].startswith("apac-ne-")
    # each request its own user id, so its own credential
    assert b2["iceServers"][0]["username"] != server["username"]
    assert not valid("front-secret", server["username"], server["credential"],
                     now=time.time() + 121)


def test_without_turn_the_front_hands_out_no_ice_servers():
    (status, _, body), _, _ = run(_ice_servers(None))
    assert status == 200 and body == {"iceServers": [], "iceTransportPolicy": "all"}


def test_the_front_command_line_checks_its_turn_options(tmp_path):
    secret = write_secret(tmp_path / "turn.secret", "x")
    base = [sys.executable, "-m", "voiceedge", "signaling", "--transceiver",
            "http://127.0.0.1:1"]
    for extra, message in (
            (["--turn-url", "turn:10.1.2.2:3478"], "--turn-secret-file"),
            (["--turn-url", "turn:10.1.2.2:3478", "--turn-secret-file",
              str(tmp_path / "missing")], "--turn-secret-file"),
            (["--turn-url", "stun:10.1.2.2", "--turn-secret-file", str(secret)], "turn:"),
            (["--turn-url", "turn:10.1.2.2", "--turn-secret-file", str(secret),
              "--turn-ttl", "1"], "TTL"),
            (["--turn-secret-file", str(secret)], "--turn-url")):
        proc = subprocess.run(base + extra, capture_output=True, text=True, cwd=REPO,
                              timeout=60)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# -- a real coturn -----------------------------------------------------------------------------

async def _allocate(server: tuple[str, int], username: str, password: str):
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(
        lambda: turn.TurnClientUdpProtocol(server, username, password, 600, 500),
        remote_addr=server)
    return transport, client


class _Peer(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: asyncio.Queue = asyncio.Queue()

    def datagram_received(self, data, addr) -> None:
        self.received.put_nowait((data, addr))


def test_coturn_accepts_the_credentials_and_nothing_else(tmp_path):
    """Allocate with an issued credential; refused (401) with another secret's or an expired
    one; the relay reaches the allowed peer and nobody else (403 Forbidden IP)."""
    with Coturn(tmp_path, "127.0.0.1", peers=("127.0.0.1",)) as server:
        cmdline = open(f"/proc/{server.proc.pid}/cmdline", "rb").read()
        conf = server.config.workdir / "turn.conf"
        assert server.secret.encode() not in cmdline
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600
        addr = ("127.0.0.1", server.port)

        async def main():
            loop = asyncio.get_running_loop()
            good = issue(server.secret, "test-good", 60)
            transport, client = await _allocate(addr, good.username, good.credential)
            relayed = await client.connect()
            peer_transport, peer = await loop.create_datagram_endpoint(
                _Peer, local_addr=("127.0.0.1", 0))
            await client.channel_bind(0x4000, peer_transport.get_extra_info("sockname"))
            client.channel_to_peer[0x4000] = peer_transport.get_extra_info("sockname")
            client._send(b"\x40\x00\x00\x05hello\x00\x00\x00")  # ChannelData, padded
            data, source = await asyncio.wait_for(peer.received.get(), 5)
            try:
                await client.channel_bind(0x4001, ("10.99.0.1", 5000))
                denied = None
            except stun.TransactionFailed as exc:
                denied = exc.response.error_code
            await client.delete()
            transport.close()
            peer_transport.close()
            refused = {}
            for name, credential in (
                    ("other secret", issue("not-the-secret", "test-bad", 60)),
                    ("expired", issue(server.secret, "test-old", 60, now=time.time() - 61))):
                transport, client = await _allocate(addr, credential.username,
                                                    credential.credential)
                try:
                    await client.connect()
                except stun.TransactionFailed as exc:
                    refused[name] = exc.response.error_code
                finally:
                    transport.close()
            return relayed, data, source, denied, refused

        relayed, data, source, denied, refused = run(main())
    low, high = server.config.relay_ports
    assert relayed[0] == "127.0.0.1" and low <= relayed[1] <= high
    assert data == b"hello" and source == relayed   # the peer hears the relay, not us
    assert denied == 403
    assert refused == {"other secret": 401, "expired": 401}
    log = server.log()
    assert "ALLOCATE processed, success" in log and "Forbidden IP" in log
