"""Flows recovered from Redis: what a worker does with non-STUN datagrams from unknown clients.

After a relay restart a client's media arrives before its next STUN consent check. Its first
non-STUN datagram asks the flow cache (flowcache.py) for the client's mapping; up to
``_RECOVERY_BACKLOG`` datagrams wait for the answer, at most ``max_lookups`` lookups are in
flight, and a miss is remembered for ``_NEGATIVE_TTL`` so the client's next datagrams do not
ask again. A hit counts only when its next hop is still the route table's.
"""
from __future__ import annotations

from typing import Iterator

from services.relay.admission import FirstPacketLimiter
from services.relay.config import RouteTable
from services.relay.counters import Drops
from services.relay.flowcache import CachedFlow, FlowCache

_RECOVERY_BACKLOG = 8
_NEGATIVE_TTL = 1.0


class Recovery:
    """A worker's Redis lookups in flight and its recent misses; drops counted in ``drops``."""

    def __init__(self, cache: FlowCache, routes: RouteTable, max_lookups: int,
                 limiter: FirstPacketLimiter, drops: Drops) -> None:
        self.cache = cache
        self._routes = routes
        self._max_lookups = max_lookups
        self._limiter = limiter
        self._drops = drops
        self._lookups: dict = {}   # key -> (previous hop, datagrams waiting for Redis)
        self._negative: dict = {}  # key -> monotonic ns until which Redis is not asked again

    @property
    def in_flight(self) -> int:
        return len(self._lookups)

    def ask(self, key, ip: bytes, client: tuple[str, int], prev, datagram: bytes, hl: int,
            now: int) -> None:
        """Ask Redis for the flow of a non-STUN datagram (``hl`` bytes of hop header, then
        the client's) from an unknown client, or let it wait for the lookup already asked.

        Only a new lookup spends a token of the source's bucket: the datagrams that wait for
        one, or that a negative answer covers, cost nothing (after a relay restart without
        Redis, a client's media must not eat the tokens its next consent check needs).
        """
        if self._negative.get(key, 0) > now:
            self._drops.add("unknown_not_stun")
            return
        entry = self._lookups.get(key)
        if entry is not None:
            if len(entry[1]) >= _RECOVERY_BACKLOG:
                self._drops.add("recovery_backlog")
            else:
                entry[1].append((datagram, hl))
            return
        if len(self._lookups) >= self._max_lookups:
            self._drops.add("recovery_busy")
            return
        if not self._limiter.allow(ip, now):
            self._drops.add("rate_limited")
            return
        if not self.cache.lookup(key, client):
            self._drops.add("unknown_not_stun")
            return
        self._lookups[key] = (prev, [(datagram, hl)])

    def answers(self) -> Iterator[tuple[object, tuple[str, int], object, CachedFlow | None,
                                        list[tuple[bytes, int]]]]:
        """(key, client, previous hop, the cached flow, the datagrams that waited) for each
        answer Redis gave since the last call; the cached flow is None for a miss and for a
        hit whose next hop is no longer the route table's."""
        self.cache.drain_wake()
        results = self.cache.results
        while results:
            key, client, found = results.popleft()
            prev, waiting = self._lookups.pop(key, (None, []))
            if found is not None and found.next_hop != self._routes.next_hop(
                    found.cluster_id, found.transceiver_id):
                found = None
            yield key, client, prev, found, waiting

    def refuse(self, key, waiting: int, now: int) -> None:
        """Redis did not vouch for the client: drop what waited, do not ask again soon."""
        self._negative[key] = now + int(_NEGATIVE_TTL * 1e9)
        self._drops.add("unknown_not_stun", waiting)

    def sweep(self, now: int) -> None:
        if self._negative:
            self._negative = {k: t for k, t in self._negative.items() if t > now}
