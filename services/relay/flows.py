"""A relay worker's flow table: client address -> next hop, pending or established.

A flow's counters and last-seen time live in a record of uint64 words that the fast path
(_fastpath.c) reads and updates in place; ``FlowTable.fast`` maps the IPv4 flows' keys to their
records' addresses. Only established flows are in it: a pending flow (admission.py) stays on
the slow path until its next hop answers.
"""
from __future__ import annotations

import socket

from services.relay import _fastpath, mmsg
from services.relay.admission import PendingFlows, source_keys
from services.relay.counters import Drops
from services.wire import hop as hopwire

# Flow record words shared with _fastpath.c (its REC_* enum).
(NEXT_NAME, NEXT_NAMELEN, HEADER, HEADER_LEN, CLIENT_NAME, CLIENT_NAMELEN, PREV_NAME,
 PREV_NAMELEN, NEXT_KEY, UP_PACKETS, UP_BYTES, DOWN_PACKETS, DOWN_BYTES,
 LAST_SEEN_NS, UFRAG_LEN, UFRAG) = range(16)
UFRAG_MAX = 24  # bytes: words UFRAG..UFRAG+2
assert _fastpath.REC_WORDS == 18 and _fastpath.MMSGHDR_SIZE == mmsg.MMSGHDR_SIZE


def sockaddr_key(raw: bytes):
    """Flow key of a client sockaddr: IPv4 an int of port+address, IPv6 bytes of the same.

    The fast path derives the identical IPv4 key from a hop header, whose bytes 2-7 mirror a
    sockaddr_in (see services/wire/hop.py).
    """
    if raw[0] | (raw[1] << 8) == socket.AF_INET6:
        return raw[2:4] + raw[8:24]
    return int.from_bytes(raw[:8], "little") >> 16


def header_key(header: bytes | memoryview):
    """Flow key of the client named in a hop header (same value as ``sockaddr_key``)."""
    if header[1] & hopwire.FLAG_IPV6:
        return bytes(header[2:20])
    return int.from_bytes(header[:8], "little") >> 16


class Hop:
    """A next or previous hop, with its sockaddr prebuilt for sendmmsg."""

    __slots__ = ("addr", "name", "name_ptr", "namelen", "key", "label")

    def __init__(self, addr: tuple[str, int]) -> None:
        self.addr = addr
        self.name = bytearray(mmsg.sockaddr(*addr))
        self.name_ptr = mmsg.address_of(self.name)
        self.namelen = len(self.name) if ":" in addr[0] else 16
        self.key = sockaddr_key(bytes(self.name))
        self.label = f"{addr[0]}:{addr[1]}"


class Flow:
    """A client address, where its datagrams go, and its counters.

    The counters and the last-seen time live in ``record`` (uint64 words) so the fast path can
    update them in place; the properties read them back.
    """

    __slots__ = ("key", "client", "client_name", "header", "next", "prev", "cluster_id",
                 "transceiver_id", "created", "refreshed", "source", "record", "words",
                 "record_ptr", "pending", "ip_key", "prefix_key", "moving")

    def __init__(self, key, client: tuple[str, int], next_hop: Hop, prev: Hop | None,
                 cluster_id: int, transceiver_id: int, now_ns: int, source: str,
                 client_name: bytes | None = None) -> None:
        self.key = key
        self.client = client
        self.client_name = bytearray(client_name or mmsg.sockaddr(*client))
        self.ip_key, self.prefix_key = source_keys(self.client_name)
        self.pending = False  # see services/relay/admission.py
        # a check from the flow's address routed elsewhere, not answered yet (worker.py):
        # (next hop, cluster id, transceiver id, until when in ns, the check's server ufrag)
        self.moving: tuple[Hop, int, int, int, bytes] | None = None
        self.header = bytearray(hopwire.encode_sockaddr(self.client_name, hopwire.TO_SERVER))
        self.cluster_id, self.transceiver_id = cluster_id, transceiver_id
        self.created = self.refreshed = now_ns
        self.source = source
        self.record = bytearray(8 * _fastpath.REC_WORDS)
        self.words = memoryview(self.record).cast("Q")
        self.record_ptr = mmsg.address_of(self.record)
        w = self.words
        w[HEADER] = mmsg.address_of(self.header)
        w[HEADER_LEN] = len(self.header)
        w[CLIENT_NAME] = mmsg.address_of(self.client_name)
        w[CLIENT_NAMELEN] = len(self.client_name) if ":" in client[0] else 16
        w[LAST_SEEN_NS] = now_ns
        self.route(next_hop, prev)

    def route(self, next_hop: Hop, prev: Hop | None) -> None:
        self.next, self.prev = next_hop, prev
        w = self.words
        w[NEXT_NAME], w[NEXT_NAMELEN] = next_hop.name_ptr, next_hop.namelen
        w[NEXT_KEY] = next_hop.key if isinstance(next_hop.key, int) else 0
        w[PREV_NAME], w[PREV_NAMELEN] = (prev.name_ptr, prev.namelen) if prev else (0, 0)

    @property
    def ufrag(self) -> bytes:
        """The server ufrag the flow was last routed by (empty: none yet, e.g. recovered
        from Redis). The fast path hands Python a STUN Binding request naming another."""
        start = 8 * UFRAG
        return bytes(self.record[start:start + self.words[UFRAG_LEN]])

    @ufrag.setter
    def ufrag(self, value: bytes) -> None:
        if len(value) > UFRAG_MAX:
            value = b""  # not a routing ufrag: its checks stay on Python's path
        start = 8 * UFRAG
        self.record[start:start + UFRAG_MAX] = value.ljust(UFRAG_MAX, b"\0")
        self.words[UFRAG_LEN] = len(value)

    def count_up(self, size: int, now_ns: int) -> None:
        w = self.words
        w[UP_PACKETS] += 1
        w[UP_BYTES] += size
        w[LAST_SEEN_NS] = now_ns

    def count_down(self, size: int, now_ns: int) -> None:
        w = self.words
        w[DOWN_PACKETS] += 1
        w[DOWN_BYTES] += size
        w[LAST_SEEN_NS] = now_ns

    @property
    def last_seen_ns(self) -> int:
        return self.words[LAST_SEEN_NS]

    def totals(self) -> tuple[int, int, int, int]:
        w = self.words
        return w[UP_PACKETS], w[UP_BYTES], w[DOWN_PACKETS], w[DOWN_BYTES]


class FlowTable:
    """Every flow of one worker, the fast path's view of the established ones, and the
    totals of the flows gone.

    ``flows`` holds pending and established flows by key; ``established`` only the latter:
    what the sweep and the counters walk (a flood keeps thousands of pending flows, which
    they skip). Refusals are counted in ``drops``.
    """

    def __init__(self, max_flows: int, pending: PendingFlows, drops: Drops) -> None:
        self.max_flows = max_flows
        self.pending = pending
        self.flows: dict = {}
        self.established: dict = {}
        self.fast: dict[int, int] = {}  # IPv4 key -> record address, for the fast path
        self._drops = drops
        self._hops: dict[tuple[str, int], Hop] = {}
        self._pending_up = [0, 0]  # packets, bytes forwarded by the flows still pending
        self._retired = [0, 0, 0, 0]  # packets/bytes up, packets/bytes down of flows gone
        self.created = self.recovered = self.expired = 0  # established flows
        self.pending_created = self.pending_expired = self.pending_evicted = 0

    def __len__(self) -> int:
        return len(self.flows)

    def get(self, key) -> Flow | None:
        return self.flows.get(key)

    def hop(self, addr: tuple[str, int]) -> Hop:
        """The one ``Hop`` of an address (flows share them)."""
        hop = self._hops.get(addr)
        if hop is None:
            hop = self._hops[addr] = Hop(addr)
        return hop

    def open(self, key, client: tuple[str, int], name: bytes | None, nxt: Hop,
             prev: Hop | None, cluster_id: int, transceiver_id: int, now: int, source: str,
             pending: bool) -> Flow | None:
        """A new flow (None when refused): pending, counted against the pending caps and
        evicting the oldest pending flow from a full table, or established. ``name``: the
        client's sockaddr, if the caller has it."""
        name = name or mmsg.sockaddr(*client)
        if pending:
            refusal = self.pending.refusal(*source_keys(name))
            if refusal is not None:
                self._drops.add(refusal)
                return None
        if len(self.flows) >= self.max_flows and not (pending and self.pending):
            self._drops.add("flow_table_full")
            return None
        flow = Flow(key, client, nxt, prev, cluster_id, transceiver_id, now, source, name)
        self.flows[key] = flow
        if not pending:
            self._add_established(flow)
            return flow
        flow.pending = True
        self.pending_created += 1
        evicted = self.pending.add(key, flow)
        if evicted is not None:
            self.pending_evicted += 1
            self._forget(evicted)
        elif len(self.flows) > self.max_flows:  # full table: the oldest pending goes
            self.pending_evicted += 1
            self._forget(self.pending.oldest())
        return flow

    def establish(self, flow: Flow) -> None:
        """A pending flow's next hop answered."""
        self._leave_pending(flow)
        flow.pending = False
        self._add_established(flow)

    def count_pending_up(self, size: int) -> None:
        """A pending flow forwarded a datagram of ``size`` client bytes."""
        self._pending_up[0] += 1
        self._pending_up[1] += size

    def expire_pending(self, now: int) -> None:
        """Remove the pending flows older than the pending TTL."""
        for _, flow in self.pending.expired(now):
            self.pending_expired += 1
            self._forget(flow)

    def expire_idle(self, now: int, idle_ns: int) -> list[Flow]:
        """Remove and return the established flows idle for longer than ``idle_ns``."""
        expired = [f for f in self.established.values() if now - f.last_seen_ns > idle_ns]
        for flow in expired:
            del self.flows[flow.key]
            del self.established[flow.key]
            self.fast.pop(flow.key, None)
            self.expired += 1
            self._retire(flow)
        return expired

    def totals(self) -> list[int]:
        """Packets and bytes up, packets and bytes down, of every flow there ever was."""
        totals = list(self._retired)
        totals[0] += self._pending_up[0]
        totals[1] += self._pending_up[1]
        for f in self.established.values():
            for k, v in enumerate(f.totals()):
                totals[k] += v
        return totals

    def _add_established(self, flow: Flow) -> None:
        self.established[flow.key] = flow
        if isinstance(flow.key, int):
            self.fast[flow.key] = flow.record_ptr
        if flow.source == "stun":
            self.created += 1
        else:
            self.recovered += 1

    def _forget(self, flow: Flow) -> None:
        """Drop a pending flow from the table (evicted or expired: never established)."""
        self._leave_pending(flow)
        if self.flows.get(flow.key) is flow:
            del self.flows[flow.key]
        self._retire(flow)

    def _leave_pending(self, flow: Flow) -> None:
        self.pending.remove(flow.key, flow)
        packets, size = flow.totals()[:2]
        self._pending_up[0] -= packets
        self._pending_up[1] -= size

    def _retire(self, flow: Flow) -> None:
        """Keep a removed flow's counters in the worker's totals."""
        totals = flow.totals()
        for k in range(4):
            self._retired[k] += totals[k]
