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
- The call id in ``Location`` is ``{cluster}~{index}~{session}``: the cluster's name, the
  transceiver's position in this front's list (0-based, clusters in configuration order), and
  the transceiver's session id (``[A-Za-z0-9_-]``, 16 characters). ``DELETE`` of a
  well-formed id the transceiver does not know is ``404``, like a malformed one.
- ``GET /healthz``: ``200`` with the transceivers as last probed while at least one answered
  its ``/status``; ``503`` with the same body and a ``reason`` when none did.
- ``GET /metrics``: Prometheus text: calls created, refused (by status), steered (by
  cluster, and whether that was the nearest), each transceiver's probed health and load, and
  the front's warm connections to it.
- Connections to transceivers: calls go over keep-alive connections opened ahead of them
  (services/signaling/pool.py), so a call does not pay a TCP handshake across the backbone;
  the ``/status`` probes have a connection of their own. ``call_created`` says how long the
  transceiver took (``transceiver_ms``, as seen from here), how long the front held the call
  (``front_ms``) and whether a connection had to be opened for it (``new_connection``).
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.logs import log_event
from services.signaling.pool import SPARE, ControlPool
from services.wire.sdp import MAX_OFFER_BYTES, OfferError, check_offer

log = logging.getLogger("voiceedge.signaling")
_CALL_TIMEOUT_S = 15.0
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what a transceiver's session id can be


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
    warm_connections: int = SPARE  # idle connections kept open to each transceiver, at least

    @classmethod
    def single(cls, transceivers: tuple[str, ...], listen=("127.0.0.1", 8080),
               advertise: tuple[str, int] | None = None,
               warm_connections: int = SPARE) -> "SignalingConfig":
        return cls(clusters=(ClusterRoute("local", transceivers, advertise),), listen=listen,
                   warm_connections=warm_connections)


@dataclass
class _Backend:
    url: str
    cluster: ClusterRoute
    pool: ControlPool
    sessions: int = 0
    capacity: int = 0
    healthy: bool = False

    @property
    def room(self) -> int:
        return self.capacity - self.sessions if self.healthy else -1


@dataclass
class SignalingStats:
    created: int = 0
    refused: dict[int, int] = field(default_factory=dict)         # HTTP status -> calls
    steered: dict[tuple[str, bool], int] = field(default_factory=dict)  # (cluster, nearest)


class SignalingServer:
    """``async with SignalingServer(config) as s``: serves until the block ends."""

    def __init__(self, config: SignalingConfig) -> None:
        if not any(c.transceivers for c in config.clusters):
            raise ValueError("signaling needs at least one transceiver")
        self.config = config
        if config.warm_connections < 0:
            raise ValueError("warm_connections must be >= 0")
        self.backends = [_Backend(url.rstrip("/"), cluster,
                                  ControlPool(url, config.warm_connections))
                         for cluster in config.clusters for url in cluster.transceivers]
        self.stats = SignalingStats()
        self._nearest = min((c for c in config.clusters if c.transceivers),
                            key=lambda c: (c.rtt_ms, c.name)).name
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(self))
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
        # Status probes only: one connection per transceiver, never one a call could use.
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=15),
            connector=aiohttp.TCPConnector(limit_per_host=1, keepalive_timeout=60))
        await self._poll_once()
        # Ready only with warm connections: the first calls must not pay a handshake either.
        await asyncio.gather(*(b.pool.wait_warm() for b in self.backends))
        self._poller = asyncio.create_task(self._poll())
        app = web.Application(client_max_size=MAX_OFFER_BYTES + 1, middlewares=[_cors])
        app.router.add_post("/v1/calls", self._post_call)
        app.router.add_delete("/v1/calls/{call}", self._delete_call)
        app.router.add_route("OPTIONS", "/v1/calls", _preflight)
        app.router.add_route("OPTIONS", "/v1/calls/{call}", _preflight)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, *self.config.listen)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        log_event(log, "signaling_started", listen=f"{self.config.listen[0]}:{self.port}",
                  clusters=[c.name for c in self.config.clusters],
                  healthy=[b.url for b in self.backends if b.healthy],
                  warm_connections={b.url: b.pool.warm for b in self.backends})

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        await asyncio.gather(*(b.pool.close() for b in self.backends))
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            log_event(log, "signaling_stopped", calls_created=self.stats.created,
                      calls_refused={str(k): v for k, v in self.stats.refused.items()},
                      connections_opened={b.url: {"ahead": b.pool.opened_ahead,
                                                  "on_call": b.pool.opened_on_call}
                                          for b in self.backends})

    # ------------------------------------------------------------ backends

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval)
            await self._poll_once()

    async def _poll_once(self) -> None:
        await asyncio.gather(*(self._probe(b) for b in self.backends))

    async def _probe(self, backend: _Backend) -> None:
        try:
            status = await self._status(backend)
            backend.sessions, backend.capacity = int(status["sessions"]), int(status["capacity"])
            healthy = True
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError,
                TypeError):
            healthy = False
        self._set_health(backend, healthy)
        backend.pool.maintain()

    def _set_health(self, backend: _Backend, healthy: bool) -> None:
        if healthy != backend.healthy:
            log_event(log, "transceiver_up" if healthy else "transceiver_down",
                      level=logging.INFO if healthy else logging.WARNING,
                      transceiver=backend.url, cluster=backend.cluster.name)
            if healthy:
                backend.pool.enable()
            else:
                backend.pool.disable()
        backend.healthy = healthy

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
        arrived = time.monotonic()
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
                reply = await backend.pool.request(
                    "POST", "/sessions", _CALL_TIMEOUT_S, data=body, params=params,
                    headers={"Content-Type": "application/sdp"})
                text = reply.text
                if reply.status == 503:
                    backend.sessions = backend.capacity  # full until the next poll says
                    continue
                if reply.status != 201:
                    return self._refuse(reply.status,
                                        text.strip() or f"transceiver said {reply.status}")
                session = reply.headers["Location"].rsplit("/", 1)[1]
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, KeyError):
                self._set_health(backend, False)
                continue
            backend.sessions += 1
            cluster = backend.cluster.name
            nearest = cluster == self._nearest
            self.stats.created += 1
            self.stats.steered[cluster, nearest] = self.stats.steered.get((cluster, nearest), 0) + 1
            call = f"{cluster}~{self.backends.index(backend)}~{session}"
            log_event(log, "call_created", call=call, cluster=cluster, nearest=nearest,
                      transceiver=backend.url, transceiver_ms=reply.ms,
                      front_ms=round((time.monotonic() - arrived) * 1000.0, 3),
                      new_connection=reply.new_connection)
            return web.Response(status=201, text=text, content_type="application/sdp",
                                headers={"Location": f"/v1/calls/{call}",
                                         "X-Voiceedge-Cluster": cluster})
        return self._refuse(503, "no transceiver has room for a call")

    def _refuse(self, status: int, reason: str) -> web.Response:
        reason = reason.splitlines()[0]
        self.stats.refused[status] = self.stats.refused.get(status, 0) + 1
        log_event(log, "call_refused", status=status, reason=reason)
        return web.Response(status=status, text=reason + "\n")

    def _backend_of(self, call: str) -> tuple[_Backend, str] | None:
        """The transceiver and session id a call id names, or None if it names none."""
        parts = call.rsplit("~", 2)
        if len(parts) != 3 or not parts[1].isdigit() or not _SESSION_ID.fullmatch(parts[2]):
            return None
        cluster, index, session = parts[0], int(parts[1]), parts[2]
        if index >= len(self.backends) or self.backends[index].cluster.name != cluster:
            return None
        return self.backends[index], session

    async def _delete_call(self, request: web.Request) -> web.Response:
        call = request.match_info["call"]
        found = self._backend_of(call)
        if found is None:
            return web.Response(status=404, text="no such call\n")
        backend, session = found
        try:
            reply = await backend.pool.request("DELETE", f"/sessions/{session}", _CALL_TIMEOUT_S)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return web.Response(status=502, text="transceiver unreachable\n")
        if reply.status == 204:
            log_event(log, "call_deleted", call=call)
            return web.Response(status=204)
        return web.Response(status=reply.status, text=reply.text or "\n")

    async def _healthz(self, request: web.Request) -> web.Response:
        """200 while a transceiver answered its last probe; 503 (same body, with a reason)
        when none did: this front cannot place a call."""
        body = {"status": "ok",
                "calls_created": self.stats.created, "refused": self.stats.refused,
                "transceivers": [{"url": b.url, "cluster": b.cluster.name, "healthy": b.healthy,
                                  "sessions": b.sessions, "capacity": b.capacity}
                                 for b in self.backends]}
        if any(b.healthy for b in self.backends):
            return web.json_response(body)
        body.update(status="unavailable",
                    reason="no transceiver answered its last /status probe")
        return web.json_response(body, status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})


class _Collector:
    """The signaling front's counters and its view of the transceivers, at scrape time."""

    def __init__(self, server: SignalingServer) -> None:
        self._server = server

    def collect(self):
        s = self._server
        created = CounterMetricFamily("voiceedge_signaling_calls_created", "calls answered (201)")
        created.add_metric([], s.stats.created)
        yield created
        refused = CounterMetricFamily("voiceedge_signaling_calls_refused",
                                      "calls refused, by HTTP status", labels=["status"])
        for status, n in sorted(s.stats.refused.items()):
            refused.add_metric([str(status)], n)
        yield refused
        steered = CounterMetricFamily(
            "voiceedge_signaling_calls_steered", "calls placed, by cluster; nearest=\"false\" "
            "when the nearest cluster was down or full", labels=["cluster", "nearest"])
        for (cluster, nearest), n in sorted(s.stats.steered.items()):
            steered.add_metric([cluster, str(nearest).lower()], n)
        yield steered
        labels = ["cluster", "transceiver"]
        gauges = {
            "healthy": GaugeMetricFamily("voiceedge_signaling_transceiver_healthy",
                                         "1 if the transceiver answered its last /status probe",
                                         labels=labels),
            "sessions": GaugeMetricFamily("voiceedge_signaling_transceiver_sessions",
                                          "live sessions, as last probed (plus calls placed since)",
                                          labels=labels),
            "capacity": GaugeMetricFamily("voiceedge_signaling_transceiver_capacity",
                                          "session capacity, as last probed", labels=labels)}
        gauges["warm"] = GaugeMetricFamily(
            "voiceedge_signaling_transceiver_warm_connections",
            "idle keep-alive connections ready for calls", labels=labels)
        opened = CounterMetricFamily(
            "voiceedge_signaling_transceiver_connections_opened",
            "TCP connections opened to the transceiver's control API: when=\"ahead\" in the "
            "background, when=\"on_call\" by a call that found none warm (it paid a handshake)",
            labels=labels + ["when"])
        for b in s.backends:
            gauges["healthy"].add_metric([b.cluster.name, b.url], int(b.healthy))
            gauges["sessions"].add_metric([b.cluster.name, b.url], b.sessions)
            gauges["capacity"].add_metric([b.cluster.name, b.url], b.capacity)
            gauges["warm"].add_metric([b.cluster.name, b.url], b.pool.warm)
            opened.add_metric([b.cluster.name, b.url, "ahead"], b.pool.opened_ahead)
            opened.add_metric([b.cluster.name, b.url, "on_call"], b.pool.opened_on_call)
        yield from gauges.values()
        yield opened


@web.middleware
async def _cors(request: web.Request, handler):
    """Browsers may call signaling from a page served by another origin (a test page)."""
    response = await handler(request)
    response.headers["Access-Control-Allow-Origin"] = "*"
    response.headers["Access-Control-Expose-Headers"] = "Location"
    return response


async def _preflight(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={
        "Access-Control-Allow-Methods": "POST, DELETE, OPTIONS",
        "Access-Control-Allow-Headers": "Content-Type, Authorization"})
