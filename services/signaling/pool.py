"""Warm keep-alive connections from a signaling front to one transceiver's control API.

A front usually sits a backbone round trip away from the clusters it steers to. A call that
finds no idle keep-alive connection to its transceiver pays a TCP handshake first: one more
backbone RTT of signaling (~230 ms from apac-se to na-east). So the pool opens connections
*ahead* of the calls and keeps them open:

- ``spare`` idle connections at least, and at least as many as the most calls that were in
  flight at once on this transceiver in the last ``window_s`` seconds (a burst teaches the pool
  its size), plus one that lets an idle connection be refreshed while the others stay ready;
- a call takes the idle connection used last, and when that leaves fewer than
  the target, new ones are opened in the background, off the call's path;
- a connection idle for ``refresh_s`` is used once (``GET /ping``) while there is slack, so a
  connection that died (a transceiver restart) is replaced before a call needs it; beyond the
  target, the oldest idle connections are closed.

Each connection is a ``_Lane``: an aiohttp session whose connector holds at most one
connection, so the pool knows which connection a request uses and whether it had to open one
(aiohttp's tracing), which a shared connector would not say. The front's status probes use
their own connection (services/signaling/server.py), never one of these: a probe in flight
must not leave a call without a warm connection.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

import aiohttp

SPARE = 8             # idle connections kept at least, per transceiver (--warm-connections)
WINDOW_S = 60.0       # a burst of calls sizes the pool for this long
REFRESH_S = 30.0      # an idle connection is used again after this long
MAX_CONNECTIONS = 256  # per transceiver; a call beyond it waits for one to come back
OPEN_TIMEOUT_S = 5.0
KEEPALIVE_S = 3600.0  # the front never closes a warm connection for being idle


@dataclass
class Reply:
    status: int
    text: str
    headers: dict[str, str]
    new_connection: bool   # the request had to open a TCP connection (a handshake) first
    ms: float              # request sent -> whole reply read


class _Lane:
    """One keep-alive connection (an aiohttp session limited to one)."""

    def __init__(self, pool: "ControlPool") -> None:
        self.pool = pool
        self.used = time.monotonic()
        self.opened = False  # set by the tracing hook when a request opens the connection
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(self._connection_opened)
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1, keepalive_timeout=KEEPALIVE_S),
            trace_configs=[trace])

    async def _connection_opened(self, session, ctx, params) -> None:
        self.opened = True

    async def request(self, method: str, path: str, timeout: float, **kwargs) -> Reply:
        self.opened = False
        started = time.monotonic()
        async with self.http.request(method, self.pool.url + path,
                                     timeout=aiohttp.ClientTimeout(total=timeout),
                                     **kwargs) as r:
            text = await r.text()
            reply = Reply(r.status, text, dict(r.headers), self.opened,
                          round((time.monotonic() - started) * 1000.0, 3))
        self.used = time.monotonic()
        return reply

    async def close(self) -> None:
        await self.http.close()


class ControlPool:
    """Warm connections to one transceiver (``url``: its control API base URL)."""

    def __init__(self, url: str, spare: int = SPARE, window_s: float = WINDOW_S,
                 refresh_s: float = REFRESH_S, ping: tuple[str, str] = ("GET", "/ping")) -> None:
        """``ping``: the (method, path) that opens and refreshes a connection (any answer
        will do: an external edge's WHIP endpoint has no /ping, ``OPTIONS`` of its path)."""
        if spare < 0:
            raise ValueError("spare must be >= 0")
        self.url = url.rstrip("/")
        self.ping = ping
        self.spare = spare
        self.window_s = window_s
        self.refresh_s = refresh_s
        self.enabled = False       # filled only while the transceiver is known to answer
        self.in_flight = 0
        self.opened_ahead = 0      # connections opened in the background
        self.opened_on_call = 0    # connections a call had to open (it paid a handshake)
        self._idle: list[_Lane] = []   # least recently used first
        self._opening = 0
        self._peaks: deque[tuple[int, int]] = deque()  # (whole second, most calls in flight)
        self._tasks: set[asyncio.Task] = set()
        self._filler: asyncio.Task | None = None
        self._refreshing = False
        self._slot = asyncio.Condition()

    # ------------------------------------------------------------ sizing

    @property
    def warm(self) -> int:
        """Idle connections ready for a call now."""
        return len(self._idle)

    @property
    def connections(self) -> int:
        return len(self._idle) + self.in_flight + self._opening

    def wanted(self) -> int:
        """Idle connections to keep: ``spare``, or the largest burst of the window, plus one."""
        horizon = int(time.monotonic() - self.window_s)
        while self._peaks and self._peaks[0][0] < horizon:
            self._peaks.popleft()
        burst = max((n for _, n in self._peaks), default=0)
        return max(self.spare, burst) + 1

    def _note_in_flight(self) -> None:
        second = int(time.monotonic())
        if self._peaks and self._peaks[-1][0] == second:
            if self.in_flight > self._peaks[-1][1]:
                self._peaks[-1] = (second, self.in_flight)
        else:
            self._peaks.append((second, self.in_flight))

    # ------------------------------------------------------------ calls

    async def request(self, method: str, path: str, timeout: float = 15.0, **kwargs) -> Reply:
        """Send one request over a warm connection (a new one only if none is idle)."""
        lane = await self._take()
        ok = False
        try:
            reply = await lane.request(method, path, timeout, **kwargs)
            if reply.new_connection:
                self.opened_on_call += 1
            ok = True
            return reply
        finally:
            await self._give_back(lane, ok)

    async def _take(self) -> _Lane:
        while not self._idle and self.connections >= MAX_CONNECTIONS:
            async with self._slot:
                await self._slot.wait()
        lane = self._idle.pop() if self._idle else _Lane(self)
        self.in_flight += 1
        self._note_in_flight()
        self._top_up()
        return lane

    async def _give_back(self, lane: _Lane, ok: bool) -> None:
        self.in_flight -= 1
        if ok and self.enabled:
            self._idle.append(lane)
        else:  # a failed request may have left the connection in any state
            self._spawn(lane.close())
        async with self._slot:
            self._slot.notify()

    # ------------------------------------------------------------ keeping connections warm

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _top_up(self) -> None:
        if (self.enabled and (self._filler is None or self._filler.done())
                and len(self._idle) + self._opening < self.wanted()):
            self._filler = self._spawn(self.fill())

    async def fill(self) -> bool:
        """Open connections until ``wanted()`` are idle; False if the transceiver refused."""
        while self.enabled:
            missing = min(self.wanted() - len(self._idle) - self._opening,
                          MAX_CONNECTIONS - self.connections)
            if missing <= 0:
                return True
            results = await asyncio.gather(*(self._open() for _ in range(missing)))
            if not all(results):
                return False
        return False

    async def _open(self) -> bool:
        lane = _Lane(self)
        self._opening += 1
        try:
            await lane.request(*self.ping, OPEN_TIMEOUT_S)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            await lane.close()
            return False
        except asyncio.CancelledError:
            await lane.close()
            raise
        finally:
            self._opening -= 1
        self.opened_ahead += 1
        if self.enabled:
            self._idle.append(lane)
        else:
            await lane.close()
        return True

    def maintain(self) -> None:
        """Periodic care (the front's status poll calls it): top up, refresh one idle
        connection while there is slack, close idle connections beyond the target."""
        if not self.enabled:
            return
        wanted = self.wanted()
        while len(self._idle) > wanted:
            self._spawn(self._idle.pop(0).close())
        self._top_up()
        now = time.monotonic()
        if (not self._refreshing and len(self._idle) >= wanted and self._idle
                and now - self._idle[0].used > self.refresh_s):
            self._refreshing = True
            self._spawn(self._refresh(self._idle.pop(0)))

    async def _refresh(self, lane: _Lane) -> None:
        keep = False
        try:
            reply = await lane.request(*self.ping, OPEN_TIMEOUT_S)
            if reply.new_connection:  # the old one had died: replaced off the calls' path
                self.opened_ahead += 1
            keep = self.enabled
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            pass
        finally:
            self._refreshing = False
            if keep:
                self._idle.append(lane)
            else:
                await lane.close()

    def enable(self) -> None:
        """The transceiver answers: keep connections warm from now on."""
        self.enabled = True
        self._top_up()

    def disable(self) -> None:
        """The transceiver stopped answering: its connections are suspect; close them."""
        self.enabled = False
        idle, self._idle = self._idle, []
        for lane in idle:
            self._spawn(lane.close())

    async def wait_warm(self) -> None:
        """Until the background filling that is under way (if any) has finished."""
        if self._filler is not None and not self._filler.done():
            await asyncio.shield(self._filler)

    async def close(self) -> None:
        self.disable()
        if self._filler is not None:
            self._filler.cancel()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
