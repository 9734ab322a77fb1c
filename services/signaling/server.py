"""Cluster signaling: ``POST /v1/calls`` (OpenAI Realtime WebRTC convention) onto transceivers.

- ``POST /v1/calls`` with ``Content-Type: application/sdp``: ``201``, the SDP answer, and
  ``Location: /v1/calls/{call}``; ``DELETE`` on it ends the call (``204``); ``PATCH`` on it
  with ``application/trickle-ice-sdpfrag`` restarts the call's ICE (RFC 9725 section 4.3:
  the client's new ice-ufrag, ice-pwd and candidates in, the transceiver's out with ``200``;
  docs/mobility.md), passed to the transceiver that has the call.
- Refusals are one line of text: ``415`` wrong content type, ``413`` oversized body, ``408``
  body too slow, ``400`` malformed or pathological offer / no audio / no BUNDLE, ``503`` no
  transceiver has room. Nothing is allocated and nothing reaches a transceiver for an offer
  refused here: services/signaling/limits.py has the limits (``SignalingConfig.limits``),
  the reasons, and the connection-level ones (headers within ``idle_timeout_s``). Refusals
  are logged at most 20 a second (``suppressed`` says how many were not).
- Geo steering (the regional front): transceivers belong to clusters. Each transceiver's
  ``/status?brief=1`` is polled in the background and the polls are timed; the policy in
  services/signaling/steering.py ranks clusters by measured RTT (the configured ``rtt_ms``
  only seeds it), health and load, with hysteresis. A call goes to the first cluster of that
  ranking that is healthy and under the load threshold, to its transceiver with the most room,
  and falls back to the next when one is down, over the threshold, full (``503``) or
  unreachable. ``call_created`` records the decision; ``steering_changed`` a new preferred
  cluster. A cluster-local signaling is the same with one cluster.
- The answer's one candidate is the cluster's ``advertise`` address (the relay VIP the client
  should use), passed to the transceiver per call. ``X-Voiceedge-Cluster`` names the cluster
  and ``X-Voiceedge-Transceiver`` the transceiver's number in it (1, 2, ...): no internal
  address reaches a client (``call_created`` logs the transceiver's URL).
- The call id in ``Location`` is ``{cluster}~{index}~{session}``: the cluster's name, the
  transceiver's position in this front's list (0-based, clusters in configuration order), and
  the transceiver's session id (``[A-Za-z0-9_-]``, 16 characters). ``DELETE`` of a
  well-formed id the transceiver does not know is ``404``, like a malformed one.
- External edges (bring your own edge, docs/scenarios.md): a cluster may name WHIP endpoints
  (RFC 9725) instead of transceivers. A call is then ``POST``ed to the endpoint's URL as it
  came (no candidate is added) and its ``201`` answer passed on; the ``Location`` the endpoint
  answered (relative ones resolved against its URL, RFC 3986) is kept by this front, and the
  client's ``DELETE`` of the call is sent to it. Such an endpoint has no ``/status``: it is
  healthy while an ``OPTIONS`` of its URL gets any answer below 500, its load is the calls
  this front placed there and has not seen deleted, its capacity the configured one.
- ``GET /v1/ice-servers``: the ICE servers and policy clients should use (TURN credentials
  under the ``turn`` architecture; services/signaling/iceservers.py).
- With API keys (``SignalingConfig.auth``, services/signaling/auth.py, docs/auth.md): calls,
  ICE servers and ``POST /v1/client_secrets`` (a call token minted by a key) need
  ``Authorization: Bearer <key or token>`` (401, 403, one line); a call id then ends with its
  owner's tag, and only that token or its key ends or restarts the call. A key's quotas:
  calls a minute at each front, and concurrent calls, counted by the transceivers
  (``?owner=`` on the call, ``owners`` in their ``/status``): 429 with ``Retry-After``.
- ``GET /call`` (and ``/call.js``): the browser client's page, same origin as ``/v1/calls``
  (services/browser/page.py, docs/browser.md).
- ``GET /healthz``: ``200`` with the transceivers as last probed while at least one answered
  its ``/status``; ``503`` with the same body and a ``reason`` when none did. With API keys
  the counts and the transceivers only for a key; the status alone for anyone else.
- ``GET /metrics`` (with API keys: for a key only, 401 / 403): Prometheus text: calls
  created, refused (by status), over a key's quota (by key and quota), offers rejected before
  a transceiver (by reason), tokens minted, TURN credentials issued, steered (by cluster, and
  whether that was the nearest by RTT), clusters passed over (by why), changes
  of the preferred cluster, each cluster's RTT, each transceiver's probed health and load,
  and the front's warm connections to it; the process's fds, tasks and memory
  (services/introspect.py; ``?gc=1``: after a full garbage collection, ``&trim=1``: and
  malloc_trim, for leak hunting).
- Connections to transceivers: calls go over keep-alive connections opened ahead of them
  (services/signaling/pool.py), so a call does not pay a TCP handshake across the backbone;
  the ``/status`` probes have a connection of their own. ``call_created`` says how long the
  transceiver took (``transceiver_ms``, as seen from here), how long the front held the call
  (``front_ms``) and whether a connection had to be opened for it (``new_connection``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services import introspect
from services.browser.page import page_routes
from services.logs import log_event
from services.signaling.auth import DEFAULT_TOKEN_TTL_S, AuthError, Caller, CallRate, KeyRing
from services.signaling.iceservers import PATH as ICE_SERVERS_PATH
from services.turn.credentials import MIN_TTL_S as TURN_MIN_TTL_S
from services.signaling.iceservers import IceServers, TurnHandout
from services.signaling.limits import (REASONS, BadRequestLog, LogBudget, Refused, RequestLimits,
                                      read_body, read_offer)
from services.signaling.pool import SPARE, ControlPool
from services.signaling.steering import (FULL, OVER_LOAD, UNREACHABLE, ClusterProbe, Decision,
                                         Steering, SteeringConfig)
from services.wire.sdpfrag import CONTENT_TYPE as SDPFRAG, MAX_BYTES as MAX_FRAGMENT_BYTES

log = logging.getLogger("voiceedge.signaling")
_http_log = logging.getLogger("voiceedge.signaling.http")  # aiohttp's, for malformed requests
_http_log.addFilter(BadRequestLog())
_CALL_TIMEOUT_S = 15.0
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what a transceiver's session id can be
_LINGER_S = 1.0   # after refusing a body not read to its end, read (and drop) it this long
_BACKLOG = 1024   # pending connections: a burst of a thousand must not wait on SYN retries
_RESOURCES = 100_000  # WHIP resources (calls to external edges) remembered, oldest dropped
CLIENT_SECRETS_PATH = "/v1/client_secrets"


@dataclass(frozen=True)
class ClusterRoute:
    """A cluster this front may send calls to."""

    name: str
    transceivers: tuple[str, ...]             # control base URLs, e.g. http://10.2.5.2:8900
    advertise: tuple[str, int] | None = None  # candidate for answers; None: the transceiver's
    rtt_ms: float = 0.0                       # from this front's region: seeds steering
    whip: tuple[str, ...] = ()                # WHIP endpoint URLs of an external edge
    capacity: int = 500                       # calls the WHIP endpoints take at once, each

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self.transceivers + self.whip


@dataclass(frozen=True)
class SignalingConfig:
    clusters: tuple[ClusterRoute, ...]
    listen: tuple[str, int] = ("127.0.0.1", 8080)
    poll_interval: float = 1.0
    warm_connections: int = SPARE  # idle connections kept open to each transceiver, at least
    region: str = ""               # this front's region, for the logs
    steering: SteeringConfig = field(default_factory=SteeringConfig)
    limits: RequestLimits = field(default_factory=RequestLimits)
    turn: TurnHandout | None = None  # GET /v1/ice-servers hands out TURN credentials
    # API keys (services/signaling/auth.py): with them, calls, ICE servers and tokens need a
    # credential and a call ends only by its own; None: open (a warning at start)
    auth: KeyRing | None = None

    @classmethod
    def single(cls, transceivers: tuple[str, ...], listen=("127.0.0.1", 8080),
               advertise: tuple[str, int] | None = None,
               warm_connections: int = SPARE) -> "SignalingConfig":
        return cls(clusters=(ClusterRoute("local", transceivers, advertise),), listen=listen,
                   warm_connections=warm_connections)


@dataclass
class _Backend:
    url: str                       # a transceiver's control base URL, or a WHIP endpoint's URL
    cluster: ClusterRoute
    pool: ControlPool
    sessions: int = 0
    capacity: int = 0
    healthy: bool = False
    probe_ms: float | None = None  # the last probe's round trip, None if it opened a connection
    whip: bool = False             # an external edge's WHIP endpoint (no /status)
    # its live calls per API key id: its last probe's count, plus the calls placed since
    owners: dict[str, int] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """Where calls go on the pool's origin: the WHIP URL's path and query."""
        u = urlsplit(self.url)
        return (u.path or "/") + (f"?{u.query}" if u.query else "")

    @property
    def room(self) -> int:
        return self.capacity - self.sessions if self.healthy else -1


@dataclass
class SignalingStats:
    created: int = 0
    refused: dict[int, int] = field(default_factory=dict)         # HTTP status -> calls
    steered: dict[tuple[str, bool], int] = field(default_factory=dict)  # (cluster, nearest)
    passed_over: dict[tuple[str, str], int] = field(default_factory=dict)  # (cluster, outcome)
    changes: dict[tuple[str, str], int] = field(default_factory=dict)  # (from, to)
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    # (key id, "rate" or "concurrent") -> calls refused over that quota (429)
    over_quota: dict[tuple[str, str], int] = field(default_factory=dict)
    tokens_minted: int = 0


class SignalingServer:
    """``async with SignalingServer(config) as s``: serves until the block ends."""

    def __init__(self, config: SignalingConfig) -> None:
        if not any(c.endpoints for c in config.clusters):
            raise ValueError("signaling needs at least one transceiver or WHIP endpoint")
        self.config = config
        if config.warm_connections < 0:
            raise ValueError("warm_connections must be >= 0")
        self.backends = []
        for cluster in config.clusters:
            self.backends += [_Backend(url.rstrip("/"), cluster,
                                       ControlPool(url, config.warm_connections))
                              for url in cluster.transceivers]
            for url in cluster.whip:
                u = urlsplit(url)
                if u.scheme not in ("http", "https") or not u.netloc:
                    raise ValueError(f"a WHIP endpoint is an http(s) URL, not {url!r}")
                backend = _Backend(url, cluster, None, capacity=cluster.capacity, whip=True)
                backend.pool = ControlPool(f"{u.scheme}://{u.netloc}", config.warm_connections,
                                           ping=("OPTIONS", backend.path))
                self.backends.append(backend)
        # call id -> the WHIP resource URL of a call placed with an external edge
        self._resources: OrderedDict[str, str] = OrderedDict()
        self.stats = SignalingStats()
        self._refusal_log = LogBudget()
        self.steering = Steering({c.name: c.rtt_ms for c in config.clusters if c.endpoints},
                                 config.steering)
        self.ice_servers = IceServers(config.turn, config.region)
        self.auth = config.auth
        self._token_calls: dict[str, list[int]] = {}   # token id -> [calls placed, expiry]
        self._rates = CallRate()   # each key's calls a minute at this front
        self._placing: dict[str, int] = {}   # key id -> calls being placed now
        self._process_query = (False, False)  # /metrics?gc=1&trim=1 (services/introspect.py)
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
        # A probe that opens its connection is not timed: the handshake would count twice.
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(_connection_opened)
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=15), trace_configs=[trace],
            connector=aiohttp.TCPConnector(limit_per_host=1, keepalive_timeout=60))
        await self._poll_once()
        # Ready only with warm connections: the first calls must not pay a handshake either.
        await asyncio.gather(*(b.pool.wait_warm() for b in self.backends))
        self._poller = asyncio.create_task(self._poll())
        limits = self.config.limits
        # + 1: aiohttp refuses a body of client_max_size bytes or more
        app = web.Application(client_max_size=limits.max_body_bytes + 1, middlewares=[_cors])
        app.router.add_post("/v1/calls", self._post_call)
        app.router.add_delete("/v1/calls/{call}", self._delete_call)
        app.router.add_patch("/v1/calls/{call}", self._patch_call)
        app.router.add_route("OPTIONS", "/v1/calls", _preflight)
        app.router.add_route("OPTIONS", "/v1/calls/{call}", _preflight)
        app.router.add_get(ICE_SERVERS_PATH, self._get_ice_servers)
        app.router.add_post(CLIENT_SECRETS_PATH, self._post_client_secret)
        app.router.add_route("OPTIONS", CLIENT_SECRETS_PATH, _preflight)
        app.router.add_route("OPTIONS", ICE_SERVERS_PATH, _preflight)
        app.router.add_get("/healthz", self._healthz)
        app.add_routes(page_routes())  # GET /call: the browser client's page (docs/browser.md)
        app.router.add_get("/metrics", self._metrics)
        # The keep-alive timer also runs while a request's headers arrive: it bounds slow
        # headers as well as idle connections.
        self._runner = web.AppRunner(app, access_log=None,
                                     keepalive_timeout=limits.idle_timeout_s,
                                     lingering_time=_LINGER_S, logger=_http_log)
        await self._runner.setup()
        site = web.TCPSite(self._runner, *self.config.listen, backlog=_BACKLOG)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        if self.auth is None:
            log_event(log, "auth_disabled", level=logging.WARNING,
                      note="no API keys: anyone who reaches this front can place calls and "
                           "fetch TURN credentials (--api-keys FILE closes it)")
        log_event(log, "signaling_started", listen=f"{self.config.listen[0]}:{self.port}",
                  clusters=[c.name for c in self.config.clusters], region=self.config.region,
                  preferred=self.steering.preferred,
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
                      refusals_not_logged=self._refusal_log.suppressed_total,
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
        change = self.steering.observe(self._probes())
        if change is not None:
            key = (change.from_cluster or "", change.to_cluster)
            self.stats.changes[key] = self.stats.changes.get(key, 0) + 1
            log_event(log, "steering_changed", region=self.config.region,
                      **{"from": change.from_cluster, "to": change.to_cluster},
                      why=change.why, rtt_ms={c.cluster: round(c.rtt_ms, 3)
                                              for c in self.steering.rank()})

    def _probes(self) -> dict[str, ClusterProbe]:
        """This round per cluster: the fastest timed probe, health, load of the healthy."""
        out = {}
        for cluster in self.config.clusters:
            if not cluster.endpoints:
                continue
            up = [b for b in self.backends if b.cluster is cluster and b.healthy]
            timed = [b.probe_ms for b in up if b.probe_ms is not None]
            out[cluster.name] = ClusterProbe(min(timed) if timed else None, bool(up),
                                             sum(b.sessions for b in up),
                                             sum(b.capacity for b in up))
        return out

    def _load(self) -> dict[str, tuple[int, int]]:
        """Per cluster now: (sessions, capacity) of its healthy transceivers, counting the
        calls placed since the last probe."""
        out: dict[str, tuple[int, int]] = {}
        for b in self.backends:
            if b.healthy:
                s, c = out.get(b.cluster.name, (0, 0))
                out[b.cluster.name] = (s + b.sessions, c + b.capacity)
        return out

    async def _probe(self, backend: _Backend) -> None:
        backend.probe_ms = None
        try:
            status, backend.probe_ms = await self._status(backend)
            if not backend.whip:  # a WHIP endpoint's load is the calls placed here
                backend.sessions = int(status["sessions"])
                backend.capacity = int(status["capacity"])
                backend.owners = {str(k): int(v)
                                  for k, v in (status.get("owners") or {}).items()}
            healthy = True
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError,
                TypeError):
            backend.probe_ms = None
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

    async def _status(self, backend: _Backend) -> tuple[dict, float | None]:
        """The transceiver's /status and the probe's round trip in ms (None when the probe
        had to open its connection first)."""
        ctx = {"opened": False}
        started = time.monotonic()
        if backend.whip:  # alive while it answers at all (RFC 9725 endpoints take OPTIONS)
            async with self._http.options(backend.url, trace_request_ctx=ctx,
                                          timeout=aiohttp.ClientTimeout(total=2)) as r:
                await r.read()
                if r.status >= 500:
                    raise ValueError(f"OPTIONS answered {r.status}")
                status = {}
        else:
            # brief: the load only (a transceiver that does not know it answers in full)
            async with self._http.get(f"{backend.url}/status?brief=1", trace_request_ctx=ctx,
                                      timeout=aiohttp.ClientTimeout(total=2)) as r:
                status = await r.json()
        ms = (time.monotonic() - started) * 1000.0
        return status, None if ctx["opened"] else ms

    # ------------------------------------------------------------ API

    # ------------------------------------------------------------ credentials

    def _caller(self, request: web.Request) -> Caller | None:
        """The request's caller (None: this front is open); AuthError when refused."""
        if self.auth is None:
            return None
        return self.auth.authenticate(request.headers.get("Authorization"))

    def _operator(self, request: web.Request) -> web.Response | None:
        """None when the request may read the front's internals (``/metrics``, the
        transceivers and their addresses in ``/healthz``): an API key, or an open front; else
        the refusal (401, 403 for a call token: it is a browser's, not an operator's)."""
        try:
            caller = self._caller(request)
            if caller is not None and caller.token_id is not None:
                raise AuthError(403, "a call token does not read the front's internals: "
                                     "use an API key")
        except AuthError as exc:
            return self._refuse(exc.status, str(exc), why="auth")
        return None

    def _over_quota(self, caller: Caller | None) -> web.Response | None:
        """None when the caller's key may place a call now (one of its calls a minute taken),
        else the 429 with Retry-After: its live calls at its concurrent quota (counted by the
        transceivers, which every front probes, plus the calls this front placed since and is
        placing), or its calls a minute at this front."""
        if caller is None:
            return None
        key = caller.key_id
        limit, reason, wait = self.auth.concurrent_calls(caller), None, 0.0
        if limit is not None and self._live_calls(key) >= limit:
            reason = f"key {key} has its {limit} concurrent calls"
            wait = max(1.0, self.config.poll_interval)   # when the next probe may see one end
            kind = "concurrent"
        else:
            per_minute = self.auth.calls_per_minute(caller)
            if per_minute is not None:
                wait = self._rates.take(key, per_minute, time.monotonic())
                reason = f"key {key} is over its quota of {per_minute} calls a minute"
                kind = "rate"
        if not wait:
            return None
        self.stats.over_quota[(key, kind)] = self.stats.over_quota.get((key, kind), 0) + 1
        response = self._refuse(429, reason, why="quota")
        response.headers["Retry-After"] = str(max(1, math.ceil(wait)))
        return response

    def _live_calls(self, key: str) -> int:
        return (sum(b.owners.get(key, 0) for b in self.backends if b.healthy)
                + self._placing.get(key, 0))

    def _take_call(self, caller: Caller | None) -> None:
        """One call of a token's limit (counted by this front); AuthError (403) past it."""
        if caller is None or caller.max_calls is None:
            return
        now = time.time()
        if len(self._token_calls) > 10_000:   # forget tokens that have expired
            self._token_calls = {t: v for t, v in self._token_calls.items() if v[1] > now}
        used = self._token_calls.setdefault(caller.token_id, [0, caller.expires or 0])
        if used[0] >= caller.max_calls:
            raise AuthError(403, f"the call token's {caller.max_calls} call(s) are used")
        used[0] += 1

    def _give_back_call(self, caller: Caller | None) -> None:
        if caller is not None and caller.token_id in self._token_calls:
            self._token_calls[caller.token_id][0] -= 1

    async def _post_client_secret(self, request: web.Request) -> web.Response:
        """``POST /v1/client_secrets`` with an API key: a call token (``expires_in`` s,
        ``max_calls``) for a browser that must not hold the key."""
        if self.auth is None:
            return web.Response(status=404, text="this front has no API keys: it mints no "
                                                 "tokens\n")
        try:
            caller = self._caller(request)
            raw = await read_body(request, 4096, self.config.limits.read_timeout_s, "request")
            ask = json.loads(raw) if raw.strip() else {}
            if not isinstance(ask, dict) or set(ask) - {"expires_in", "max_calls"}:
                raise ValueError("the body is a JSON object with expires_in and max_calls")
            ttl, calls = ask.get("expires_in", DEFAULT_TOKEN_TTL_S), ask.get("max_calls")
            if not isinstance(ttl, int) or isinstance(ttl, bool) or not (
                    calls is None or isinstance(calls, int) and not isinstance(calls, bool)):
                raise ValueError("expires_in and max_calls are whole numbers")
            token = self.auth.mint(caller, ttl, calls)
        except AuthError as exc:
            return self._refuse(exc.status, str(exc), why="auth")
        except Refused as exc:
            return web.Response(status=exc.status, text=f"{exc}\n")
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.Response(status=400, text="the body is not JSON\n")
        except ValueError as exc:   # a value out of range
            return web.Response(status=400, text=f"{exc}\n")
        self.stats.tokens_minted += 1
        log_event(log, "token_minted", key=caller.key_id, token=token.id,
                  expires=token.expires, max_calls=token.max_calls)
        return web.json_response({"value": token.value, "id": token.id,
                                  "expires_at": token.expires, "max_calls": token.max_calls},
                                 status=201, headers={"Cache-Control": "no-store"})

    async def _get_ice_servers(self, request: web.Request) -> web.Response:
        try:
            caller = self._caller(request)
            if caller is not None and caller.expires is not None \
                    and caller.expires - time.time() < TURN_MIN_TTL_S:
                raise AuthError(401, "the call token expires too soon for TURN credentials")
        except AuthError as exc:
            return self._refuse(exc.status, str(exc), why="auth")
        body = self.ice_servers.body(None if caller is None else caller.name,
                                     None if caller is None else caller.expires)
        return web.json_response(body, headers={"Cache-Control": "no-store"})

    # ------------------------------------------------------------ calls

    async def _post_call(self, request: web.Request) -> web.Response:
        arrived = time.monotonic()
        try:   # before the body: nothing is read for a caller who may not call
            caller = self._caller(request)
            refused = self._over_quota(caller)
            if refused is not None:
                return refused
            self._take_call(caller)
        except AuthError as exc:
            return self._refuse(exc.status, str(exc), why="auth")
        key = None if caller is None else caller.key_id
        if key is not None:
            self._placing[key] = self._placing.get(key, 0) + 1
        try:
            return await self._place_call(request, caller, arrived)
        finally:
            if key is not None:
                self._placing[key] -= 1
                if not self._placing[key]:
                    del self._placing[key]

    async def _place_call(self, request: web.Request, caller: Caller | None,
                          arrived: float) -> web.Response:
        try:
            body = await read_offer(request, self.config.limits)
        except Refused as exc:
            self._give_back_call(caller)
            self.stats.rejected[exc.reason] += 1
            response = self._refuse(exc.status, str(exc), why=exc.reason)
            if exc.status in (408, 413):  # the rest of the body is not worth waiting for
                response.force_close()
            return response
        ranking = self.steering.rank(self._load())
        # Over the load threshold is a preference: when every healthy cluster is, the call
        # still goes to the first with room.
        order = ([c for c in ranking if c.skip is None]
                 + [c for c in ranking if c.skip == OVER_LOAD])
        failed: dict[str, str] = {}
        for cand in order:
            outcome = await self._place(cand.cluster, body, caller)
            if isinstance(outcome, web.Response):
                self._give_back_call(caller)
                return outcome
            if isinstance(outcome, str):
                failed[cand.cluster] = outcome
                continue
            backend, reply, session = outcome
            backend.sessions += 1
            if caller is not None:
                backend.owners[caller.key_id] = backend.owners.get(caller.key_id, 0) + 1
            cluster = backend.cluster.name
            decision = Decision.of(self.config.region, self.steering.preferred, ranking,
                                   failed, cluster, backend.url)
            self._count(decision)
            self.stats.created += 1
            call = self._call_id(backend, session)
            if caller is not None:   # the owner's tag: any front can tell who may end it
                call = f"{call}~{self.auth.owner_tag(caller, call)}"
            log_event(log, "call_created", call=call, cluster=cluster,
                      nearest=decision.nearest, transceiver=backend.url,
                      transceiver_ms=reply.ms,
                      front_ms=round((time.monotonic() - arrived) * 1000.0, 3),
                      new_connection=reply.new_connection, region=decision.region,
                      preferred=decision.preferred, reason=decision.reason,
                      candidates=list(decision.candidates),
                      caller=None if caller is None else caller.name)
            # the transceiver by its number in its cluster: its address stays in the log
            number = [b for b in self.backends if b.cluster is backend.cluster].index(backend)
            return web.Response(status=201, text=reply.text, content_type="application/sdp",
                                headers={"Location": f"/v1/calls/{call}",
                                         "X-Voiceedge-Cluster": cluster,
                                         "X-Voiceedge-Transceiver": str(number + 1)})
        decision = Decision.of(self.config.region, self.steering.preferred, ranking, failed,
                               None, None)
        self._count(decision)
        self._give_back_call(caller)
        return self._refuse(503, "no transceiver has room for a call",
                            candidates=list(decision.candidates))

    def _count(self, decision: Decision) -> None:
        if decision.cluster is not None:
            key = (decision.cluster, decision.nearest)
            self.stats.steered[key] = self.stats.steered.get(key, 0) + 1
        for c in decision.candidates:
            if c["outcome"] not in ("chosen", "not_tried"):
                key = (c["cluster"], c["outcome"])
                self.stats.passed_over[key] = self.stats.passed_over.get(key, 0) + 1

    async def _place(self, cluster: str, body: bytes, caller: Caller | None):
        """Offer the call to the cluster's transceivers, most room first: (backend, reply,
        session) when one took it, a Response to pass on when one refused it otherwise, or
        FULL / UNREACHABLE when none could."""
        outcome = FULL
        for backend in sorted((b for b in self.backends
                               if b.cluster.name == cluster and b.room > 0),
                              key=lambda b: -b.room):
            params = {}
            if backend.cluster.advertise and not backend.whip:
                host, port = backend.cluster.advertise
                params["candidate"] = f"{host}:{port}"
            if caller is not None and not backend.whip:   # the transceiver counts its calls
                params["owner"] = caller.key_id
            try:
                reply = await backend.pool.request(
                    "POST", backend.path if backend.whip else "/sessions", _CALL_TIMEOUT_S,
                    data=body, params=params, headers={"Content-Type": "application/sdp"})
                if reply.status == 503:
                    if not backend.whip:
                        backend.sessions = backend.capacity  # full until the next poll says
                    continue
                if reply.status != 201:
                    return self._refuse(reply.status,
                                        reply.text.strip() or f"transceiver said {reply.status}")
                location = reply.headers.get("Location")
                if not location:
                    return self._refuse(502, f"{backend.url} answered 201 without a Location")
                session = (self._remember(backend, location) if backend.whip
                           else location.rsplit("/", 1)[1])
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, KeyError):
                self._set_health(backend, False)
                outcome = UNREACHABLE
                continue
            return backend, reply, session
        return outcome

    def _call_id(self, backend: _Backend, session: str) -> str:
        return f"{backend.cluster.name}~{self.backends.index(backend)}~{session}"

    def _remember(self, backend: _Backend, location: str) -> str:
        """Keep the WHIP resource a call to an external edge created (``location`` resolved
        against the endpoint's URL); returns the call's session id: the resource's last path
        segment where that is a usable one, else a random one."""
        resource = urljoin(backend.url, location)
        session = urlsplit(resource).path.rstrip("/").rsplit("/", 1)[-1]
        if (not _SESSION_ID.fullmatch(session)
                or self._call_id(backend, session) in self._resources):
            session = secrets.token_urlsafe(12)
        self._resources[self._call_id(backend, session)] = resource
        while len(self._resources) > _RESOURCES:
            self._resources.popitem(last=False)
        return session

    async def _delete_resource(self, backend: _Backend, call: str) -> web.Response:
        """End a call to an external edge: ``DELETE`` of its WHIP resource."""
        resource = self._resources.pop(call, None)
        if resource is None:
            return web.Response(status=404, text="no such call\n")
        try:
            if urlsplit(resource).netloc == urlsplit(backend.url).netloc:
                u = urlsplit(resource)
                reply = await backend.pool.request(
                    "DELETE", (u.path or "/") + (f"?{u.query}" if u.query else ""),
                    _CALL_TIMEOUT_S)
                status, text = reply.status, reply.text
            else:  # a resource on another origin (RFC 9725 allows it)
                async with self._http.delete(
                        resource, timeout=aiohttp.ClientTimeout(total=_CALL_TIMEOUT_S)) as r:
                    status, text = r.status, await r.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            self._resources[call] = resource  # a retry may reach it
            return web.Response(status=502, text="external edge unreachable\n")
        if 200 <= status < 300 or status == 404:  # ended now, or already
            backend.sessions = max(0, backend.sessions - 1)
        if 200 <= status < 300:
            log_event(log, "call_deleted", call=call)
            return web.Response(status=204)
        return web.Response(status=status, text=text or "\n")

    def _refuse(self, status: int, reason: str, **fields) -> web.Response:
        reason = (reason.splitlines() or [""])[0][:200]
        self.stats.refused[status] = self.stats.refused.get(status, 0) + 1
        skipped = self._refusal_log.take()
        if skipped is not None:
            if skipped:
                fields["suppressed"] = skipped
            log_event(log, "call_refused", status=status, reason=reason, **fields)
        return web.Response(status=status, text=reason + "\n")

    def _owned(self, request: web.Request) -> tuple[str, web.Response | None]:
        """A call's id without its owner's tag, and a refusal unless the request's credential
        created the call (or this front is open)."""
        call = request.match_info["call"]
        base, owner = call, None
        if call.count("~") == 3:
            base, owner = call.rsplit("~", 1)
        if self.auth is None:
            return base, None
        try:
            caller = self._caller(request)
            if owner is None:
                raise AuthError(403, "this credential did not create the call")
            self.auth.check_owner(caller, base, owner)
        except AuthError as exc:
            return base, self._refuse(exc.status, str(exc), why="auth")
        return base, None

    def _backend_of(self, call: str) -> tuple[_Backend, str] | None:
        """The transceiver and session id a call id names, or None if it names none."""
        parts = call.rsplit("~", 2)
        if len(parts) != 3 or not parts[1].isdigit() or not _SESSION_ID.fullmatch(parts[2]):
            return None
        cluster, index, session = parts[0], int(parts[1]), parts[2]
        if index >= len(self.backends) or self.backends[index].cluster.name != cluster:
            return None
        return self.backends[index], session

    def _call_of(self, request: web.Request) -> tuple[str, _Backend, str] | web.Response:
        """The call a request names (its id without the owner's tag), its transceiver and
        session id; or the refusal: not its creator's credential (401, 403), no such call."""
        call, refused = self._owned(request)
        if refused is not None:
            return refused
        found = self._backend_of(call)
        if found is None:
            return web.Response(status=404, text="no such call\n")
        return call, *found

    async def _delete_call(self, request: web.Request) -> web.Response:
        found = self._call_of(request)
        if isinstance(found, web.Response):
            return found
        call, backend, session = found
        if backend.whip:
            return await self._delete_resource(backend, call)
        try:
            reply = await backend.pool.request("DELETE", f"/sessions/{session}", _CALL_TIMEOUT_S)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return web.Response(status=502, text="transceiver unreachable\n")
        if reply.status == 204:
            key = _owner_key(request.match_info["call"])
            if backend.owners.get(key):   # ended: no longer counted until the next probe
                backend.owners[key] -= 1
            log_event(log, "call_deleted", call=call)
            return web.Response(status=204)
        return web.Response(status=reply.status, text=reply.text or "\n")

    async def _patch_call(self, request: web.Request) -> web.Response:
        """An ICE restart of a call: the fragment to the call's transceiver, its answer back."""
        found = self._call_of(request)
        if isinstance(found, web.Response):
            return found
        call, backend, session = found
        if backend.whip:
            return web.Response(status=501, text="ICE restart through the front is for the "
                                                 "project's transceivers\n")
        if request.content_type != SDPFRAG:
            return web.Response(status=415, text=f"Content-Type must be {SDPFRAG}\n")
        try:
            body = await read_body(request, MAX_FRAGMENT_BYTES, self.config.limits.read_timeout_s,
                                   "fragment")
        except Refused as exc:
            return web.Response(status=exc.status, text=f"{exc}\n")
        try:
            reply = await backend.pool.request("PATCH", f"/sessions/{session}", _CALL_TIMEOUT_S,
                                               data=body, headers={"Content-Type": SDPFRAG})
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return web.Response(status=502, text="transceiver unreachable\n")
        if reply.status == 200:
            log_event(log, "call_ice_restart", call=call,
                      transceiver_ms=reply.ms)
            return web.Response(status=200, text=reply.text, content_type=SDPFRAG)
        return web.Response(status=reply.status, text=reply.text or "\n")

    async def _healthz(self, request: web.Request) -> web.Response:
        """200 while a transceiver answered its last probe; 503 (same body, with a reason)
        when none did: this front cannot place a call. The counts and the transceivers
        (their internal addresses) only for an API key, when the front has keys: a load
        balancer's probe needs the status alone."""
        body: dict = {"status": "ok"}
        if self.auth is None or (request.headers.get("Authorization")
                                 and self._operator(request) is None):
            body.update(calls_created=self.stats.created, refused=self.stats.refused,
                        transceivers=[{"url": b.url, "cluster": b.cluster.name,
                                       "healthy": b.healthy, "sessions": b.sessions,
                                       "capacity": b.capacity} for b in self.backends])
        if any(b.healthy for b in self.backends):
            return web.json_response(body)
        body.update(status="unavailable",
                    reason="no transceiver answered its last /status probe")
        return web.json_response(body, status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        refused = self._operator(request)
        if refused is not None:
            return refused
        self._process_query = introspect.query_flags(request.query)
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
        quota = CounterMetricFamily("voiceedge_signaling_calls_over_quota",
                                    "calls refused over their key's quota (429), by key and "
                                    "quota (rate: calls a minute, concurrent: live calls)",
                                    labels=["key", "quota"])
        for (key, kind), n in sorted(s.stats.over_quota.items()):
            quota.add_metric([key, kind], n)
        yield quota
        yield CounterMetricFamily("voiceedge_signaling_tokens_minted",
                                  "call tokens minted (POST /v1/client_secrets)",
                                  value=s.stats.tokens_minted)
        yield CounterMetricFamily("voiceedge_signaling_turn_credentials_issued",
                                  "TURN credentials handed out (GET /v1/ice-servers)",
                                  value=s.ice_servers.issued)
        rejected = CounterMetricFamily(
            "voiceedge_signaling_offers_rejected", "requests refused before any transceiver "
            "saw them, by reason (services/signaling/limits.py)", labels=["reason"])
        for reason, n in s.stats.rejected.items():
            rejected.add_metric([reason], n)
        yield rejected
        steered = CounterMetricFamily(
            "voiceedge_signaling_calls_steered", "calls placed, by cluster; nearest=\"false\" "
            "when the nearest cluster was down or full", labels=["cluster", "nearest"])
        for (cluster, nearest), n in sorted(s.stats.steered.items()):
            steered.add_metric([cluster, str(nearest).lower()], n)
        yield steered
        passed = CounterMetricFamily(
            "voiceedge_signaling_steering_passed_over", "calls that did not go to a cluster "
            "ranked before or nearer than the chosen one (or refused), by why: down, over_load_threshold, "
            "full, unreachable, hysteresis", labels=["cluster", "why"])
        for (cluster, why), n in sorted(s.stats.passed_over.items()):
            passed.add_metric([cluster, why], n)
        yield passed
        changes = CounterMetricFamily(
            "voiceedge_signaling_steering_changes", "changes of the preferred cluster",
            labels=["from", "to"])
        for (src, dst), n in sorted(s.stats.changes.items()):
            changes.add_metric([src, dst], n)
        yield changes
        rtt = GaugeMetricFamily("voiceedge_signaling_cluster_rtt_ms",
                                "RTT to the cluster as steering sees it (median of the timed "
                                "probes; the configured RTT until one is timed)",
                                labels=["cluster", "measured"])
        preferred = GaugeMetricFamily("voiceedge_signaling_cluster_preferred",
                                      "1 for the cluster calls are offered to first",
                                      labels=["cluster"])
        for c in s.steering.rank():
            rtt.add_metric([c.cluster, str(c.measured).lower()], c.rtt_ms)
            preferred.add_metric([c.cluster], int(c.cluster == s.steering.preferred))
        yield rtt
        yield preferred
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
        yield from introspect.metric_families("voiceedge_signaling", *s._process_query)


async def _connection_opened(session, ctx, params) -> None:
    if isinstance(ctx.trace_request_ctx, dict):
        ctx.trace_request_ctx["opened"] = True


@web.middleware
async def _cors(request: web.Request, handler):
    """Browsers may call signaling from a page served by another origin (a test page)."""
    response = await handler(request)
    response.headers["Access-Control-Allow-Origin"] = "*"
    response.headers["Access-Control-Expose-Headers"] = "Location"
    return response


async def _preflight(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={
        "Access-Control-Allow-Methods": "GET, POST, PATCH, DELETE, OPTIONS",
        "Access-Control-Allow-Headers": "Content-Type, Authorization"})


def _owner_key(call: str) -> str | None:
    """The API key id a call id's owner part names (``...~<key id>.<token>.<tag>``)."""
    if call.count("~") != 3:
        return None
    return call.rsplit("~", 1)[1].split(".", 1)[0] or None
