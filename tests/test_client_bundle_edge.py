"""Calls through an answer whose candidates are in the BUNDLE tag's m-line only, as Pion writes
it (RFC 8843 allows it): the project's edge (relay, transceiver, agent in a lab namespace, as
in the demo) answers, and a small signaling proxy in front of it moves the answer's candidates
to its first m-line before the client sees it. The aiortc client takes them from there
(services/client/bundle.py); without that, aiortc 1.16 finds none and the call never sets up.
Chromium (the browser client) takes them from there itself.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from scenarios.demo_edge import demo_plan
from scenarios.edge import Edge
from services.client import session as client_session
from services.client.config import ClientConfig
from services.client.session import run_session
from tests.conftest import REPO
from topology.netns import in_namespace, lab_namespace

pytestmark = [pytest.mark.netns, pytest.mark.shareable]

TRANSPORT_LINES = ("a=candidate:", "a=end-of-candidates")


def sections(sdp: str) -> list[list[str]]:
    lines = sdp.split("\r\n")
    starts = [i for i, line in enumerate(lines) if line.startswith("m=")] + [len(lines)]
    return [lines[a:b] for a, b in zip(starts, starts[1:])]


def candidates_per_mline(sdp: str) -> list[int]:
    return [sum(line.startswith("a=candidate:") for line in s) for s in sections(sdp)]


def first_mline_only(sdp: str) -> str:
    """``sdp`` with the candidates and end-of-candidates of every m-line but the first gone."""
    out, m_lines = [], 0
    for line in sdp.split("\r\n"):
        m_lines += line.startswith("m=")
        if m_lines > 1 and line.startswith(TRANSPORT_LINES):
            continue
        out.append(line)
    return "\r\n".join(out)


class StockBundleProxy:
    """The edge's signaling front behind a proxy on 127.0.0.1 in the lab namespace, with its
    own event loop in a thread (for clients in this process and in child processes alike):
    every request passed on (the call page too), a 201 answer to ``POST /v1/calls`` handed on
    with its candidates in the first m-line only. ``answers``: (the edge's, what was handed
    on) per call."""

    def __init__(self, netns: str, upstream: str) -> None:
        self.netns = netns
        self.upstream = upstream.removesuffix("/v1/calls")
        self.answers: list[tuple[str, str]] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=in_namespace, name="bundle-proxy",
                                        args=(netns, self.loop.run_forever), daemon=True)
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self.origin = ""

    @property
    def url(self) -> str:
        return f"{self.origin}/v1/calls"

    def __enter__(self) -> "StockBundleProxy":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    async def _start(self) -> None:
        self._http = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.origin = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._http.close()

    async def _forward(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("content-type", "authorization", "accept")}
        async with self._http.request(request.method, self.upstream + request.path_qs,
                                      data=await request.read(), headers=headers,
                                      allow_redirects=False) as r:
            body = await r.read()
            keep = {k: v for k, v in r.headers.items()
                    if k.lower() in ("content-type", "x-voiceedge-cluster",
                                     "x-voiceedge-transceiver")}
            if "Location" in r.headers:  # same paths here: the proxy's own origin
                keep["Location"] = urlsplit(r.headers["Location"]).path
            status = r.status
        if request.method == "POST" and request.path == "/v1/calls" and status == 201:
            edges = body.decode()
            stock = first_mline_only(edges)
            self.answers.append((edges, stock))
            body = stock.encode()
        return web.Response(status=status, body=body, headers=keep)


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root for a network namespace")
    with lab_namespace("vebundle") as ns:
        edge = Edge(demo_plan("shared", ns.name, *ns.addresses),
                    tmp_path_factory.mktemp("bundle-edge"))
        with edge:
            yield ns, edge


def calls(ns, edge, setup_timeout_s: float):
    """One aiortc session through the proxy: (its result, the answers the proxy changed)."""
    with StockBundleProxy(ns.name, edge.signaling_url(edge.plan.fronts[0])) as proxy:
        config = ClientConfig(url=proxy.url, duration_s=2.0, setup_timeout_s=setup_timeout_s)
        result = in_namespace(ns.name, asyncio.run, run_session(config, index=0))
        return result, proxy.answers


def test_a_call_through_an_answer_with_candidates_in_the_first_m_line_only(edge):
    ns, e = edge
    r, [(edges, stock)] = calls(ns, e, setup_timeout_s=10.0)

    assert candidates_per_mline(edges) == [1, 1]    # the transceiver writes them in both
    assert candidates_per_mline(stock) == [1, 0]    # what the client was given
    assert "a=end-of-candidates" not in sections(stock)[1]
    assert r.ok, r.error
    assert r.echo_verified and r.datachannel_verified  # the data channel rode the transport
    assert r.delete_status in (200, 204)


def test_without_taking_the_tags_candidates_the_same_answer_never_sets_up(edge, monkeypatch):
    ns, e = edge
    monkeypatch.setattr(client_session, "bundled_answer", lambda sdp: sdp)  # aiortc as it is
    r, [(_, stock)] = calls(ns, e, setup_timeout_s=3.0)

    assert candidates_per_mline(stock) == [1, 0]
    assert not r.ok and r.error == "setup timeout"
    assert r.ice_connected_ms is None


@pytest.mark.browser
def test_chromium_takes_the_tags_candidates_itself(edge, tmp_path):
    """The browser client needs no such step: Chromium applies a BUNDLE answer's transport
    from the tag's m-line (as JSEP says), so the same answers set up its calls."""
    if not os.access("/usr/bin/chromium", os.X_OK):
        pytest.fail("no Chromium at /usr/bin/chromium: run `make browsers` (make test does)")
    ns, e = edge
    results = tmp_path / "sessions.jsonl"
    with StockBundleProxy(ns.name, e.signaling_url(e.plan.fronts[0])) as proxy:
        proc = subprocess.run(
            ["ip", "netns", "exec", ns.name, sys.executable, "-m", "voiceedge", "browser",
             "--url", proxy.url, "-n", "2", "--rate", "2", "--duration", "2",
             "--offer", "alternate", "--results", str(results), "--json"],
            capture_output=True, text=True, cwd=REPO, timeout=120)
        answers = list(proxy.answers)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(answers) == 2 and all(candidates_per_mline(stock) == [1, 0]
                                     for _, stock in answers)
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["ok"] for r in lines] == [True, True], [r["error"] for r in lines]
    assert all(r["client_type"] == "chromium" and r["datachannel_verified"] for r in lines)
