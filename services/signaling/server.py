"""Cluster signaling: ``POST /v1/calls`` (OpenAI Realtime WebRTC convention) onto transceivers.

- ``POST /v1/calls`` with ``Content-Type: application/sdp``: ``201``, the SDP answer, and
  ``Location: /v1/calls/{call}``; ``DELETE`` on it ends the call (``204``).
- Refusals are one line of text: ``415`` wrong content type, ``413`` oversized body, ``400``
  malformed offer / no audio / no BUNDLE, ``503`` no transceiver has room. Nothing is allocated
  for a refused offer.
- Geo steering (the regional front): transceivers belong to clusters, each with the RTT from
  this front's region; a call goes to the nearest cluster that is healthy and has room (from
  each transceiver's ``/status``, polled in the background), to its transceiver with the most
  room, and falls back to the next nearest when one is down, full (``503``) or unreachable. A
  cluster-local signaling is the same with one cluster.
- The answer's one candidate is the cluster's ``advertise`` address (the relay VIP the client
  should use), passed to the transceiver per call.
- The call id in ``Location`` names the cluster: ``{cluster}~{transceiver}~{session}``.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from services.wire.sdp import MAX_OFFER_BYTES, OfferError, check_offer

log = logging.getLogger("voiceedge.signaling")
_WARM = 4  # keep-alive connections kept open to each transceiver


@dataclass(frozen=True)
class ClusterRoute:
    """A cluster this front may send calls to."""

    name: str
    transceivers: tuple[str, ...]             # control base URLs, e.g. http://10.2.5.2:8900
    advertise: tuple[str, int] | None = None  # candidate for answers; None: the transceiver's
    rtt_ms: float = 0.0                       # from this front's region: proximity


@dataclass(frozen=True)
class SignalingConfig:
    clusters: tuple[ClusterRoute, ...]
    listen: tuple[str, int] = ("127.0.0.1", 8080)
    poll_interval: float = 1.0

    @classmethod
    def single(cls, transceivers: tuple[str, ...], listen=("127.0.0.1", 8080),
               advertise: tuple[str, int] | None = None) -> "SignalingConfig":
        return cls(clusters=(ClusterRoute("local", transceivers, advertise),), listen=listen)


@dataclass
class _Backend:
    url: str
    cluster: ClusterRoute
    sessions: int = 0
    capacity: int = 0
    healthy: bool = False

    @property
    def room(self) -> int:
        return self.capacity - self.sessions if self.healthy else -1


@dataclass
class SignalingStats:
    created: int = 0
    refused: dict[int, int] = field(default_factory=dict)


class SignalingServer:
    """``async with SignalingServer(config) as s``: serves until the block ends."""

    def __init__(self, config: SignalingConfig) -> None:
        if not any(c.transceivers for c in config.clusters):
            raise ValueError("signaling needs at least one transceiver")
        self.config = config
        self.backends = [_Backend(url.rstrip("/"), cluster) for cluster in config.clusters
                         for url in cluster.transceivers]
        self.stats = SignalingStats()
        self.port: int | None = None
        self._http: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._poller: asyncio.Task | None = None

    async def __aenter__(self) -> "SignalingServer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=15),
            connector=aiohttp.TCPConnector(keepalive_timeout=60))
        await self._poll_once()
        self._poller = asyncio.create_task(self._poll())
        app = web.Application(client_max_size=MAX_OFFER_BYTES + 1, middlewares=[_cors])
        app.router.add_post("/v1/calls", self._post_call)
        app.router.add_delete("/v1/calls/{call}", self._delete_call)
        app.router.add_route("OPTIONS", "/v1/calls", _preflight)
        app.router.add_route("OPTIONS", "/v1/calls/{call}", _preflight)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, *self.config.listen)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        log.info(json.dumps({"event": "signaling_started",
                             "listen": f"{self.config.listen[0]}:{self.port}",
                             "clusters": [c.name for c in self.config.clusters]}))

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    # ------------------------------------------------------------ backends

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval)
            await self._poll_once()

    async def _poll_once(self) -> None:
        await asyncio.gather(*(self._probe(b) for b in self.backends))

    async def _probe(self, backend: _Backend) -> None:
        # Several polls at once keep that many keep-alive connections warm: a call then does
        # not pay a TCP handshake across the backbone (a whole RTT) when calls arrive together.
        results = await asyncio.gather(*(self._status(backend) for _ in range(_WARM)),
                                       return_exceptions=True)
        status = next((r for r in results if isinstance(r, dict)), None)
        if status is None:
            backend.healthy = False
            return
        try:
            backend.sessions, backend.capacity = status["sessions"], status["capacity"]
            backend.healthy = True
        except (KeyError, TypeError):
            backend.healthy = False

    async def _status(self, backend: _Backend) -> dict:
        async with self._http.get(f"{backend.url}/status",
                                  timeout=aiohttp.ClientTimeout(total=2)) as r:
            return await r.json()

    def _candidates(self) -> list[_Backend]:
        """Nearest cluster first; within a cluster, the transceiver with the most room."""
        return sorted((b for b in self.backends if b.room > 0),
                      key=lambda b: (b.cluster.rtt_ms, b.cluster.name, -b.room))

    # ------------------------------------------------------------ API

    async def _post_call(self, request: web.Request) -> web.Response:
        try:
            if request.content_type != "application/sdp":
                raise OfferError("Content-Type must be application/sdp", 415)
            if request.content_length is not None and request.content_length > MAX_OFFER_BYTES:
                raise OfferError(f"offer is larger than {MAX_OFFER_BYTES} bytes", 413)
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise OfferError(f"offer is larger than {MAX_OFFER_BYTES} bytes", 413) from None
            check_offer(body)
        except OfferError as exc:
            return self._refuse(exc.status, str(exc))
        for backend in self._candidates():
            params = {}
            if backend.cluster.advertise:
                host, port = backend.cluster.advertise
                params["candidate"] = f"{host}:{port}"
            try:
                async with self._http.post(f"{backend.url}/sessions", data=body, params=params,
                                           headers={"Content-Type": "application/sdp"}) as r:
                    text = await r.text()
                    if r.status == 503:
                        backend.sessions = backend.capacity  # full until the next poll says
                        continue
                    if r.status != 201:
                        return self._refuse(r.status, text.strip() or f"transceiver said {r.status}")
                    session = r.headers["Location"].rsplit("/", 1)[1]
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, KeyError):
                backend.healthy = False
                continue
            backend.sessions += 1
            self.stats.created += 1
            index = self.backends.index(backend)
            return web.Response(status=201, text=text, content_type="application/sdp",
                                headers={"Location": f"/v1/calls/{backend.cluster.name}~{index}~{session}",
                                         "X-Voiceedge-Cluster": backend.cluster.name})
        return self._refuse(503, "no transceiver has room for a call")

    def _refuse(self, status: int, reason: str) -> web.Response:
        self.stats.refused[status] = self.stats.refused.get(status, 0) + 1
        return web.Response(status=status, text=reason.splitlines()[0] + "\n")

    async def _delete_call(self, request: web.Request) -> web.Response:
        parts = request.match_info["call"].split("~")
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= len(self.backends):
            return web.Response(status=404, text="no such call\n")
        i, session = int(parts[1]), parts[2]
        try:
            async with self._http.delete(f"{self.backends[i].url}/sessions/{session}") as r:
                if r.status == 204:
                    return web.Response(status=204)
                return web.Response(status=r.status, text=(await r.text()) or "\n")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return web.Response(status=502, text="transceiver unreachable\n")

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({
            "calls_created": self.stats.created, "refused": self.stats.refused,
            "transceivers": [{"url": b.url, "cluster": b.cluster.name, "healthy": b.healthy,
                              "sessions": b.sessions, "capacity": b.capacity}
                             for b in self.backends]})


@web.middleware
async def _cors(request: web.Request, handler):
    """Browsers call signaling from pages served elsewhere (see docker-compose.yml)."""
    response = await handler(request)
    response.headers["Access-Control-Allow-Origin"] = "*"
    response.headers["Access-Control-Expose-Headers"] = "Location"
    return response


async def _preflight(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={
        "Access-Control-Allow-Methods": "POST, DELETE, OPTIONS",
        "Access-Control-Allow-Headers": "Content-Type, Authorization"})
