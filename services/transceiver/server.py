"""The transceiver process: sessions on one shared UDP socket (or one per session), and the
control API that signaling calls.

Control API (HTTP, internal):
- ``POST /sessions`` with ``Content-Type: application/sdp``, optional query
  ``candidate=HOST:PORT`` (the address to advertise, e.g. the relay VIP of the client's
  region; shared mode only): ``201`` with the SDP answer and ``Location: /sessions/{id}``;
  ``4xx`` with a one-line reason for a bad offer; ``503`` when at capacity.
  ``owner=KEY_ID`` (the API key the front placed the call under: ``/status?brief=1`` counts
  the live sessions of each, the fronts' concurrent-call quota).
- ``DELETE /sessions/{id}``: ``204``, or ``404``.
- ``GET /status``: JSON (ids, mode, sessions, capacity, UDP sockets held by this process, the
  process's open fds, asyncio tasks and memory (services/introspect.py; ``?gc=1``: after a full
  garbage collection, ``&trim=1``: and malloc_trim, for leak hunting), the shared socket's
  state sizes).
- ``GET /metrics``: Prometheus text (the same process gauges and mux state sizes included).
- ``GET /ping``: ``204``, nothing else: signaling fronts open and refresh their warm keep-alive
  connections with it (services/signaling/pool.py). Idle connections are kept an hour.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass

import aiohttp
import aioice.ice
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services import introspect
from services.config import parse_hostport
from services.logs import log_event
from services.transceiver import ice
from services.transceiver.opus import OpusSettings
from services.transceiver.agentframes import AgentFrames
from services.eventloops import running_loop_name
from services.gcpolicy import SessionCollections
from services.transceiver.mux import SharedSocket
from services.mediapaths import NATIVE
from services.transceiver.nativeplane import NativeMedia
from services.transceiver.pacing import FrameClock
from services.transceiver.session import Session
from services.icerestart import IceCredentials
from services.transceiver.session import RestartRefused
from services.wire.sdp import OfferError, check_offer
from services.wire.sdpfrag import CONTENT_TYPE as SDPFRAG, IceFragment, SdpFragError
from services.wire.ufrag import DEV_SECRET, DEV_SECRET_WARNING, UfragCodec, is_dev_secret
from voiceedge.errors import ConfigError

log = logging.getLogger("voiceedge.transceiver")
_OWNER = re.compile(r"[a-z0-9-]{1,32}")   # an API key id (services/signaling/auth.py)
_KEEPALIVE_S = 3600.0  # idle control-API connections are kept this long


@dataclass(frozen=True)
class TransceiverConfig:
    cluster_id: int
    transceiver_id: int
    mode: str = ice.SHARED
    media_host: str = "0.0.0.0"                 # shared socket / per-session sockets bind here
    media_port: int = 0                         # shared mode: the shared socket's port
    advertise: tuple[str, int] | None = None    # default candidate (shared mode)
    control: tuple[str, int] = ("127.0.0.1", 8900)
    agent_url: str | None = None                # ws://host:port of the agent
    secret: bytes = DEV_SECRET
    max_sessions: int = 200
    setup_timeout: float = 10.0
    certificates_ahead: int = 32                # DTLS certificates made before the calls
    opus: OpusSettings = OpusSettings()         # the outbound encoder
    media_path: str = "python"                  # or "native": nativeplane.py
    srtp: str = "openssl"                       # the native path's SRTP (mediapaths.py)
    agent_codecs: tuple[str, ...] = ("opus", "pcm16")  # native path: offered to the agent
    # Test-only (bench/hostile/hygiene.py's quick run): aioice's consent-check interval in
    # seconds instead of its 5 (0: aioice's), so that a vanished client's session is reaped in
    # seconds. Process-wide: every ICE agent of a transceiver process is one of its sessions.
    test_consent_interval_s: float = 0.0


def udp_sockets_of_this_process() -> int:
    """UDP sockets (IPv4 and IPv6) this process holds, from /proc."""
    inodes = set()
    for fd in os.listdir("/proc/thread-self/fd"):
        try:
            target = os.readlink(f"/proc/thread-self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    # thread-self: the namespace of the calling thread (see topology/netns.py).
    for table in ("/proc/thread-self/net/udp", "/proc/thread-self/net/udp6"):
        try:
            with open(table) as f:
                next(f)
                count += sum(1 for line in f if line.split()[9] in inodes)
        except OSError:
            pass
    return count


class TransceiverServer:
    """Owns the shared socket, the sessions and the control API. ``async with`` or start/stop."""

    def __init__(self, config: TransceiverConfig) -> None:
        self.config = config
        self._codec = UfragCodec(config.secret)
        self.sessions: dict[str, Session] = {}
        # live sessions per API key id (?owner=), and each owned session's key
        self.owners: dict[str, int] = {}
        self._owner_of: dict[str, str] = {}
        self.mux: SharedSocket | None = None
        self._http: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.control_port: int | None = None
        self.sessions_total = 0
        self.sessions_refused = 0
        self._registry = CollectorRegistry()
        self._registry.register(_Collector(self))
        self.certificates = ice.CertificatePool(config.certificates_ahead)
        self.clock = FrameClock()  # paces every session's outgoing audio
        self.native: NativeMedia | None = None
        self.gc_policy = SessionCollections(log)  # from start on (services/gcpolicy.py)

    async def __aenter__(self) -> "TransceiverServer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def dev_secret(self) -> bool:
        """Whether ufrags are signed with the public development secret."""
        return is_dev_secret(self.config.secret)

    @property
    def lag_clock(self) -> FrameClock:
        """The loop-lag monitor samples this clock's beats (services/lifecycle.py)."""
        return self.clock

    @property
    def media_address(self) -> tuple[str, int] | None:
        return self.mux.address if self.mux else None

    async def start(self) -> None:
        ice.install()
        cfg = self.config
        if cfg.test_consent_interval_s > 0:
            aioice.ice.CONSENT_INTERVAL = cfg.test_consent_interval_s
        self.certificates.fill()  # off every call's path from the first one on
        if cfg.mode == ice.SHARED:
            self.mux = await SharedSocket.open(cfg.media_host, cfg.media_port)
        # One agent WebSocket per session (and the frames link) on this session: aiohttp's
        # default pool of 100 connections made the 101st call wait for another to end.
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        if cfg.media_path == NATIVE:
            self.native = NativeMedia(self.mux, self.clock, max(cfg.max_sessions, 1), cfg.opus,
                                      srtp=cfg.srtp)
            await self.native.start(AgentFrames(cfg.agent_url)
                                    if cfg.agent_url else None)
        app = web.Application(client_max_size=256 * 1024)
        app.router.add_post("/sessions", self._post_session)
        app.router.add_delete("/sessions/{id}", self._delete_session)
        app.router.add_patch("/sessions/{id}", self._patch_session)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/ping", _ping)
        # Fronts keep connections open ahead of calls; do not close them under their feet.
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=_KEEPALIVE_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, cfg.control[0], cfg.control[1])
        await site.start()
        self.control_port = site._server.sockets[0].getsockname()[1]
        self.gc_policy.start()
        log_event(log, "transceiver_started", cluster=cfg.cluster_id,
                  transceiver=cfg.transceiver_id, mode=cfg.mode, media_path=cfg.media_path,
                  media=f"{self.media_address[0]}:{self.media_address[1]}" if self.mux else None,
                  control=f"{cfg.control[0]}:{self.control_port}",
                  ufrag_dev_secret=self.dev_secret)
        if self.dev_secret:
            log_event(log, "ufrag_dev_secret", level=logging.WARNING, cluster=cfg.cluster_id,
                      transceiver=cfg.transceiver_id, note=DEV_SECRET_WARNING)

    async def stop(self) -> None:
        await asyncio.gather(*(s.close("transceiver stopping") for s in list(self.sessions.values())),
                             return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self.native is not None:
            await self.native.stop()
        if self._http is not None:
            await self._http.close()
        self.certificates.close()
        self.clock.close()
        if self.mux is not None:
            self.mux.read_kernel_drops()
        log_event(log, "transceiver_stopped", sessions_total=self.sessions_total,
                  sessions_refused=self.sessions_refused,
                  mux=vars(self.mux.counters) if self.mux else None,
                  native=self.native.counters() if self.native else None)
        if self.mux is not None:
            self.mux.close()
        self.gc_policy.stop()

    # ------------------------------------------------------------ sessions

    def _advertise(self, request: web.Request) -> tuple[str, int]:
        raw = request.query.get("candidate")
        if raw:
            try:
                return parse_hostport(raw, "candidate")
            except ConfigError as exc:
                raise OfferError(str(exc)) from None
        if self.config.advertise:
            return self.config.advertise
        host, port = self.mux.address
        if host in ("0.0.0.0", "::"):
            raise OfferError("no candidate to advertise: start with --advertise or pass "
                             "?candidate=HOST:PORT", 500)
        return host, port

    def _new_plan(self, request: web.Request) -> ice.IcePlan:
        cfg = self.config
        while True:
            ufrag = self._codec.encode(cfg.cluster_id, cfg.transceiver_id)
            if all(s.plan.ufrag != ufrag for s in self.sessions.values()):
                break
        if cfg.mode == ice.SHARED:
            return ice.IcePlan(ufrag=ufrag, mode=cfg.mode, mux=self.mux,
                               advertise=self._advertise(request))
        return ice.IcePlan(ufrag=ufrag, mode=cfg.mode, bind_host=cfg.media_host,
                           plane_readable=self.native is not None)

    async def create_session(self, offer: str, plan: ice.IcePlan,
                             received: float | None = None) -> tuple[Session, str]:
        """A session for ``offer`` and its answer. ``received``: when the request arrived
        (monotonic), for ``answer_ms`` in the log; default now."""
        started = time.monotonic()
        received = started if received is None else received
        session_id = secrets.token_urlsafe(12)
        with ice.certificates(self.certificates):
            session = Session(session_id, plan, self.config.agent_url, self._http,
                              self.config.setup_timeout, self._forget, self.config.opus,
                              self.clock, self.native, self.config.agent_codecs)
        self.sessions[session_id] = session
        self.gc_policy.session_started()
        try:
            answer = await session.start(offer)
        except Exception:
            await session.close("offer rejected")
            raise
        self.sessions_total += 1
        done = time.monotonic()
        log_event(log, "session_created", session=session_id, ufrag=plan.ufrag,
                  candidate=f"{plan.advertise[0]}:{plan.advertise[1]}" if plan.advertise else None,
                  answer_ms=round((done - received) * 1000.0, 3),
                  negotiate_ms=round((done - started) * 1000.0, 3))
        return session, answer

    def _forget(self, session: Session) -> None:
        if self.sessions.pop(session.id, None) is not None:
            self.gc_policy.session_ended(len(self.sessions))
            owner = self._owner_of.pop(session.id, None)
            if owner is not None:
                left = self.owners[owner] - 1
                if left:
                    self.owners[owner] = left
                else:
                    del self.owners[owner]

    async def _post_session(self, request: web.Request) -> web.Response:
        received = time.monotonic()
        try:
            if request.content_type != "application/sdp":
                raise OfferError("Content-Type must be application/sdp", 415)
            if len(self.sessions) >= self.config.max_sessions:
                self.sessions_refused += 1
                return web.Response(status=503, text="transceiver at capacity\n")
            owner = request.query.get("owner")
            if owner is not None and not _OWNER.fullmatch(owner):
                raise OfferError("owner is an API key id: a-z, 0-9, -; 1-32")
            body = await request.read()
            check_offer(body)
            plan = self._new_plan(request)
            try:
                session, answer = await self.create_session(body.decode(), plan, received)
            except OfferError:
                raise
            except Exception as exc:  # aiortc's parse or negotiation errors
                raise OfferError(f"offer could not be negotiated: {exc}".splitlines()[0]) from None
        except OfferError as exc:
            return web.Response(status=exc.status, text=f"{exc}\n")
        if owner is not None and session.id in self.sessions:   # not closed meanwhile
            self._owner_of[session.id] = owner
            self.owners[owner] = self.owners.get(owner, 0) + 1
        return web.Response(status=201, text=answer, content_type="application/sdp",
                            headers={"Location": f"/sessions/{session.id}"})

    async def _patch_session(self, request: web.Request) -> web.Response:
        """An ICE restart (RFC 8445 section 9), as a WHIP ``PATCH`` carries it (RFC 9725
        section 4.3): the client's new ice-ufrag, ice-pwd and candidates in, ours out (200,
        the same content type); the session, its DTLS and its agent stay."""
        session = self.sessions.get(request.match_info["id"])
        if session is None:
            return web.Response(status=404, text="no such session\n")
        if request.content_type != SDPFRAG:
            return web.Response(status=415, text=f"Content-Type must be {SDPFRAG}\n")
        try:
            offer = IceFragment.parse(await request.read())   # client_max_size bounds it
            answer = session.restart_ice(offer, self._new_credentials())
        except SdpFragError as exc:
            return web.Response(status=400, text=f"{exc}\n")
        except RestartRefused as exc:
            return web.Response(status=exc.status, text=f"{exc}\n")
        return web.Response(status=200, text=answer.to_text(), content_type=SDPFRAG)

    def _new_credentials(self) -> IceCredentials:
        """Credentials for a restarted session: a fresh routing ufrag (this transceiver's
        hint, new random bits) no live session has, and a fresh password."""
        cfg = self.config
        taken = {s.ufrag for s in self.sessions.values()}
        while True:
            ufrag = self._codec.encode(cfg.cluster_id, cfg.transceiver_id)
            if ufrag not in taken:
                return IceCredentials.random(ufrag)

    async def _delete_session(self, request: web.Request) -> web.Response:
        session = self.sessions.get(request.match_info["id"])
        if session is None:
            return web.Response(status=404, text="no such session\n")
        await session.close("deleted")
        return web.Response(status=204)

    def status(self, collect: bool = False, trim: bool = False) -> dict:
        """What /status says; ``collect``: a full garbage collection before the process's
        figures, ``trim``: and malloc's free memory handed back."""
        cfg = self.config
        if self.mux is not None:
            self.mux.read_kernel_drops()
        return {
            "cluster_id": cfg.cluster_id, "transceiver_id": cfg.transceiver_id,
            "mode": cfg.mode, "sessions": len(self.sessions), "capacity": cfg.max_sessions,
            "sessions_total": self.sessions_total, "udp_sockets": udp_sockets_of_this_process(),
            "ufrag_dev_secret": self.dev_secret,
            "media": list(self.media_address) if self.mux else None,
            "mux": vars(self.mux.counters) if self.mux else None,
            "mux_state": self.mux_state(),
            "media_path": cfg.media_path,
            "srtp": cfg.srtp if self.native else None,
            "event_loop": running_loop_name(),
            "native": ({"sessions": self.native.sessions, **self.native.counters()}
                       if self.native else None),
            "process": introspect.snapshot(collect, trim),
            "session_details": [
                {"id": sid, "state": sess.state, "ufrag": sess.ufrag,
                 "age_s": round(time.monotonic() - sess.stats.created, 3),
                 "setup_s": (round(sess.stats.connected_at - sess.stats.created, 4)
                             if sess.stats.connected_at else None),
                 "frames_to_agent": sess.stats.frames_to_agent,
                 "events_to_agent": sess.stats.events_to_agent,
                 "events_to_client": sess.stats.events_to_client, **sess.rx.fields()}
                for sid, sess in self.sessions.items()],
        }

    def mux_state(self) -> dict[str, int] | None:
        """What the shared socket holds now (learned addresses, ufrags, parked datagrams, hop
        cache entries, and the native plane's sessions); None in port-per-session mode."""
        if self.mux is None:
            return None
        sizes = self.mux.state_sizes()
        if self.native is not None:
            sizes["native_sessions"] = self.native.sessions
            sizes["native_plane_sessions"] = self.native.plane.sessions
        return sizes

    def brief_status(self) -> dict:
        """What ``/status?brief=1`` says: the front's health probe (once a second per front)
        reads only the load, so it must not cost what the full status does (every fd, every
        session, the process: 2.25 ms of CPU at 100 sessions)."""
        cfg = self.config
        return {"cluster_id": cfg.cluster_id, "transceiver_id": cfg.transceiver_id,
                "mode": cfg.mode, "sessions": len(self.sessions), "capacity": cfg.max_sessions,
                "media_path": cfg.media_path, "owners": dict(self.owners)}

    async def _status(self, request: web.Request) -> web.Response:
        if request.query.get("brief") == "1":
            return web.json_response(self.brief_status())
        return web.json_response(self.status(*introspect.query_flags(request.query)))

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._registry),
                            content_type="text/plain", charset="utf-8")


async def _ping(request: web.Request) -> web.Response:
    return web.Response(status=204)


class _Collector:
    def __init__(self, server: TransceiverServer) -> None:
        self._server = server

    def collect(self):
        s = self._server
        g = GaugeMetricFamily("voiceedge_transceiver_sessions", "live sessions")
        g.add_metric([], len(s.sessions))
        yield g
        c = CounterMetricFamily("voiceedge_transceiver_sessions_created", "sessions answered")
        c.add_metric([], s.sessions_total)
        yield c
        r = CounterMetricFamily("voiceedge_transceiver_sessions_refused", "503 at capacity")
        r.add_metric([], s.sessions_refused)
        yield r
        made = CounterMetricFamily(
            "voiceedge_transceiver_certificates_made", "DTLS certificates made: when=\"ahead\" "
            "in the background, when=\"on_call\" while answering (the pool had run dry)",
            labels=["when"])
        made.add_metric(["ahead"], s.certificates.made_ahead)
        made.add_metric(["on_call"], s.certificates.made_on_call)
        yield made
        dev = GaugeMetricFamily("voiceedge_ufrag_dev_secret", "1 when routing ufrags use the "
                                "public development secret", labels=["service"])
        dev.add_metric(["transceiver"], int(s.dev_secret))
        yield dev
        if s.mux is not None:
            s.mux.read_kernel_drops()
            for name, value in vars(s.mux.counters).items():
                m = CounterMetricFamily(f"voiceedge_transceiver_mux_{name}", f"shared socket: {name}")
                m.add_metric([], value)
                yield m
        for name, value in (s.mux_state() or {}).items():
            m = GaugeMetricFamily(f"voiceedge_transceiver_mux_state_{name}",
                                  f"shared socket, held now: {name}")
            m.add_metric([], value)
            yield m
        yield from introspect.metric_families("voiceedge_transceiver")
