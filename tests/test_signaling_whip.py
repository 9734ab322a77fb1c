"""The front in front of an external edge's WHIP endpoint (bring your own edge): the call is
POSTed to the endpoint's URL as it came, its answer passed on, the Location it answered kept
(relative ones resolved per RFC 3986) and DELETEd when the client ends the call; the endpoint
is probed with OPTIONS and its load is the calls the front placed there.

The endpoint is a small aiohttp WHIP server written here, on loopback (no namespace)."""
from __future__ import annotations

import asyncio
import socket

import aiohttp
from aiohttp import web

from services.signaling.server import ClusterRoute, SignalingConfig, SignalingServer
from tests.conftest import free_port
from tests.offers import STATIC_OFFER

SDP = {"Content-Type": "application/sdp"}
ANSWER = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"


class WhipEndpoint:
    """A WHIP endpoint at /live/whip whose resources are ``location(n)`` (relative or not)."""

    def __init__(self, location, status: int = 201) -> None:
        self.location = location
        self.status = status
        self.offers: list[tuple[str, str]] = []   # (content type, body)
        self.deleted: list[str] = []              # request paths
        self.options = 0
        self.port = free_port(socket.SOCK_STREAM)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/live/whip"

    async def __aenter__(self) -> "WhipEndpoint":
        app = web.Application()
        app.router.add_post("/live/whip", self._post)
        app.router.add_route("OPTIONS", "/live/whip", self._options)
        app.router.add_delete("/{tail:.*}", self._delete)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()

    async def _options(self, request: web.Request) -> web.Response:
        self.options += 1
        return web.Response(status=204)

    async def _post(self, request: web.Request) -> web.Response:
        self.offers.append((request.content_type, await request.text()))
        if self.status != 201:
            return web.Response(status=self.status, text="busy\n")
        headers = {}
        location = self.location(len(self.offers))
        if location:
            headers["Location"] = location
        return web.Response(status=201, text=ANSWER, content_type="application/sdp",
                            headers=headers)

    async def _delete(self, request: web.Request) -> web.Response:
        self.deleted.append(request.path_qs)
        return web.Response(status=200)


def front(endpoint: WhipEndpoint, capacity: int = 5) -> SignalingServer:
    return SignalingServer(SignalingConfig(
        clusters=(ClusterRoute("ext", (), whip=(endpoint.url,), capacity=capacity),),
        listen=("127.0.0.1", 0), poll_interval=0.1))


def run(coro, timeout: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def call(http: aiohttp.ClientSession, base: str) -> tuple[int, str, str | None]:
    async with http.post(f"{base}/v1/calls", data=STATIC_OFFER, headers=SDP) as r:
        return r.status, await r.text(), r.headers.get("Location")


async def sessions(http: aiohttp.ClientSession, base: str) -> int:
    async with http.get(f"{base}/healthz") as r:
        return sum(t["sessions"] for t in (await r.json())["transceivers"])


def test_calls_go_to_the_whip_url_and_its_relative_locations_are_deleted():
    # resource 1 relative to the endpoint's URL, 2 an absolute path, 3 with a query
    locations = {1: "resource/one", 2: "/other/two", 3: "./three?id=3"}

    async def main():
        async with WhipEndpoint(locations.get) as edge, front(edge) as f, \
                aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{f.port}"
            assert edge.options >= 1  # probed: healthy without a /status
            placed = [await call(http, base) for _ in range(3)]
            assert [p[0] for p in placed] == [201, 201, 201]
            assert all(p[1] == ANSWER for p in placed)  # the edge's answer, unchanged
            assert all(ct == "application/sdp" and body == STATIC_OFFER
                       for ct, body in edge.offers)
            calls = [p[2] for p in placed]
            assert all(c.startswith("/v1/calls/ext~0~") for c in calls)
            assert calls[0] == "/v1/calls/ext~0~one" and calls[1] == "/v1/calls/ext~0~two"
            assert await sessions(http, base) == 3
            for c in calls:
                async with http.delete(base + c) as r:
                    assert r.status == 204
            assert edge.deleted == ["/live/resource/one", "/other/two", "/live/three?id=3"]
            assert await sessions(http, base) == 0
            async with http.delete(base + calls[0]) as r:  # already ended
                assert r.status == 404

    run(main())


def test_a_201_without_location_and_a_full_edge_are_refused_clearly():
    async def main():
        async with WhipEndpoint(lambda n: None) as edge, front(edge) as f, \
                aiohttp.ClientSession() as http:
            status, text, _ = await call(http, f"http://127.0.0.1:{f.port}")
            assert status == 502 and "without a Location" in text
        async with WhipEndpoint(lambda n: f"r/{n}", status=503) as edge, front(edge) as f, \
                aiohttp.ClientSession() as http:
            status, text, _ = await call(http, f"http://127.0.0.1:{f.port}")
            assert status == 503 and text.count("\n") == 1
        async with WhipEndpoint(lambda n: f"r/{n}") as edge, front(edge, capacity=1) as f, \
                aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{f.port}"
            assert (await call(http, base))[0] == 201
            assert (await call(http, base))[0] == 503  # its one call is live
            assert len(edge.offers) == 1

    run(main())


def test_an_endpoint_that_does_not_answer_is_down():
    port = free_port(socket.SOCK_STREAM)

    async def main():
        route = ClusterRoute("ext", (), whip=(f"http://127.0.0.1:{port}/whip",))
        async with SignalingServer(SignalingConfig(clusters=(route,), listen=("127.0.0.1", 0),
                                                   poll_interval=0.1)) as f, \
                aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{f.port}/healthz") as r:
                assert r.status == 503

    run(main())
