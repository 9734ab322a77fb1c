"""What a relay worker tells the world: flow log lines, Redis writes, its shared counter row.

All of it is off the datagram's way. A first packet is forwarded before its flow's bookkeeping:
``flow_created`` is written once the batch is sent (``log_created``), and a new flow's Redis
write waits for the next sweep, where all new flows go to Redis in one batch. Waking the Redis
thread at once made it compete for the GIL with the answer to that very packet (~0.5 ms more
on the first round trip of every call, measured on loopback).
"""
from __future__ import annotations

import logging
from typing import Callable

from services.logs import log_event
from services.relay.counters import INDEX, NAMES
from services.relay.flowcache import CachedFlow, FlowCache
from services.relay.flows import Flow

log = logging.getLogger("voiceedge.relay")

_WRITE_BATCH = 1024  # new flows held for Redis before the sweep writes them anyway


class Publisher:
    """One worker's log lines, Redis writes and counters. ``cache`` None: no Redis; ``shared``
    None: no shared counter block (a worker run in-process)."""

    def __init__(self, relay: str, worker: int, cache: FlowCache | None, redis_ttl: float,
                 shared=None) -> None:
        self.relay, self.worker = relay, worker
        self._cache = cache
        self._refresh_ns = int(redis_ttl / 3 * 1e9)
        self._shared = shared
        self._unlogged: list[Flow] = []  # established in this batch: logged once it is sent
        self._unwritten: list[tuple[tuple[str, int], CachedFlow]] = []  # to Redis at the sweep

    def established(self, flow: Flow) -> None:
        """A flow was established: log it after the batch, write it to Redis (if a first
        packet opened it: a recovered flow is there already) at the sweep."""
        if flow.source == "stun":
            self._write(flow)
        self._unlogged.append(flow)

    def moved(self, flow: Flow, before: str) -> None:
        """A flow now goes to another next hop (it was going to ``before``): logged, and its
        Redis entry rewritten at the sweep, so a restarted relay recovers the new route."""
        self._write(flow)
        log_event(log, "flow_moved", relay=self.relay, worker=self.worker,
                  client=f"{flow.client[0]}:{flow.client[1]}", next_hop=flow.next.label,
                  previous_next_hop=before, cluster=flow.cluster_id,
                  transceiver=flow.transceiver_id)

    def _write(self, flow: Flow) -> None:
        if self._cache is None:
            return
        prev = flow.prev
        self._unwritten.append((flow.client, CachedFlow(
            flow.next.addr, prev.addr if prev else None, flow.cluster_id, flow.transceiver_id)))
        if len(self._unwritten) >= _WRITE_BATCH:
            self.write_created()

    def log_created(self) -> None:
        """``flow_created`` for the flows of the batch just sent (after it: not before)."""
        for flow in self._unlogged:
            prev = flow.prev
            log_event(log, "flow_created", relay=self.relay, worker=self.worker,
                      client=f"{flow.client[0]}:{flow.client[1]}", next_hop=flow.next.label,
                      prev_hop=prev.label if prev else None, cluster=flow.cluster_id,
                      transceiver=flow.transceiver_id, origin=flow.source)
        self._unlogged.clear()

    def write_created(self) -> None:
        """Hand the new flows' Redis writes to the cache thread, in one batch."""
        if self._unwritten:
            self._cache.write_many(self._unwritten)
            self._unwritten = []

    def expired(self, flow: Flow, now: int) -> None:
        totals = flow.totals()
        log_event(log, "flow_expired", relay=self.relay, worker=self.worker,
                  client=f"{flow.client[0]}:{flow.client[1]}", next_hop=flow.next.label,
                  age_s=round((now - flow.created) / 1e9, 3), packets_up=totals[0],
                  bytes_up=totals[1], packets_down=totals[2], bytes_down=totals[3])

    def sweep(self, established: dict, now: int) -> None:
        """Redis, at every sweep: the new flows, and a TTL refresh for the live ones not
        refreshed for a third of the TTL."""
        if self._cache is None:
            return
        self.write_created()
        due = now - self._refresh_ns
        stale = [f for f in established.values()
                 if f.refreshed < due and f.last_seen_ns > f.refreshed]
        for flow in stale:
            flow.refreshed = now
        self._cache.refresh([f.client for f in stale])

    def publish(self, counters: Callable[[], dict[str, int]]) -> None:
        """The worker's ``counters()`` into its row of the shared block, which the relay
        serves (not even read without a block: they walk every established flow)."""
        if self._shared is None:
            return
        row = self.worker * len(NAMES)
        for name, value in counters().items():
            self._shared[row + INDEX[name]] = value

    def close(self) -> None:
        """What is still held: logged, and handed to the cache thread."""
        self.log_created()
        if self._cache is not None:
            self.write_created()
