"""One relay worker: a single-threaded epoll loop over the relay's sockets.

Sockets of a worker:
- ``public``   the relay's UDP port (SO_REUSEPORT, shared by all workers): clients' datagrams.
- ``internal`` cluster tier only (SO_REUSEPORT): hop-encapsulated datagrams from ingress relays,
               and the socket that returns datagrams to them.
- ``hop``      this worker's own socket towards next hops; their answers come back to it, so the
               answers of a flow always reach the worker that holds the flow.

Fast path and slow path: datagrams of known IPv4 flows are forwarded by the C helper
(_fastpath.c) with no Python per datagram and no copy (the send iovecs point at the flow's hop
header and at the receive slot). Everything else comes back here as a "miss": first packets
(STUN parsing, ufrag check, flow creation), IPv6 clients, Redis recovery, and every drop, which
is counted by reason.

A first packet is forwarded before its flow's bookkeeping: the ``flow_created`` line is written
once the batch is sent, and the flow's Redis write waits for the next sweep (at most
``_SWEEP_EVERY``), where all new flows go to Redis in one batch. Waking the Redis thread at
once made it compete for the GIL with the answer to that very packet (~0.5 ms more on the
first round trip of every call, measured on loopback).
"""
from __future__ import annotations

import gc
import logging
import os
import select
import signal
import socket
import sys
import time

from services.lag import LagWatch
from services.logs import log_event
from services.relay import _fastpath, mmsg
from services.relay.admission import FirstPacketLimiter, PendingFlows, source_keys
from services.relay.backlog import Backlog
from services.relay.config import RelayConfig
from services.relay.counters import INDEX, NAMES, Drops
from services.relay.flowcache import CachedFlow, FlowCache
from services.relay.lifeline import die_with_parent
from services.wire import hop as hopwire
from services.wire.stun import StunError, is_stun, read_username, server_ufrag
from services.wire.ufrag import UfragCodec, UfragError

log = logging.getLogger("voiceedge.relay")

_SWEEP_EVERY = 0.5
_RECOVERY_BACKLOG = 8
_NEGATIVE_TTL = 1.0
_MAX_ROUNDS = 16  # receive batches per readiness event before looking at other sockets
# Batches with slow-path datagrams per readiness event: under a flood of first packets every
# batch has some, and a loop until none came back never served the other sockets (answers and
# media to clients waited 20 s in the hop socket) nor swept (found by the hostile flood).
_SLOW_ROUNDS = 2
# First packets handled between two looks at the sockets (backlog.py). Under the hostile
# flood 2 halved the calls' median transit, but shed more first packets (docs/relay.md).
_BACKLOG_CHUNK = 8
_WRITE_BATCH = 1024  # new flows held for Redis before the sweep writes them anyway
# The worker runs without Python's automatic garbage collector (run_worker): a collection
# walks every flow (17 ms at 4,096 pending flows, 40 ms with the startup objects), a stall of
# every datagram behind it. Its datagram paths make no reference cycles (test_relay_pending);
# should anything else, the sweep collects the youngest objects once this many more are alive
# than at the last collection.
_GC_YOUNG_LIMIT = 50_000

# Flow record words shared with _fastpath.c (its REC_* enum).
(_NEXT_NAME, _NEXT_NAMELEN, _HEADER, _HEADER_LEN, _CLIENT_NAME, _CLIENT_NAMELEN, _PREV_NAME,
 _PREV_NAMELEN, _NEXT_KEY, _UP_PACKETS, _UP_BYTES, _DOWN_PACKETS, _DOWN_BYTES,
 _LAST_SEEN_NS) = range(14)
assert _fastpath.REC_WORDS == 14 and _fastpath.MMSGHDR_SIZE == mmsg.MMSGHDR_SIZE


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
                 "record_ptr", "pending", "ip_key", "prefix_key")

    def __init__(self, key, client: tuple[str, int], next_hop: Hop, prev: Hop | None,
                 cluster_id: int, transceiver_id: int, now_ns: int, source: str,
                 client_name: bytes | None = None) -> None:
        self.key = key
        self.client = client
        self.client_name = bytearray(client_name or mmsg.sockaddr(*client))
        self.ip_key, self.prefix_key = source_keys(self.client_name)
        self.pending = False  # see services/relay/admission.py
        self.header = bytearray(hopwire.encode_sockaddr(self.client_name, hopwire.TO_SERVER))
        self.cluster_id, self.transceiver_id = cluster_id, transceiver_id
        self.created = self.refreshed = now_ns
        self.source = source
        self.record = bytearray(8 * _fastpath.REC_WORDS)
        self.words = memoryview(self.record).cast("Q")
        self.record_ptr = mmsg.address_of(self.record)
        w = self.words
        w[_HEADER] = mmsg.address_of(self.header)
        w[_HEADER_LEN] = len(self.header)
        w[_CLIENT_NAME] = mmsg.address_of(self.client_name)
        w[_CLIENT_NAMELEN] = len(self.client_name) if ":" in client[0] else 16
        w[_LAST_SEEN_NS] = now_ns
        self.route(next_hop, prev)

    def route(self, next_hop: Hop, prev: Hop | None) -> None:
        self.next, self.prev = next_hop, prev
        w = self.words
        w[_NEXT_NAME], w[_NEXT_NAMELEN] = next_hop.name_ptr, next_hop.namelen
        w[_NEXT_KEY] = next_hop.key if isinstance(next_hop.key, int) else 0
        w[_PREV_NAME], w[_PREV_NAMELEN] = (prev.name_ptr, prev.namelen) if prev else (0, 0)

    def count_up(self, size: int, now_ns: int) -> None:
        w = self.words
        w[_UP_PACKETS] += 1
        w[_UP_BYTES] += size
        w[_LAST_SEEN_NS] = now_ns

    def count_down(self, size: int, now_ns: int) -> None:
        w = self.words
        w[_DOWN_PACKETS] += 1
        w[_DOWN_BYTES] += size
        w[_LAST_SEEN_NS] = now_ns

    @property
    def last_seen_ns(self) -> int:
        return self.words[_LAST_SEEN_NS]

    def totals(self) -> tuple[int, int, int, int]:
        w = self.words
        return w[_UP_PACKETS], w[_UP_BYTES], w[_DOWN_PACKETS], w[_DOWN_BYTES]


def _udp_socket(addr: tuple[str, int], reuseport: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    for opt, force in ((socket.SO_RCVBUF, 33), (socket.SO_SNDBUF, 32)):  # *BUFFORCE as root
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, 4 << 20)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
    sock.bind(addr)
    sock.setblocking(False)
    return sock


class WorkerSockets:
    """A worker's sockets, opened before the worker process starts so bind errors surface."""

    def __init__(self, config: RelayConfig, index: int = 0) -> None:
        self.public = _udp_socket(config.listen, reuseport=True)
        self.internal = self.hop = None
        try:
            if config.tier == "cluster" and config.internal:
                self.internal = _udp_socket(config.internal, reuseport=True)
            hop_port = config.hop_port + index if config.hop_port else 0
            self.hop = _udp_socket((config.hop_bind, hop_port), reuseport=False)
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        for sock in (self.public, self.internal, self.hop):
            if sock is not None:
                sock.close()


class RelayWorker:
    """Forwards datagrams for one worker process; ``run`` returns when ``stop`` is called."""

    def __init__(self, config: RelayConfig, index: int = 0, shared=None,
                 sockets: WorkerSockets | None = None) -> None:
        self.config = config
        self.index = index
        self._shared = shared
        self._codec = UfragCodec(config.secret)
        self._routes = config.routes
        self.flows: dict = {}  # key -> Flow, pending or established
        # key -> Flow, the established ones: what the sweep and the counters walk (a flood
        # keeps thousands of pending flows, which they skip).
        self.established: dict = {}
        self._pending_up = [0, 0]  # packets, bytes forwarded by the flows still pending
        self._fast: dict[int, int] = {}  # IPv4 key -> record address, for the fast path
        self.drops = Drops.new()
        self._hops: dict[tuple[str, int], Hop] = {}
        self._retired = [0, 0, 0, 0]  # packets/bytes up, packets/bytes down of expired flows
        self.flows_created = self.flows_recovered = self.flows_expired = 0
        self.receive_batches = 0
        self._send_failed = 0
        self._lookups: dict = {}   # key -> (previous hop, datagrams waiting for Redis)
        self.pending = PendingFlows(config.max_pending, config.pending_per_ip,
                                    config.pending_per_prefix, config.pending_ttl)
        self.limiter = FirstPacketLimiter(config.first_packet_rate, config.first_packet_burst)
        self.pending_created = self.pending_expired = self.pending_evicted = 0
        self._unlogged: list[Flow] = []  # created in this batch: logged once it is sent
        self._unwritten: list[tuple[tuple[str, int], CachedFlow]] = []  # to Redis at the sweep
        self._negative: dict = {}  # key -> monotonic ns until which Redis is not asked again
        self._running = False
        self._stop_w: int | None = None  # the stop pipe's write end, while ``run`` runs
        size = config.batch
        self.rx = mmsg.RecvBatch(size)
        self.backlog = Backlog(config.backlog)
        self.tx_hop = mmsg.SendBatch(size)  # to next hops (and to upstream relays)
        self.tx_out = mmsg.SendBatch(size)  # to clients, from the public port
        self._misses = bytearray(4 * size)
        self._misses_ptr = mmsg.address_of(self._misses)
        self._miss_index = memoryview(self._misses).cast("I")
        self.cache = (FlowCache(config.redis_url, config.name, config.redis_ttl, config.redis_queue)
                      if config.redis_url else None)
        self.sockets = sockets or WorkerSockets(config)
        self.public, self.internal, self.hop = (self.sockets.public, self.sockets.internal,
                                                self.sockets.hop)
        self._public_fd, self._hop_fd = self.public.fileno(), self.hop.fileno()
        self._internal_fd = self.internal.fileno() if self.internal is not None else -1

    # ---------------------------------------------------------------- lifecycle

    def stop(self) -> None:
        """End ``run`` now (from a signal handler too): its poll wakes on the stop pipe."""
        self._running = False
        wake = self._stop_w
        if wake is not None:
            try:
                os.write(wake, b"x")
            except BlockingIOError:  # already woken
                pass

    def close(self) -> None:
        self.sockets.close()
        self._log_created()
        if self.cache is not None:
            self._write_created()
            self.cache.stop()

    def run(self) -> None:
        ep = select.epoll()
        handlers = {self._public_fd: self._on_public, self._hop_fd: self._on_return}
        if self.internal is not None:
            handlers[self._internal_fd] = self._on_internal
        if self.cache is not None:
            self.cache.start()
            handlers[self.cache.wake_fd] = self._on_cache
        stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        handlers[stop_r] = lambda: None  # stop() wrote: the loop sees _running
        for fd in handlers:
            ep.register(fd, select.EPOLLIN)
        self._running = True
        next_sweep = time.monotonic() + _SWEEP_EVERY
        injected = self.config.test_processing_delay_ms / 1000.0
        lag = LagWatch(log, expected=1 / _SWEEP_EVERY)  # how late the sweeps run
        try:
            while self._running:
                wait = 0.0 if self.backlog else max(0.0, next_sweep - time.monotonic())
                for fd, _ in ep.poll(wait, len(handlers)):
                    if injected:
                        time.sleep(injected)
                    handlers[fd]()
                if self.backlog:
                    self._drain_backlog()
                now = time.monotonic()
                if now >= next_sweep:
                    lag.note(now - next_sweep)
                    self._sweep(time.monotonic_ns())
                    self.publish()
                    next_sweep = now + _SWEEP_EVERY
        finally:
            ep.close()
            wake, self._stop_w = self._stop_w, None
            os.close(wake)
            os.close(stop_r)
            self.publish()
            lag.close()

    # ---------------------------------------------------------------- socket handlers

    def _on_public(self) -> None:
        """Clients -> next hop, with the flow's hop header in front."""
        rx, tx, misses = self.rx, self.tx_hop, self._miss_index
        for _ in range(_SLOW_ROUNDS):
            received, missed, failed = _fastpath.forward_public(
                self._public_fd, rx.hdrs_addr, rx.size, self._fast, tx.hdrs_addr, tx.iovs_addr,
                self._hop_fd, self._misses_ptr, _MAX_ROUNDS)
            self._send_failed += failed
            if received:
                self.receive_batches += 1
            if not missed:
                return
            now = time.monotonic_ns()
            for k in range(missed):
                self._public_miss(misses[k], now)
            tx.flush(self._hop_fd)
            self._log_created()

    def _on_return(self) -> None:
        """Answers from next hops -> the client (header stripped) or the upstream relay."""
        rx, misses = self.rx, self._miss_index
        pub, up = self.tx_out, self.tx_hop
        for _ in range(_SLOW_ROUNDS):
            received, missed, failed = _fastpath.forward_return(
                self._hop_fd, rx.hdrs_addr, rx.size, self._fast, pub.hdrs_addr, pub.iovs_addr,
                self._public_fd, up.hdrs_addr, up.iovs_addr, self._internal_fd,
                self._misses_ptr, _MAX_ROUNDS)
            self._send_failed += failed
            if received:
                self.receive_batches += 1
            if not missed:
                return
            now = time.monotonic_ns()
            for k in range(missed):
                self._return_slow(misses[k], now)
            pub.flush(self._public_fd)
            if up.count:
                up.flush(self._internal_fd)
            self._log_created()

    def _on_internal(self) -> None:
        """Cluster tier: hop-encapsulated datagrams from ingress relays -> transceivers.

        Not on the fast path: the cluster tier sees far fewer flows per worker than the
        ingress tier in these scenarios, and this keeps the C helper small.
        """
        rx, tx = self.rx, self.tx_hop
        for _ in range(_MAX_ROUNDS):
            n = rx.recv(self._internal_fd)
            if not n:
                return
            self.receive_batches += 1
            now = time.monotonic_ns()
            for i in range(n):
                self._upstream_datagram(i, now)
            tx.flush(self._hop_fd)
            self._log_created()
            if n < rx.size:
                return

    # ---------------------------------------------------------------- slow paths

    def _datagram(self, i: int, rx=None) -> memoryview:
        rx = self.rx if rx is None else rx  # (an empty Backlog is falsy)
        return rx.view[i * rx.slot:i * rx.slot + rx.length(i)]

    def _public_miss(self, i: int, now: int) -> None:
        """A client datagram the fast path did not forward: a known flow's (pending, or IPv6)
        at once; an unknown address's into the backlog, or dropped when it is full."""
        rx = self.rx
        if rx.truncated(i):
            self.drops.add("oversize")
            return
        client_raw = rx.source(i)
        key = sockaddr_key(client_raw)
        if key in self.flows:
            self._public_slow(rx, i, client_raw, key, now)
        elif self.cache is None and (not rx.length(i) or rx.data[i * rx.slot] > 3):
            self.drops.add("unknown_not_stun")  # not STUN, and no Redis to ask: no more work
        elif not self.backlog.push(rx, i, client_raw):
            self.drops.add("overload")

    def _drain_backlog(self) -> None:
        """Up to _BACKLOG_CHUNK first packets, oldest first, sent in one batch."""
        backlog, now = self.backlog, time.monotonic_ns()
        for _ in range(min(_BACKLOG_CHUNK, len(backlog))):
            k = backlog.pop()
            client_raw = backlog.source(k)
            self._public_slow(backlog, k, client_raw, sockaddr_key(client_raw), now)
        self.tx_hop.flush(self._hop_fd)
        self._log_created()

    def _public_slow(self, rx, i: int, client_raw: bytes, key, now: int) -> None:
        """A client datagram in slot i of ``rx`` (the receive batch or the backlog), from
        ``client_raw`` (its sockaddr; ``key`` its flow key)."""
        datagram = self._datagram(i, rx)
        flow = self.flows.get(key)
        if flow is not None and flow.prev is None:
            # A pending flow, or an established one the fast path skips (IPv6).
            if flow.pending and not self._pending_may_pass(flow, datagram, now):
                return
            self._send_up(flow, rx, i, len(datagram), len(datagram), True, now)
            return
        if flow is not None:  # the same address is a flow from an upstream relay
            self.drops.add("wrong_prev_hop")
            return
        ip = source_keys(client_raw)[0]
        if not datagram or datagram[0] > 3:  # not STUN: only Redis may know the address
            if self.cache is None:
                self.drops.add("unknown_not_stun")
            else:
                self._recover(key, ip, mmsg.sockaddr_to_tuple(client_raw), None,
                              bytes(datagram), 0, now)
            return
        if not self.limiter.allow(ip, now):
            self.drops.add("rate_limited")
            return
        routed = self._route(datagram)
        client = mmsg.sockaddr_to_tuple(client_raw)
        if isinstance(routed, str):
            self.drops.add(routed)
            return
        cluster_id, transceiver_id, nxt = routed
        flow = self._create(key, client, nxt, None, cluster_id, transceiver_id, now, "stun",
                            client_raw)
        if flow is not None:
            self._send_up(flow, rx, i, len(datagram), len(datagram), True, now)

    def _return_slow(self, i: int, now: int) -> None:
        """A datagram from a next hop that the fast path did not forward."""
        rx = self.rx
        if rx.truncated(i):
            self.drops.add("oversize")
            return
        datagram = self._datagram(i)
        try:
            header, payload = hopwire.decode(datagram)
        except hopwire.HopHeaderError:
            self.drops.add("bad_hop_header")
            return
        if header.direction != hopwire.TO_CLIENT:
            self.drops.add("bad_hop_header")
            return
        flow = self.flows.get(header_key(datagram))
        if flow is None:
            self.drops.add("return_no_flow")
            return
        if sockaddr_key(rx.source(i)) != flow.next.key:
            self.drops.add("return_wrong_source")
            return
        if flow.pending:
            self._establish(flow)
        if flow.prev is None:
            w = flow.words
            self.tx_out.add(w[_CLIENT_NAME], w[_CLIENT_NAMELEN],
                            rx.data_addr + i * rx.slot + header.length, len(payload))
        else:
            self.tx_hop.add(flow.prev.name_ptr, flow.prev.namelen, rx.data_addr + i * rx.slot,
                            len(datagram))
        flow.count_down(len(payload), now)

    def _upstream_datagram(self, i: int, now: int) -> None:
        """A hop-encapsulated datagram from an ingress relay (cluster tier)."""
        rx = self.rx
        if rx.truncated(i):
            self.drops.add("oversize")
            return
        datagram = self._datagram(i)
        try:
            header, payload = hopwire.decode(datagram)
        except hopwire.HopHeaderError:
            self.drops.add("bad_hop_header")
            return
        if header.direction != hopwire.TO_SERVER:
            self.drops.add("bad_hop_header")
            return
        key = header_key(datagram)
        prev = self._hop(mmsg.sockaddr_to_tuple(rx.source(i)))
        flow = self.flows.get(key)
        if flow is not None and flow.prev is prev:
            if flow.pending and not self._pending_may_pass(flow, payload, now):
                return
            self._send_up(flow, self.rx, i, len(datagram), len(payload), False, now)
            return
        name = mmsg.sockaddr(*header.client)
        ip = source_keys(name)[0]
        if not payload or payload[0] > 3:  # not STUN: only Redis may know the client
            if flow is not None:
                self.drops.add("wrong_prev_hop")
            elif self.cache is not None:
                self._recover(key, ip, header.client, prev, bytes(datagram), header.length, now)
            else:
                self.drops.add("unknown_not_stun")
            return
        if not self.limiter.allow(ip, now):
            self.drops.add("rate_limited")
            return
        routed = self._route(payload)
        if isinstance(routed, str):
            self.drops.add(routed)
            return
        cluster_id, transceiver_id, nxt = routed
        if flow is not None:  # the client now arrives through another ingress relay
            if flow.pending and not self._pending_may_pass(flow, payload, now):
                return
            flow.route(nxt, prev)
        else:
            flow = self._create(key, header.client, nxt, prev, cluster_id, transceiver_id, now,
                                "stun", name)
        if flow is not None:
            self._send_up(flow, self.rx, i, len(datagram), len(payload), False, now)

    def _send_up(self, flow: Flow, rx, i: int, length: int, payload: int, with_header: bool,
                 now: int) -> None:
        """Queue slot i of ``rx`` (``length`` bytes, ``payload`` of them the client's datagram)
        towards the flow's next hop, behind the flow's hop header when ``with_header``."""
        nxt = flow.next
        data = rx.data_addr + i * rx.slot
        if with_header:
            w = flow.words
            self.tx_hop.add(nxt.name_ptr, nxt.namelen, w[_HEADER], w[_HEADER_LEN], data, length)
        else:
            self.tx_hop.add(nxt.name_ptr, nxt.namelen, data, length)
        flow.count_up(payload, now)
        if flow.pending:
            self._pending_up[0] += 1
            self._pending_up[1] += payload

    def _route(self, datagram: memoryview):
        """(cluster, transceiver, next hop) from a first datagram's USERNAME, or a drop reason."""
        if not datagram or datagram[0] > 3:
            return "unknown_not_stun"
        try:
            username = read_username(datagram)
        except StunError:
            return "stun_malformed"
        if username is None:
            return "stun_no_username"
        try:
            hint = self._codec.decode(server_ufrag(username))
        except UfragError:
            return "bad_ufrag"
        addr = self._routes.next_hop(hint.cluster_id, hint.transceiver_id)
        if addr is None:
            return "no_route"
        return hint.cluster_id, hint.transceiver_id, self._hop(addr)

    def _hop(self, addr: tuple[str, int]) -> Hop:
        hop = self._hops.get(addr)
        if hop is None:
            hop = self._hops[addr] = Hop(addr)
        return hop

    def _create(self, key, client, nxt: Hop, prev: Hop | None, cluster_id: int,
                transceiver_id: int, now: int, source: str,
                name: bytes | None = None) -> Flow | None:
        """A new flow: pending when a STUN first packet opened it (unless pending flows are
        off), established when Redis vouched for it. ``name``: the client's sockaddr, if the
        caller has it."""
        pending = source == "stun" and self.config.pending_flows
        name = name or mmsg.sockaddr(*client)
        if pending:
            refusal = self.pending.refusal(*source_keys(name))
            if refusal is not None:
                self.drops.add(refusal)
                return None
        if len(self.flows) >= self.config.max_flows and not (pending and self.pending):
            self.drops.add("flow_table_full")
            return None
        flow = Flow(key, client, nxt, prev, cluster_id, transceiver_id, now, source, name)
        self.flows[key] = flow
        if pending:
            flow.pending = True
            self.pending_created += 1
            evicted = self.pending.add(key, flow)
            if evicted is not None:
                self.pending_evicted += 1
                self._forget(evicted)
            elif len(self.flows) > self.config.max_flows:  # full table: the oldest pending goes
                self.pending_evicted += 1
                self._forget(self.pending.oldest())
            return flow
        self._established(flow)
        return flow

    def _established(self, flow: Flow) -> None:
        """Put an established flow on the fast path, into Redis (if it came from STUN) and
        into the log."""
        self.established[flow.key] = flow
        if isinstance(flow.key, int):
            self._fast[flow.key] = flow.record_ptr
        if flow.source == "stun":
            self.flows_created += 1
            if self.cache is not None:
                prev = flow.prev
                self._unwritten.append((flow.client, CachedFlow(
                    flow.next.addr, prev.addr if prev else None, flow.cluster_id,
                    flow.transceiver_id)))
                if len(self._unwritten) >= _WRITE_BATCH:
                    self._write_created()
        else:
            self.flows_recovered += 1
        self._unlogged.append(flow)

    def _establish(self, flow: Flow) -> None:
        """A pending flow's next hop answered."""
        self._leave_pending(flow)
        flow.pending = False
        self._established(flow)

    def _pending_may_pass(self, flow: Flow, datagram, now: int) -> bool:
        """Whether a datagram of a pending flow goes on: STUN only, within the source's rate."""
        if not is_stun(datagram):
            self.drops.add("pending_not_stun")
            return False
        if not self.limiter.allow(flow.ip_key, now):
            self.drops.add("rate_limited")
            return False
        return True

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
        """Keep a removed flow's counters in the relay's totals."""
        totals = flow.totals()
        for k in range(4):
            self._retired[k] += totals[k]

    def _log_created(self) -> None:
        """``flow_created`` for the flows of the batch just sent (after it: not before)."""
        for flow in self._unlogged:
            prev = flow.prev
            log_event(log, "flow_created", relay=self.config.name, worker=self.index,
                      client=f"{flow.client[0]}:{flow.client[1]}", next_hop=flow.next.label,
                      prev_hop=prev.label if prev else None, cluster=flow.cluster_id,
                      transceiver=flow.transceiver_id, origin=flow.source)
        self._unlogged.clear()

    def _write_created(self) -> None:
        """Hand the new flows' Redis writes to the cache thread, in one batch."""
        if self._unwritten:
            self.cache.write_many(self._unwritten)
            self._unwritten = []

    # ---------------------------------------------------------------- Redis recovery

    def _recover(self, key, ip: bytes, client, prev: Hop | None, datagram: bytes, hl: int,
                 now: int):
        """Ask Redis for the flow of a non-STUN datagram from an unknown client.

        Only a new lookup spends a token of the source's bucket: the datagrams that wait for
        one, or that a negative answer covers, cost nothing (after a relay restart without
        Redis, a client's media must not eat the tokens its next consent check needs).
        """
        if self._negative.get(key, 0) > now:
            self.drops.add("unknown_not_stun")
            return
        entry = self._lookups.get(key)
        if entry is not None:
            if len(entry[1]) >= _RECOVERY_BACKLOG:
                self.drops.add("recovery_backlog")
            else:
                entry[1].append((datagram, hl))
            return
        if len(self._lookups) >= self.config.max_lookups:
            self.drops.add("recovery_busy")
            return
        if not self.limiter.allow(ip, now):
            self.drops.add("rate_limited")
            return
        if not self.cache.lookup(key, client):
            self.drops.add("unknown_not_stun")
            return
        self._lookups[key] = (prev, [(datagram, hl)])

    def _on_cache(self) -> None:
        self.cache.drain_wake()
        results, now = self.cache.results, time.monotonic_ns()
        while results:
            key, client, found = results.popleft()
            prev, waiting = self._lookups.pop(key, (None, []))
            expected = (self._routes.next_hop(found.cluster_id, found.transceiver_id)
                        if found else None)
            vouched = found is not None and expected == found.next_hop
            known = self.flows.get(key)
            if known is not None:  # a STUN check opened it meanwhile
                if known.pending and vouched and known.next.addr == expected:
                    self._establish(known)
                continue
            if not vouched:
                self._negative[key] = now + int(_NEGATIVE_TTL * 1e9)
                self.drops.add("unknown_not_stun", len(waiting))
                continue
            nxt = self._hop(expected)
            flow = self._create(key, client, nxt, prev, found.cluster_id, found.transceiver_id,
                                now, "redis")
            if flow is None:
                continue
            for datagram, hl in waiting:
                payload = datagram if hl else bytes(flow.header) + datagram
                try:
                    self.hop.sendto(payload, nxt.addr)
                except OSError:
                    self._send_failed += 1
                    continue
                flow.count_up(len(datagram) - hl, now)
        self._log_created()

    # ---------------------------------------------------------------- housekeeping

    def _sweep(self, now: int) -> None:
        if gc.get_count()[0] >= _GC_YOUNG_LIMIT:
            self._collect_garbage()
        for _, flow in self.pending.expired(now):
            self.pending_expired += 1
            self._forget(flow)
        self.limiter.sweep(now)
        idle_ns = int(self.config.idle_timeout * 1e9)
        expired = [f for f in self.established.values() if now - f.last_seen_ns > idle_ns]
        for flow in expired:
            del self.flows[flow.key]
            del self.established[flow.key]
            self._fast.pop(flow.key, None)
            self.flows_expired += 1
            self._retire(flow)
            totals = flow.totals()
            log_event(log, "flow_expired", relay=self.config.name, worker=self.index,
                      client=f"{flow.client[0]}:{flow.client[1]}", next_hop=flow.next.label,
                      age_s=round((now - flow.created) / 1e9, 3), packets_up=totals[0],
                      bytes_up=totals[1], packets_down=totals[2], bytes_down=totals[3])
        if self._negative:
            self._negative = {k: t for k, t in self._negative.items() if t > now}
        if self.cache is not None:
            self._write_created()
            due = now - int(self.config.redis_ttl / 3 * 1e9)
            stale = [f for f in self.established.values()
                     if f.refreshed < due and f.last_seen_ns > f.refreshed]
            for flow in stale:
                flow.refreshed = now
            self.cache.refresh([f.client for f in stale])

    def _collect_garbage(self) -> None:
        started = time.perf_counter()
        found = gc.collect(0)
        log_event(log, "garbage_collected", relay=self.config.name, worker=self.index,
                  unreachable=found, ms=round((time.perf_counter() - started) * 1e3, 1))

    def counters(self) -> dict[str, int]:
        totals = list(self._retired)
        totals[0] += self._pending_up[0]
        totals[1] += self._pending_up[1]
        for f in self.established.values():
            for k, v in enumerate(f.totals()):
                totals[k] += v
        values = {
            "packets_to_server": totals[0], "bytes_to_server": totals[1],
            "packets_to_client": totals[2], "bytes_to_client": totals[3],
            "receive_batches": self.receive_batches, "flows_created": self.flows_created,
            "flows_recovered": self.flows_recovered, "flows_expired": self.flows_expired,
            "flows_active": len(self.flows), "flows_pending": len(self.pending),
            "flows_pending_created": self.pending_created,
            "flows_pending_expired": self.pending_expired,
            "flows_pending_evicted": self.pending_evicted,
            "rate_limit_untracked": self.limiter.untracked,
        }
        cache = self.cache
        if cache is not None:
            values.update(redis_writes=cache.writes, redis_writes_dropped=cache.writes_dropped,
                          redis_lookups=cache.lookups, redis_hits=cache.hits,
                          redis_errors=cache.errors, redis_up=int(cache.up))
        for reason, count in self.drops.counts.items():
            values[f"drops_{reason}"] = count
        values["drops_send_failed"] += (self._send_failed + self.tx_hop.failed
                                        + self.tx_out.failed)
        return values

    def publish(self) -> None:
        if self._shared is None:
            return
        row = self.index * len(NAMES)
        for name, value in self.counters().items():
            self._shared[row + INDEX[name]] = value


def run_worker(config: RelayConfig, index: int, shared, cpu: int | None,
               sockets: WorkerSockets, parent_pid: int) -> None:
    """Entry point of a worker process (forked: it logs through the relay's JSON handler).

    The worker ends when its relay does, however the relay ends (services/relay/lifeline.py).
    A crash is logged as one ``worker_crashed`` line (not multiprocessing's plain traceback)
    and ends the process with status 1; the relay restarts the worker.
    """
    # SIGKILL, not SIGTERM: with its relay gone there is nothing to hand over (the shared
    # counters went with it), and a graceful stop on a loaded host let a worker outlive a
    # killed relay by more than the 0.5 s the fault scenarios wait before the restart.
    die_with_parent(parent_pid, signal.SIGKILL)
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        worker = RelayWorker(config, index, shared, sockets)
        gc.disable()  # see _GC_YOUNG_LIMIT
        gc.freeze()   # what exists now lives as long as the worker: out of every collection
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        signal.signal(signal.SIGINT, lambda *_: worker.stop())
        log_event(log, "worker_started", relay=config.name, worker=index, cpu=cpu)
        try:
            worker.run()
        finally:
            worker.close()
    except Exception:
        log_event(log, "worker_crashed", level=logging.ERROR, relay=config.name, worker=index,
                  exc_info=True)
        sys.exit(1)
