"""The Redis flow cache: flow mappings written off the hot path, read back after a restart.

A worker hands writes and lookups to one background thread through a bounded queue; it never
waits on Redis. A full queue drops the write and counts it. Lookup results come back through a
deque and a wake-up pipe that the worker's epoll loop watches.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass

import redis

from services.logs import log_event

log = logging.getLogger("voiceedge.relay")

_STOP = object()


@dataclass(frozen=True, slots=True)
class CachedFlow:
    next_hop: tuple[str, int]
    prev_hop: tuple[str, int] | None
    cluster_id: int
    transceiver_id: int

    def to_json(self) -> str:
        return json.dumps({
            "next": list(self.next_hop), "prev": list(self.prev_hop) if self.prev_hop else None,
            "cluster": self.cluster_id, "transceiver": self.transceiver_id,
        })

    @classmethod
    def from_json(cls, raw: bytes | str) -> "CachedFlow":
        d = json.loads(raw)
        return cls(next_hop=(d["next"][0], int(d["next"][1])),
                   prev_hop=(d["prev"][0], int(d["prev"][1])) if d["prev"] else None,
                   cluster_id=int(d["cluster"]), transceiver_id=int(d["transceiver"]))


class FlowCache:
    """Background Redis client of one worker."""

    def __init__(self, url: str, relay_id: str, ttl: float, max_queue: int) -> None:
        self._client = redis.Redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25)
        self._relay_id = relay_id
        self._prefix = f"voiceedge:relay:{relay_id}:flow:"
        self._ttl_ms = int(ttl * 1000)
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self.results: collections.deque = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="flowcache", daemon=True)
        # Counters are written by the thread and read by the worker: plain ints, one writer each.
        self.writes = self.writes_dropped = self.lookups = self.hits = self.errors = 0
        self.up = True

    @property
    def wake_fd(self) -> int:
        return self._wake_r

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        try:
            self._queue.put(_STOP, timeout=1)
        except queue.Full:
            pass
        self._thread.join(timeout=2)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _key(self, client: tuple[str, int]) -> str:
        return f"{self._prefix}{client[0]}:{client[1]}"

    def write(self, client: tuple[str, int], flow: CachedFlow) -> None:
        """Queue a write of ``client``'s mapping; never blocks."""
        try:
            self._queue.put_nowait(("set", client, flow))
        except queue.Full:
            self.writes_dropped += 1

    def write_many(self, items: list[tuple[tuple[str, int], CachedFlow]]) -> None:
        """Queue the writes of several mappings, sent to Redis as one pipeline; never blocks."""
        if items:
            try:
                self._queue.put_nowait(("mset", list(items), None))
            except queue.Full:
                self.writes_dropped += len(items)

    def refresh(self, clients: list[tuple[str, int]]) -> None:
        """Queue a TTL refresh for live flows; never blocks."""
        if clients:
            try:
                self._queue.put_nowait(("expire", clients, None))
            except queue.Full:
                self.writes_dropped += len(clients)

    def lookup(self, key, client: tuple[str, int]) -> bool:
        """Queue a lookup; its (key, client, CachedFlow | None) lands in ``results``."""
        try:
            self._queue.put_nowait(("get", client, key))
            return True
        except queue.Full:
            return False

    def drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _set_up(self, up: bool, error: Exception | None = None) -> None:
        if up != self.up:
            if up:
                log_event(log, "redis_up", relay=self._relay_id)
            else:
                log_event(log, "redis_down", level=logging.WARNING, relay=self._relay_id,
                          error=str(error), note="forwarding continues from memory and ufrag")
        self.up = up

    def _run(self) -> None:
        retry_at = 0.0
        # Connect now, not on the first flow: opening the connection (and what redis-py
        # imports then) holds the worker's GIL long enough to show as loop lag on that flow.
        try:
            self._client.ping()
        except (redis.RedisError, OSError) as exc:
            self.errors += 1
            self._set_up(False, exc)
            retry_at = time.monotonic() + 1.0
        while True:
            op = self._queue.get()
            if op is _STOP:
                return
            kind, arg, extra = op
            if not self.up and time.monotonic() < retry_at:
                # Redis is down: fail fast instead of paying a connect timeout per operation.
                self._fail(kind, arg, extra, None)
                continue
            try:
                if kind == "set":
                    self._client.set(self._key(arg), extra.to_json(), px=self._ttl_ms)
                    self.writes += 1
                elif kind == "mset":
                    pipe = self._client.pipeline(transaction=False)
                    for client, flow in arg:
                        pipe.set(self._key(client), flow.to_json(), px=self._ttl_ms)
                    pipe.execute()
                    self.writes += len(arg)
                elif kind == "expire":
                    pipe = self._client.pipeline(transaction=False)
                    for client in arg:
                        pipe.pexpire(self._key(client), self._ttl_ms)
                    pipe.execute()
                else:
                    self.lookups += 1
                    raw = self._client.get(self._key(arg))
                    found = CachedFlow.from_json(raw) if raw else None
                    self.hits += found is not None
                    self._deliver(extra, arg, found)
                self._set_up(True)
            except (redis.RedisError, OSError, ValueError, KeyError) as exc:
                self.errors += 1
                self._set_up(False, exc)
                retry_at = time.monotonic() + 1.0
                self._fail(kind, arg, extra, exc)

    def _fail(self, kind, arg, extra, exc) -> None:
        if kind == "set":
            self.writes_dropped += 1
        elif kind in ("expire", "mset"):
            self.writes_dropped += len(arg)
        else:
            self._deliver(extra, arg, None)

    def _deliver(self, key, client, found) -> None:
        self.results.append((key, client, found))
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # the pipe is full, so the worker is already due to wake
