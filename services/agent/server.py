"""The agent's HTTP/WebSocket server: one WebSocket per call session, plus health and metrics.

``/metrics`` also says what the process holds (open fds, asyncio tasks, memory:
services/introspect.py; ``/metrics?gc=1``: after a full garbage collection, ``&trim=1``: and
malloc_trim, for leak hunting)."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from aiohttp import WSCloseCode, WSMsgType, web
from prometheus_client import CONTENT_TYPE_LATEST

from services import introspect
from services.agent import metrics, pcm, protocol
from services.agent.config import AgentConfig
from services.agent.frameslink import FramesLink
from services.agent.session import Session, SessionCounters
from services.logs import log_event

log = logging.getLogger("voiceedge.agent")

CLOSE_TIMEOUT = 2.0  # how long a close waits for the peer's answer


@dataclass
class _Open:
    """An open session and what its handler runs for it."""

    session: Session
    ws: web.WebSocketResponse
    pump: asyncio.Task | None = None  # reads the WebSocket, feeds the session
    finished: asyncio.Event = field(default_factory=asyncio.Event)


def reply_frames(config: AgentConfig) -> list[bytes]:
    """What every reply says, as frames: the tone, or the spoken line (services/speech.py;
    SpeechError without espeak-ng); PCM, or encoded to Opus once (``reply_codec``)."""
    if config.reply == "speech":
        from services import speech
        frames = pcm.to_frames(speech.synthesize(speech.AGENT_LINE))
    else:
        frames = pcm.tone(config.reply_freq_hz, config.reply_ms, config.reply_peak_dbfs)
    if config.reply_codec == "opus":
        from services import libopus
        encoder = libopus.Encoder("voip", libopus.AUTO_BITRATE, 10)
        frames = [encoder.encode(frame) for frame in frames]
    return frames


class AgentServer:
    """``await start()`` binds and serves; ``await stop()`` closes every session (1001) and the
    listener. Also an async context manager."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.sessions_total = 0
        self.port = 0
        self._open: dict[str, _Open] = {}
        self._closed = SessionCounters()  # counters of sessions that have ended
        self._reply = reply_frames(config)
        self._registry = metrics.registry_for(self)
        self._process = _ProcessCollector()
        self._registry.register(self._process)
        self._runner: web.AppRunner | None = None
        self._stopping = False
        self.links: dict[str, FramesLink] = {}   # frames links by name (frameslink.py)

    @property
    def sessions(self) -> dict[str, Session]:
        """The open sessions by id (a snapshot)."""
        return {session_id: o.session for session_id, o in self._open.items()}

    def totals(self) -> SessionCounters:
        """Counters summed over every session, ended or open."""
        total = SessionCounters()
        total.add(self._closed)
        for o in self._open.values():
            total.add(o.session.counters)
        return total

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/sessions/{session_id}", self._session)
        app.router.add_get("/v1/sessions", self._list_sessions)
        app.router.add_get("/v1/frames/{link}", self._frames_link)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=CLOSE_TIMEOUT)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.config.host, self.config.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        log_event(log, "agent_started", host=self.config.host, port=self.port,
                  mode=self.config.mode)

    async def stop(self) -> None:
        if self._runner is None:
            return
        self._stopping = True
        # Each handler closes its own WebSocket once its reader is stopped: aiohttp's close() from
        # another task while one reads would drop the connection without waiting for the peer.
        open_now = list(self._open.values())
        for o in open_now:
            if o.pump is not None:
                o.pump.cancel()
        await asyncio.gather(*(o.finished.wait() for o in open_now))
        await self._runner.cleanup()
        self._runner = None
        log_event(log, "agent_stopped", sessions_total=self.sessions_total,
                  **self.totals().as_dict())

    async def __aenter__(self) -> "AgentServer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def _websocket(self, request: web.Request, name: str, what: str,
                   taken: bool) -> web.StreamResponse:
        """A WebSocket to prepare for ``name`` (a session id or a link name), or the refusal:
        400 bad name, 503 stopping, 409 taken, 426 not an upgrade."""
        if not protocol.valid_session_id(name):
            return _refuse(400, f"{what} id must match {protocol.SESSION_ID.pattern}")
        if self._stopping:
            return _refuse(503, "agent is stopping")
        if taken:
            return _refuse(409, f"{what} {name} is already open")
        # Uncompressed frames are written whole, so the reply task and the reader can both send
        # without a lock.
        ws = _WebSocket(compress=False, heartbeat=self.config.heartbeat_s,
                        max_msg_size=self.config.max_event_bytes, timeout=CLOSE_TIMEOUT)
        if not ws.can_prepare(request).ok:
            return _refuse(426, "this is a WebSocket endpoint", headers={"Upgrade": "websocket"})
        return ws

    async def _session(self, request: web.Request) -> web.StreamResponse:
        session_id = request.match_info["session_id"]
        ws = self._websocket(request, session_id, "session", session_id in self._open)
        if not isinstance(ws, _WebSocket):
            return ws
        # Registered before the first await, so a concurrent duplicate gets 409.
        o = self._open[session_id] = _Open(Session(session_id, self.config, ws, self._reply,
                                                        self.links.get), ws)
        self.sessions_total += 1
        opened = time.monotonic()
        try:
            await ws.prepare(request)
            log_event(log, "session_opened", session=session_id, peer=request.remote)
            if not self._stopping:
                o.pump = asyncio.create_task(self._pump(o), name=f"agent-session-{session_id}")
                await asyncio.wait([o.pump])
            if o.pump is None or o.pump.cancelled():  # stop() came first or stopped the reader
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"agent stopping")
        finally:
            if o.pump is not None and not o.pump.done():
                o.pump.cancel()
                await asyncio.wait([o.pump])
            await o.session.close()
            del self._open[session_id]
            self._closed.add(o.session.counters)
            o.finished.set()
            log_event(log, "session_closed", session=session_id, client=o.session.client,
                      close_code=ws.close_code, seconds=round(time.monotonic() - opened, 3),
                      **o.session.counters.as_dict())
        if o.pump is not None and not o.pump.cancelled() and o.pump.exception() is not None:
            raise o.pump.exception()
        return ws

    async def _frames_link(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["link"]
        ws = self._websocket(request, name, "frames link", name in self.links)
        if not isinstance(ws, _WebSocket):
            return ws
        link = self.links[name] = FramesLink(name, ws)
        try:
            await ws.prepare(request)
            log_event(log, "frames_link_opened", link=name, peer=request.remote)
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    await link.received(msg.data)
                elif msg.type == WSMsgType.ERROR:
                    break
        except ConnectionError:
            pass
        finally:
            del self.links[name]
            log_event(log, "frames_link_closed", link=name, batches=link.batches_in,
                      records=link.records_in, unknown_channel=link.unknown_channel,
                      bad_records=link.bad_records)
        return ws

    @staticmethod
    async def _pump(o: _Open) -> None:
        ws, session = o.ws, o.session
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    await session.on_frame(msg.data)
                elif msg.type == WSMsgType.TEXT:
                    await session.on_text(msg.data)
                elif msg.type == WSMsgType.ERROR:
                    return
                if session.ended:
                    await ws.close(code=WSCloseCode.OK, message=b"session ended")
                    return
        except ConnectionError:
            pass  # the peer went away mid-send

    async def _list_sessions(self, request: web.Request) -> web.Response:
        return web.json_response({"sessions": [
            {"session_id": s.id, "started": s.started, "client": s.client,
             "counters": s.counters.as_dict()} for s in self.sessions.values()]})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "stopping" if self._stopping else "ok",
                                  "mode": self.config.mode,
                                  "sessions_active": len(self._open),
                                  "sessions_total": self.sessions_total},
                                 status=503 if self._stopping else 200)

    async def _metrics(self, request: web.Request) -> web.Response:
        self._process.collect_garbage, self._process.trim_heap = introspect.query_flags(
            request.query)
        return web.Response(body=metrics.render(self._registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})


class _WebSocket(web.WebSocketResponse):
    """aiohttp's WebSocket response, without a heartbeat once closed.

    aiohttp 3.14 re-arms the heartbeat timer for data that arrives after ``close()`` began (the
    peer's answering close frame): the timer then holds the closed response, its request,
    transport and buffers for 1.5 heartbeats (30 s) after every session, a retention that
    grows with the call rate (bench/hostile/hygiene.py). A hook of aiohttp's internals
    (``_on_data_received``); without it the heartbeat works as before."""

    def _on_data_received(self) -> None:
        if not self.closed:
            super()._on_data_received()


class _ProcessCollector:
    """The agent process's open fds, asyncio tasks and memory, at scrape time (after a full
    garbage collection when ``collect_garbage``, malloc's free memory handed back when
    ``trim_heap``)."""

    collect_garbage = trim_heap = False

    def collect(self):
        yield from introspect.metric_families("voiceedge_agent", self.collect_garbage,
                                              self.trim_heap)


def _refuse(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)
