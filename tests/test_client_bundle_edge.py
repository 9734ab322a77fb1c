"""Calls through an answer whose candidates are in the BUNDLE tag's m-line only, as Pion writes
it (RFC 8843 allows it): the project's edge (relay, transceiver, agent in a lab namespace, as
in the demo) answers, and a small signaling proxy in front of it moves the answer's candidates
to its first m-line before the client sees it. The client takes them from there
(services/client/bundle.py); without that, aiortc 1.16 finds none and the call never sets up.
"""
from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest
from aiohttp import web

from scenarios.demo_edge import demo_plan
from scenarios.edge import Edge
from services.client import session as client_session
from services.client.config import ClientConfig
from services.client.session import run_session
from topology.netns import in_namespace, lab_namespace

pytestmark = [pytest.mark.netns]

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
    """POST /v1/calls to the edge's front, answered with the candidates in the first m-line
    only; DELETE of the Location passed on. Records the answers before and after."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removesuffix("/v1/calls")
        self.answers: list[tuple[str, str]] = []  # (the edge's, what the client got)
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self.url = ""

    async def __aenter__(self) -> "StockBundleProxy":
        self._http = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_post("/v1/calls", self._post)
        app.router.add_delete("/v1/calls/{call}", self._delete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/calls"
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()
        await self._http.close()

    async def _post(self, request: web.Request) -> web.Response:
        async with self._http.post(f"{self.upstream}/v1/calls", data=await request.read(),
                                   headers={"Content-Type": "application/sdp"}) as r:
            body = await r.text()
            if r.status != 201:
                return web.Response(status=r.status, text=body)
            location = r.headers["Location"]
        stock = first_mline_only(body)
        self.answers.append((body, stock))
        return web.Response(status=201, text=stock, content_type="application/sdp",
                            headers={"Location": "/v1/calls/" + location.rsplit("/", 1)[-1]})

    async def _delete(self, request: web.Request) -> web.Response:
        async with self._http.delete(f"{self.upstream}/v1/calls/"
                                     f"{request.match_info['call']}") as r:
            return web.Response(status=r.status, text=await r.text())


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
    async def main():
        async with StockBundleProxy(edge.signaling_url(edge.plan.fronts[0])) as proxy:
            config = ClientConfig(url=proxy.url, duration_s=2.0,
                                  setup_timeout_s=setup_timeout_s)
            result = await run_session(config, index=0)
            return result, proxy.answers

    return in_namespace(ns.name, asyncio.run, main())


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
