"""When a process that holds many sessions runs Python's cyclic garbage collector.

CPython collects its oldest generation when the objects promoted since the last such
collection reach a quarter of those that survived it, and that collection walks every object
the collector tracks: about 0.5 us each on the reference VM, ~400 for each live session in the
transceiver (what a freeze adds per session) beside the ~60,000 of its start. With hundreds
of live sessions it stops the event loop for 100-200 ms (the transceiver at 400 sessions:
133 ms, 2026-12-05), every session's media waiting behind it, and growth triggers it (every
quarter more sessions) as churn does.

What a session leaves that only the collector frees (reference cycles) is small: about 350
objects (lists, deques, asyncio events and tasks, SDP and parameter objects), 0.17 ms of
collection a session. So ``SessionCollections``:

- turns the oldest generation's automatic collections off (the young ones stay);
- freezes (``gc.freeze``) what exists at start, and again every ``freeze_every`` sessions
  started, after a collection of what is not frozen yet: a collection then walks the last few
  sessions' objects, not every live session's;
- runs a full collection (unfreezing first) once no session has been live for ``idle_s``,
  where its stall (400 sessions' garbage: 258 ms in the transceiver, 342 ms in the clients'
  process) costs no session anything, or at once when ``max_frozen_ended`` sessions have ended
  since the last one (a process that is never idle): until then a session that ended after it
  was frozen keeps its few hundred objects of cycles. A full collection asked for from
  outside (services/introspect.py, ``?gc=1``) includes the frozen objects too.

Each collection is logged (``gc_full``; ``gc_freeze`` at debug level, one every 16 sessions:
what it freed, how long it took); the loop-lag monitor (services/lag.py) times them as it
times any. (Not how many objects are frozen: ``gc.get_freeze_count`` walks them all, 20-100
ms at a few hundred sessions.)
"""
from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import dataclass

from services.logs import log_event

_NEVER = 2 ** 31 - 1   # a threshold the oldest generation's counter never reaches


@dataclass(frozen=True)
class CollectionPolicy:
    """``freeze_every``: sessions started between two freezes; ``idle_s``: seconds without a
    live session before a full collection; ``max_frozen_ended``: sessions ended since the last
    full collection before one runs although sessions are live."""

    freeze_every: int = 16
    idle_s: float = 5.0
    max_frozen_ended: int = 2000

    def __post_init__(self) -> None:
        if self.freeze_every < 1 or self.max_frozen_ended < 1 or self.idle_s < 0:
            raise ValueError("freeze_every and max_frozen_ended must be at least 1, "
                             "idle_s not negative")


class _Collector:
    """The process's one collector, held by the policies started in it (a process that runs a
    transceiver and clients, or a test running several, starts more than one): the first to
    start saves its thresholds, the last to stop restores them, in whatever order they stop."""

    def __init__(self) -> None:
        self.holders: set[int] = set()
        self.saved: tuple[int, int, int] | None = None

    def hold(self, holder: object) -> None:
        if not self.holders:
            self.saved = gc.get_threshold()
            young, middle, _ = self.saved
            gc.set_threshold(young, middle, _NEVER)
            gc.freeze()
        self.holders.add(id(holder))

    def release(self, holder: object) -> None:
        self.holders.discard(id(holder))
        if not self.holders and self.saved is not None:
            gc.set_threshold(*self.saved)
            self.saved = None
            gc.unfreeze()


_COLLECTOR = _Collector()


class SessionCollections:
    """``with SessionCollections(logger):`` (or ``start``/``stop``) the policy above for this
    process; call ``session_started()`` and ``session_ended(live)`` as sessions come and go.
    ``stop`` restores the collector's thresholds and unfreezes what was frozen."""

    def __init__(self, logger: logging.Logger,
                 policy: CollectionPolicy = CollectionPolicy()) -> None:
        self.policy = policy
        self.logger = logger
        self.started = 0     # sessions started since the last freeze
        self.ended = 0       # sessions ended since the last full collection
        self.freezes = 0
        self.full_collections = 0
        self._active = False
        self._pending: asyncio.Handle | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._full_due = False

    def __enter__(self) -> "SessionCollections":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> None:
        if not self._active:
            _COLLECTOR.hold(self)
            self._active = True

    def stop(self) -> None:
        self._cancel_idle()
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._active:
            _COLLECTOR.release(self)
            self._active = False

    def session_started(self) -> None:
        self._cancel_idle()
        self.started += 1
        if self.started >= self.policy.freeze_every:
            self._schedule()

    def session_ended(self, live: int) -> None:
        """One session ended; ``live`` still are."""
        self.ended += 1
        if self.ended >= self.policy.max_frozen_ended:
            self._full_due = True
            self._schedule()
        elif live <= 0 and self.active and self._idle is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._idle = loop.call_later(self.policy.idle_s, self._on_idle)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _on_idle(self) -> None:
        self._idle = None
        self._full_due = True
        self._schedule()

    def _schedule(self) -> None:
        """On the event loop's next turn, so that an ending session's own objects are
        released first (at once without a running loop)."""
        if not self.active or self._pending is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._run()
            return
        self._pending = loop.call_soon(self._run)

    def _run(self) -> None:
        self._pending = None
        if not self.active:
            return
        full, self._full_due = self._full_due, False
        started = time.perf_counter()
        if full:
            gc.unfreeze()
        freed = gc.collect()
        gc.freeze()
        ms = round((time.perf_counter() - started) * 1000.0, 2)
        if full:
            self.full_collections += 1
            log_event(self.logger, "gc_full", freed=freed, ms=ms, sessions_ended=self.ended)
            self.ended = 0
        else:
            self.freezes += 1
            log_event(self.logger, "gc_freeze", level=logging.DEBUG, freed=freed, ms=ms,
                      sessions_started=self.started)
        self.started = 0
