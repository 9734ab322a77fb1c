"""Signaling in front of real transceivers on loopback: health, metrics, call ids, logs.

The transceivers run in-process and answer a static offer (tests/offers.py) without any
network traffic; no namespace is needed.
"""
from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from services.signaling.server import ClusterRoute, SignalingConfig, SignalingServer
from services.transceiver.server import TransceiverConfig, TransceiverServer
from tests.conftest import REPO, free_port
from tests.logcheck import events, service_records
from tests.offers import STATIC_OFFER

SDP = {"Content-Type": "application/sdp"}


def run(coro, timeout: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def transceiver(port: int, transceiver_id: int = 1) -> TransceiverServer:
    return TransceiverServer(TransceiverConfig(
        cluster_id=1, transceiver_id=transceiver_id, media_host="127.0.0.1",
        control=("127.0.0.1", port), max_sessions=7, setup_timeout=20.0))


def signaling(*clusters: ClusterRoute) -> SignalingServer:
    return SignalingServer(SignalingConfig(clusters=clusters, listen=("127.0.0.1", 0),
                                           poll_interval=0.1))


def metrics(text: str) -> dict[tuple, float]:
    """{(sample name, sorted labels): value}"""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


async def healthz(http: aiohttp.ClientSession, base: str) -> tuple[int, dict]:
    async with http.get(f"{base}/healthz") as r:
        return r.status, await r.json()


async def until_healthz(http, base: str, status: int, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got, body = await healthz(http, base)
        if got == status:
            return body
        assert time.monotonic() < deadline, (got, body)
        await asyncio.sleep(0.05)


def test_healthz_follows_the_probed_transceivers():
    """503 while no transceiver answers /status (and calls are refused), 200 once one does,
    503 again when it goes away."""
    port = free_port(socket.SOCK_STREAM)

    async def main():
        route = ClusterRoute("c1", (f"http://127.0.0.1:{port}",))
        async with signaling(route) as front, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{front.port}"
            seen = [await healthz(http, base)]
            async with http.post(f"{base}/v1/calls", data=STATIC_OFFER, headers=SDP) as r:
                refused = r.status, await r.text()
            async with transceiver(port):
                seen.append((200, await until_healthz(http, base, 200)))
            seen.append((503, await until_healthz(http, base, 503)))
            return seen, refused, await (await http.get(f"{base}/metrics")).text()

    seen, refused, text = run(main())
    (first, down), (_, up), (_, again) = seen
    assert first == 503
    assert down["status"] == "unavailable" and "no transceiver" in down["reason"]
    assert [t["healthy"] for t in down["transceivers"]] == [False]
    assert up["status"] == "ok" and "reason" not in up
    assert up["transceivers"] == [{"url": f"http://127.0.0.1:{port}", "cluster": "c1",
                                   "healthy": True, "sessions": 0, "capacity": 7}]
    assert again["status"] == "unavailable"
    assert refused == (503, "no transceiver has room for a call\n")
    m = metrics(text)
    assert m[("voiceedge_signaling_calls_refused_total", (("status", "503"),))] == 1
    assert m[("voiceedge_signaling_transceiver_healthy",
              (("cluster", "c1"), ("transceiver", f"http://127.0.0.1:{port}")))] == 0


def test_metrics_count_created_and_refused_calls_and_call_ids_are_checked():
    port = free_port(socket.SOCK_STREAM)
    url = f"http://127.0.0.1:{port}"

    async def main():
        async with transceiver(port) as t, signaling(ClusterRoute("c1", (url,))) as front, \
                aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{front.port}"
            out = {}
            async with http.post(f"{base}/v1/calls", data="v=0\r\n",
                                 headers={"Content-Type": "text/plain"}) as r:
                out["415"] = r.status
            async with http.post(f"{base}/v1/calls", data="not sdp", headers=SDP) as r:
                out["400"] = r.status
            async with http.post(f"{base}/v1/calls", data=STATIC_OFFER, headers=SDP) as r:
                out["created"] = r.status, r.headers["Location"], r.headers["X-Voiceedge-Cluster"]
            out["live"] = len(t.sessions)
            out["metrics"] = await (await http.get(f"{base}/metrics")).text()
            location = out["created"][1]
            call = location.rsplit("/", 1)[1]
            session = call.rsplit("~", 1)[1]
            deletes = {}
            for name, path in (("other cluster", f"/v1/calls/c2~0~{session}"),
                               ("no such index", f"/v1/calls/c1~5~{session}"),
                               ("bad session id", f"/v1/calls/c1~0~{session[:4]}.x"),
                               ("garbage", "/v1/calls/garbage"),
                               ("the call", location),
                               ("the call again", location),
                               ("well-formed unknown", "/v1/calls/c1~0~AAAAAAAAAAAAAAAA")):
                async with http.delete(base + path) as r:
                    deletes[name] = r.status
            async with http.delete(f"{url}/sessions/AAAAAAAAAAAAAAAA") as r:
                deletes["transceiver, unknown"] = r.status
            out["deletes"], out["left"] = deletes, len(t.sessions)
            return out

    out = run(main())
    status, location, cluster = out["created"]
    assert (out["415"], out["400"], status, cluster) == (415, 400, 201, "c1")
    prefix, session = location.rsplit("~", 1)
    assert prefix == "/v1/calls/c1~0" and len(session) == 16 and out["live"] == 1
    m = metrics(out["metrics"])
    assert m[("voiceedge_signaling_calls_created_total", ())] == 1
    assert m[("voiceedge_signaling_calls_refused_total", (("status", "415"),))] == 1
    assert m[("voiceedge_signaling_calls_refused_total", (("status", "400"),))] == 1
    assert m[("voiceedge_signaling_calls_steered_total",
              (("cluster", "c1"), ("nearest", "true")))] == 1
    labels = (("cluster", "c1"), ("transceiver", url))
    assert m[("voiceedge_signaling_transceiver_healthy", labels)] == 1
    assert m[("voiceedge_signaling_transceiver_capacity", labels)] == 7
    assert m[("voiceedge_signaling_transceiver_sessions", labels)] >= 1
    assert out["deletes"] == {"other cluster": 404, "no such index": 404, "bad session id": 404,
                              "garbage": 404, "the call": 204, "the call again": 404,
                              "well-formed unknown": 404, "transceiver, unknown": 404}
    assert out["left"] == 0


def test_a_call_falls_back_to_a_farther_cluster_and_the_metrics_say_so():
    near_port, far_port = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
    # near's seed (0 ms) stays below far's measured loopback RTT: near is never measured.
    near = ClusterRoute("near", (f"http://127.0.0.1:{near_port}",), rtt_ms=0.0)
    far = ClusterRoute("far", (f"http://127.0.0.1:{far_port}",), rtt_ms=80.0)

    async def main():
        async with transceiver(far_port) as t, signaling(far, near) as front, \
                aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{front.port}"
            health = await healthz(http, base)
            async with http.post(f"{base}/v1/calls", data=STATIC_OFFER, headers=SDP) as r:
                created = r.status, r.headers.get("Location")
            text = await (await http.get(f"{base}/metrics")).text()
            async with http.delete(base + created[1]) as r:
                deleted = r.status
            return health, created, text, deleted, len(t.sessions)

    (code, body), (status, location), text, deleted, left = run(main())
    assert code == 200 and [b["healthy"] for b in body["transceivers"]] == [True, False]
    assert status == 201 and location.startswith("/v1/calls/far~0~")
    m = metrics(text)
    assert m[("voiceedge_signaling_calls_steered_total",
              (("cluster", "far"), ("nearest", "false")))] == 1
    assert not any(k[0] == "voiceedge_signaling_calls_steered_total" and ("cluster", "near") in k[1]
                   for k in m)
    assert deleted == 204 and left == 0


def test_the_signaling_process_logs_json_only(tmp_path):
    """``voiceedge signaling`` with a transceiver that is down: not healthy, and its stderr is
    JSON lines only."""
    port, dead = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
    log_path = tmp_path / "signaling.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voiceedge", "signaling", "--listen", f"127.0.0.1:{port}",
             "--transceiver", f"http://127.0.0.1:{dead}"], stdout=log, stderr=log, cwd=REPO)

    async def probe():
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    got = await healthz(http, f"http://127.0.0.1:{port}")
                    break
                except aiohttp.ClientConnectionError:
                    assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                    await asyncio.sleep(0.1)
            async with http.post(f"http://127.0.0.1:{port}/v1/calls", data="x",
                                 headers={"Content-Type": "text/plain"}) as r:
                return got, r.status

    try:
        (code, body), refused = run(probe(), timeout=90)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert proc.returncode == 0
    assert code == 503 and body["transceivers"][0]["healthy"] is False and refused == 415
    records = service_records(log_path.read_text(), "signaling")
    assert records[-1]["event"] == "loop_lag_summary"  # the event loop watched all along
    records = [r for r in records if not r["event"].startswith("loop_lag")]
    # an open front (no --api-keys) says so, as a warning, before it starts
    assert [r["event"] for r in records] == ["auth_disabled", "signaling_started",
                                             "call_refused", "signaling_stopped"]
    assert records[0]["level"] == "WARNING"
    [call] = events(records, "call_refused")
    assert call["status"] == 415 and "application/sdp" in call["reason"]
    assert records[-1]["calls_refused"] == {"415": 1}
