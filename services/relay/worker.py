"""One relay worker: a single-threaded epoll loop over the relay's sockets.

Sockets of a worker (sockets.py):
- ``public``   the relay's UDP port (SO_REUSEPORT, shared by all workers): clients' datagrams.
- ``internal`` cluster tier only (SO_REUSEPORT): hop-encapsulated datagrams from ingress relays,
               and the socket that returns datagrams to them.
- ``hop``      this worker's own socket towards next hops; their answers come back to it, so the
               answers of a flow always reach the worker that holds the flow.

Fast path and slow path: datagrams of known IPv4 flows are forwarded by the C helper (_fastpath.c)
with no Python per datagram and no copy (the send iovecs point at the flow's hop header and at the
receive slot); ``--forwarding python`` turns it off, the reference the C helper is checked against
(tests/test_relay_forwarding.py). Everything else comes back here as a "miss": first packets (STUN
parsing, ufrag check, flow creation), IPv6 clients, Redis recovery, and every drop, which is
counted by reason. A first packet takes one path on both tiers, from the public port or through an
ingress relay (``_first_packet``).

The worker moves datagrams; each other job has its module: the flow table (flows.py), what
gets in from addresses without an established flow (admission.py), where a first packet goes
(routing.py), flows recovered from Redis (recovery.py), and log lines, Redis writes and the
shared counters (publishing.py).
"""
from __future__ import annotations

import gc
import logging
import os
import select
import signal
import sys
import time

from services.lag import TICK_S, LagWatch
from services.logs import log_event
from services.relay import _fastpath, mmsg
from services.relay.admission import Admission, PendingFlows, source_keys
from services.relay.backlog import Backlog
from services.mediapaths import NATIVE
from services.relay.config import RelayConfig
from services.relay.counters import Drops
from services.relay.flowcache import FlowCache
from services.relay.flows import (
    CLIENT_NAME, CLIENT_NAMELEN, HEADER, HEADER_LEN, UP_BYTES, UP_PACKETS, Flow, FlowTable, Hop,
    header_key, sockaddr_key,
)
from services.relay.lifeline import die_with_parent
from services.relay.nativeadmission import HEADER_BYTES, NOT_STUN, REASONS, native_admission
from services.relay.publishing import Publisher
from services.relay.recovery import Recovery
from services.relay.routing import Router
from services.relay.scheduling import place_worker
from services.relay.sockets import WorkerSockets
from services.wire import hop as hopwire
from services.wire.stun import (STUN_FIRST_BYTE_MAX, StunError, in_stun_range, read_username,
                                server_ufrag)
from services.wire.ufrag import UfragCodec

log = logging.getLogger("voiceedge.relay")

_SWEEP_EVERY = 0.5
_MAX_ROUNDS = 16  # receive batches per readiness event before looking at other sockets
# Batches with slow-path datagrams per readiness event: under a flood of first packets every
# batch has some, and a loop until none came back never served the other sockets (answers and
# media to clients waited 20 s in the hop socket) nor swept (found by the hostile flood).
# One: with two, a call's datagram from a transceiver waited behind 32 first packets (~0.4 ms).
_SLOW_ROUNDS = 1
# Datagrams per public-socket read while most of what arrives is first packets: every miss of
# a batch is handled before the next read, so a call's datagram behind a full batch of them
# waited for 64 (about 0.8 ms under the hostile flood); behind 8 it waits about 0.1 ms.
_FLOOD_BATCH = 8
# First packets handled between two looks at the sockets (backlog.py). Under the hostile
# flood 2 halved the calls' median transit, but shed more first packets (docs/relay.md).
_BACKLOG_CHUNK = 8
# The worker runs without Python's automatic garbage collector (run_worker): a collection
# walks every flow (17 ms at 4,096 pending flows, 40 ms with the startup objects), a stall of
# every datagram behind it. Its datagram paths make no reference cycles (test_relay_pending);
# should anything else, the sweep collects the youngest objects once this many more are alive
# than at the last collection.
_GC_YOUNG_LIMIT = 50_000


def established_first(events: list[tuple[int, int]], public_fd: int) -> list[int]:
    """The ready descriptors with the public socket last: what comes back from the next hops
    (calls' media, answers) is served before first packets from unknown addresses, so a
    flood of them delays a call's datagram by one read of them at most, not by a turn of
    the loop (docs/relay.md, "Under a flood")."""
    fds = [fd for fd, _ in events]
    if len(fds) > 1 and public_fd in fds:
        fds.remove(public_fd)
        fds.append(public_fd)
    return fds


def _server_ufrag(payload: memoryview) -> bytes | None:
    """The server ufrag a STUN check names (None: no well-framed USERNAME)."""
    try:
        username = read_username(payload)
    except StunError:
        return None
    return None if username is None else server_ufrag(username)


class RelayWorker:
    """Forwards datagrams for one worker process; ``run`` returns when ``stop`` is called.

    ``cache``: a flow cache to use instead of the one ``config.redis_url`` names (tests).
    """

    def __init__(self, config: RelayConfig, index: int = 0, shared=None,
                 sockets: WorkerSockets | None = None, cache: FlowCache | None = None) -> None:
        self.config = config
        self.index = index
        self.drops = Drops.new()
        self.admission = Admission(config, self.drops)
        self.table = FlowTable(config.max_flows, PendingFlows(
            config.max_pending, config.pending_per_ip, config.pending_per_prefix,
            config.pending_ttl), self.drops)
        self.router = Router(UfragCodec(config.secret), config.routes, self.table.hop)
        # --admission native: IPv4 first packets and their pending flows in C; its token
        # buckets become the worker's only ones
        self.native = None
        if config.admission == NATIVE and config.pending_flows:
            self.native, self._native_hops = native_admission(config, self.table.hop)
            self.admission.limiter = self.native
        if cache is None and config.redis_url:
            cache = FlowCache(config.redis_url, config.name, config.redis_ttl,
                              config.redis_queue)
        self.cache = cache
        self.recovery = (Recovery(cache, config.routes, config.max_lookups,
                                  self.admission.limiter, self.drops)
                         if cache is not None else None)
        self.publisher = Publisher(config.name, index, cache, config.redis_ttl, shared)
        self.receive_batches = 0
        self._send_failed = 0
        self._idle_ns = int(config.idle_timeout * 1e9)
        self._move_ns = int(config.pending_ttl * 1e9)  # a moving flow waits this long
        self.moved = 0
        self._running = False
        self._stop_w: int | None = None  # the stop pipe's write end, while ``run`` runs
        size = config.batch
        self.rx = mmsg.RecvBatch(size)
        self._public_batch = size   # _FLOOD_BATCH while first packets fill the reads
        self.backlog = Backlog(config.backlog)
        self.tx_hop = mmsg.SendBatch(size)  # to next hops (and to upstream relays)
        self.tx_out = mmsg.SendBatch(size)  # to clients, from the public port
        # The table's own dicts and hop lookup, bound once: the slow path of known flows
        # (IPv6, the cluster tier's upstream datagrams) reads them per datagram.
        self._flows, self._hop = self.table.flows, self.table.hop
        # --forwarding python: the C helper sees no flow, so every datagram is a miss and
        # takes the Python handlers (the reference the fast path is checked against)
        self._fast = self.table.fast if config.forwarding == NATIVE else {}
        self._misses = bytearray(4 * size)
        self._native_headers = bytearray(HEADER_BYTES * size)   # one per tx_hop slot
        self._native_headers_addr = mmsg.address_of(self._native_headers)
        self._misses_ptr = mmsg.address_of(self._misses)
        self._miss_index = memoryview(self._misses).cast("I")
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
        self.publisher.close()
        if self.cache is not None:
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
        # How late the loop wakes for a tick it set, one audio frame apart: the event loops'
        # resolution (services/lag.py), so that one late wake-up is one sample of fifty, not
        # half of a second's samples.
        lag = LagWatch(log, expected=1 / TICK_S)
        next_tick = time.monotonic() + TICK_S
        try:
            while self._running:
                due = min(next_sweep, next_tick)
                wait = 0.0 if self.backlog else max(0.0, due - time.monotonic())
                for fd in established_first(ep.poll(wait, len(handlers)), self._public_fd):
                    if injected:
                        time.sleep(injected)
                    handlers[fd]()
                if self.backlog:
                    self._drain_backlog()
                now = time.monotonic()
                if now >= next_tick:
                    lag.note(now - next_tick)
                    next_tick = now + TICK_S
                if now >= next_sweep:
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
                self._public_fd, rx.hdrs_addr, self._public_batch, self._fast, tx.hdrs_addr,
                tx.iovs_addr, self._hop_fd, self._misses_ptr, _MAX_ROUNDS)
            self._public_batch = _FLOOD_BATCH if missed > _FLOOD_BATCH // 2 else rx.size
            self._send_failed += failed
            if received:
                self.receive_batches += 1
            if not missed:
                return
            now = time.monotonic_ns()
            for k in range(missed):
                self._public_miss(misses[k], now)
            tx.flush(self._hop_fd)
            self.publisher.log_created()

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
            self.publisher.log_created()

    def _on_internal(self) -> None:
        """Cluster tier: hop-encapsulated datagrams from ingress relays -> transceivers, the
        established flows' by the C helper, the rest here (``_upstream_datagram``)."""
        rx, tx, misses = self.rx, self.tx_hop, self._miss_index
        for _ in range(_SLOW_ROUNDS):
            received, missed, failed = _fastpath.forward_internal(
                self._internal_fd, rx.hdrs_addr, rx.size, self._fast, tx.hdrs_addr,
                tx.iovs_addr, self._hop_fd, self._misses_ptr, _MAX_ROUNDS)
            self._send_failed += failed
            if received:
                self.receive_batches += 1
            if not missed:
                return
            now = time.monotonic_ns()
            for k in range(missed):
                self._upstream_datagram(misses[k], now)
            tx.flush(self._hop_fd)
            self.publisher.log_created()

    def _on_cache(self) -> None:
        """Redis answered: a flow it vouched for is re-created and what waited is forwarded."""
        now = time.monotonic_ns()
        for key, client, prev, found, waiting in self.recovery.answers():
            known = self.table.get(key)
            if known is not None:  # a STUN check opened it meanwhile
                if known.pending and found is not None and known.next.addr == found.next_hop:
                    self._establish(known)
                continue
            if found is None:
                self.recovery.refuse(key, len(waiting), now)
                continue
            flow = self._open(key, client, None, self.table.hop(found.next_hop), prev,
                              found.cluster_id, found.transceiver_id, now, "redis")
            if flow is not None:
                self._forward_waiting(flow, waiting, now)
        self.publisher.log_created()

    # ---------------------------------------------------------------- towards the server

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
        if key in self._flows:
            self._public_slow(rx, i, client_raw, key, now)
        elif self.native is not None and isinstance(key, int):
            self._native_first(rx, i, client_raw, key, now)
        elif self.recovery is None and (not rx.length(i)
                                        or rx.data[i * rx.slot] > STUN_FIRST_BYTE_MAX):
            # Not STUN (in_stun_range, written out: a view of the slot per datagram cost this
            # flood path a sixth more), and no Redis to ask: no more work.
            self.drops.add("unknown_not_stun")
        elif not self.backlog.push(rx, i, client_raw):
            self.drops.add("overload")

    def _native_first(self, rx, i: int, client_raw: bytes, key: int, now: int) -> None:
        """An IPv4 client datagram without a flow in Python: the C admission's (a pending flow
        of its own, or a new one), or, not STUN, Redis's or dropped, as ``_first_packet``."""
        tx, native = self.tx_hop, self.native
        if tx.count == tx.size:
            tx.flush(self._hop_fd)
        header = self._native_headers_addr + HEADER_BYTES * tx.count
        datagram = self._datagram(i, rx)
        hop = native.first(datagram, client_raw, now,
                           self.table.max_flows - len(self._flows) - len(native), header)
        if hop >= 0:
            nxt = self._native_hops[hop]
            tx.add(nxt.name_ptr, nxt.namelen, header, HEADER_BYTES, rx.data_addr + i * rx.slot,
                   len(datagram))
        elif hop != NOT_STUN:
            self.drops.add(REASONS[-1 - hop])
        elif self.recovery is None:
            self.drops.add("unknown_not_stun")
        else:
            self.recovery.ask(key, source_keys(client_raw)[0], mmsg.sockaddr_to_tuple(client_raw),
                              None, bytes(datagram), 0, now)

    def _drain_backlog(self) -> None:
        """Up to _BACKLOG_CHUNK first packets, oldest first, sent in one batch."""
        backlog, now = self.backlog, time.monotonic_ns()
        for _ in range(min(_BACKLOG_CHUNK, len(backlog))):
            k = backlog.pop()
            client_raw = backlog.source(k)
            self._public_slow(backlog, k, client_raw, sockaddr_key(client_raw), now)
        self.tx_hop.flush(self._hop_fd)
        self.publisher.log_created()

    def _public_slow(self, rx, i: int, client_raw: bytes, key, now: int) -> None:
        """A client datagram in slot i of ``rx`` (the receive batch or the backlog), from
        ``client_raw`` (its sockaddr; ``key`` its flow key)."""
        datagram = self._datagram(i, rx)
        flow = self._flows.get(key)
        if flow is not None and flow.prev is None:
            # A pending flow, an established one's STUN check, or one the fast path skips (IPv6)
            if not flow.pending and self._routed_elsewhere(flow, rx, i, datagram, datagram, now):
                return
            if not flow.pending or self.admission.pending_may_pass(flow, datagram, now):
                self._send_up(flow, rx, i, len(datagram), len(datagram), now)
            return
        if flow is not None:  # the same address is a flow from an upstream relay
            self.drops.add("wrong_prev_hop")
            return
        self._first_packet(rx, i, key, None, None, datagram, datagram, client_raw, None, now)

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
        flow = self._flows.get(key)
        if flow is not None and flow.prev is prev:
            if not flow.pending and self._routed_elsewhere(flow, rx, i, datagram, payload, now):
                return
            if not flow.pending or self.admission.pending_may_pass(flow, payload, now):
                self._send_up(flow, rx, i, len(datagram), len(payload), now)
            return
        if flow is not None and not in_stun_range(payload):
            self.drops.add("wrong_prev_hop")  # only a STUN check moves a client's flow
            return
        self._first_packet(rx, i, key, prev, flow, datagram, payload, None, header.client, now)

    def _first_packet(self, rx, i: int, key, prev: Hop | None, flow: Flow | None,
                      datagram: memoryview, payload: memoryview, name: bytes | None,
                      client: tuple[str, int] | None, now: int) -> None:
        """Both tiers' path for a client datagram without a flow from where it came: slot i
        of ``rx``, the client's ``payload`` arrived as ``datagram`` from ``prev`` (an ingress
        relay: ``datagram`` has its hop header) or from the client itself (``prev`` None,
        ``datagram`` is ``payload``); ``flow`` is the client's flow through another ingress
        relay, if any. The caller knows the client's sockaddr (``name``) or its address
        (``client``).

        Not STUN: only Redis may know the client. STUN: the source's rate, the route, then a
        new flow, or the client's flow moved to ``prev``.
        """
        if name is None:
            name = mmsg.sockaddr(*client)
        ip = source_keys(name)[0]
        if not in_stun_range(payload):
            if self.recovery is None:
                self.drops.add("unknown_not_stun")
            else:
                self.recovery.ask(key, ip, client or mmsg.sockaddr_to_tuple(name), prev,
                                  bytes(datagram), len(datagram) - len(payload), now)
            return
        if not self.admission.limiter.allow(ip, now):
            self.drops.add("rate_limited")
            return
        routed = self.router.route(payload)
        if isinstance(routed, str):
            self.drops.add(routed)
            return
        cluster_id, transceiver_id, nxt = routed
        if flow is not None:  # the client now arrives through another ingress relay
            if flow.pending and not self.admission.pending_may_pass(flow, payload, now):
                return
            flow.route(nxt, prev)
        else:
            flow = self._open(key, client or mmsg.sockaddr_to_tuple(name), name, nxt, prev,
                              cluster_id, transceiver_id, now, "stun")
        if flow is not None:
            flow.ufrag = _server_ufrag(payload) or b""
            self._send_up(flow, rx, i, len(datagram), len(payload), now)

    def _routed_elsewhere(self, flow: Flow, rx, i: int, datagram: memoryview,
                          payload: memoryview, now: int) -> bool:
        """An established flow's STUN Binding request whose USERNAME routes to another next
        hop: a NAT gave the flow's address to another caller (or moved a caller onto it). The
        check goes to that hop, and the flow follows once that hop answers it
        (``_moved``); until then the flow keeps its route, so a forged check from the
        address (the ufrag is public, the password is not) moves nothing. True if the check
        went elsewhere or was dropped; False: it is the flow's own.

        The flow's own checks (the server ufrag it was routed by, ``Flow.ufrag``) are its
        own without routing: the fast path decides the same in C (``own_datagram``)."""
        if payload[:2] != b"\x00\x01":
            return False
        ufrag = _server_ufrag(payload)
        if ufrag is None or ufrag == flow.ufrag:
            return False
        routed = self.router.route(payload)
        if isinstance(routed, str):
            return False   # not routable: the flow's own next hop judges it, as before
        cluster_id, transceiver_id, nxt = routed
        if nxt.key == flow.next.key:
            # another session of the same transceiver (or a flow that had no ufrag yet:
            # recovered, or opened by the C admission): its checks take the fast path now
            flow.ufrag = ufrag
            return False
        if not self.admission.limiter.allow(flow.ip_key, now):
            self.drops.add("rate_limited")
            return True
        flow.moving = (nxt, cluster_id, transceiver_id, now + self._move_ns, ufrag)
        self._send_up(flow, rx, i, len(datagram), len(payload), now, nxt)
        return True

    def _moved(self, flow: Flow, source, payload: memoryview, now: int) -> bool:
        """A datagram for the flow's client from another next hop: the flow moves there if
        it is that hop's STUN success answer to a check ``_routed_elsewhere`` sent it."""
        moving = flow.moving
        if moving is None or moving[0].key != source or payload[:2] != b"\x01\x01":
            return False
        nxt, cluster_id, transceiver_id, until, ufrag = moving
        flow.moving = None
        if now > until:
            return False
        before = flow.next.label
        flow.route(nxt, flow.prev)
        flow.ufrag = ufrag
        flow.cluster_id, flow.transceiver_id = cluster_id, transceiver_id
        self.moved += 1
        self.publisher.moved(flow, before)
        return True

    def _send_up(self, flow: Flow, rx, i: int, length: int, payload: int, now: int,
                 nxt: Hop | None = None) -> None:
        """Queue slot i of ``rx`` (``length`` bytes, ``payload`` of them the client's datagram)
        towards the flow's next hop (or ``nxt``); a client's own datagram (no upstream relay)
        goes behind the flow's hop header."""
        nxt = flow.next if nxt is None else nxt
        data = rx.data_addr + i * rx.slot
        if flow.prev is None:
            w = flow.words
            self.tx_hop.add(nxt.name_ptr, nxt.namelen, w[HEADER], w[HEADER_LEN], data, length)
        else:
            self.tx_hop.add(nxt.name_ptr, nxt.namelen, data, length)
        flow.count_up(payload, now)
        if flow.pending:
            self.table.count_pending_up(payload)

    def _forward_waiting(self, flow: Flow, waiting: list[tuple[bytes, int]], now: int) -> None:
        """The datagrams that waited for Redis (``hl`` bytes of hop header each), one by one."""
        nxt = flow.next
        for datagram, hl in waiting:
            payload = datagram if hl else bytes(flow.header) + datagram
            try:
                self.hop.sendto(payload, nxt.addr)
            except OSError:
                self._send_failed += 1
                continue
            flow.count_up(len(datagram) - hl, now)

    def _open(self, key, client: tuple[str, int], name: bytes | None, nxt: Hop,
              prev: Hop | None, cluster_id: int, transceiver_id: int, now: int,
              source: str) -> Flow | None:
        """A new flow: pending when a STUN first packet opened it (unless pending flows are
        off), established when Redis vouched for it."""
        flow = self.table.open(key, client, name, nxt, prev, cluster_id, transceiver_id, now,
                               source, self.admission.opens_pending(source))
        if flow is not None and not flow.pending:
            self.publisher.established(flow)
        return flow

    def _establish(self, flow: Flow) -> None:
        """A pending flow's next hop answered."""
        self.table.establish(flow)
        self.publisher.established(flow)

    # ---------------------------------------------------------------- towards the client

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
        key = header_key(datagram)
        flow = self._flows.get(key)
        if flow is None and self.native is not None and isinstance(key, int):
            flow = self._native_answered(key, header.client, sockaddr_key(rx.source(i)), now)
            if flow is None:
                return
        if flow is None:
            self.drops.add("return_no_flow")
            return
        source = sockaddr_key(rx.source(i))
        if source != flow.next.key and not self._moved(flow, source, payload, now):
            self.drops.add("return_wrong_source")
            return
        if flow.pending:
            self._establish(flow)
        if flow.prev is None:
            w = flow.words
            self.tx_out.add(w[CLIENT_NAME], w[CLIENT_NAMELEN],
                            rx.data_addr + i * rx.slot + header.length, len(payload))
        else:
            self.tx_hop.add(flow.prev.name_ptr, flow.prev.namelen, rx.data_addr + i * rx.slot,
                            len(datagram))
        flow.count_down(len(payload), now)

    def _native_answered(self, key: int, client: tuple[str, int], source, now: int) -> Flow | None:
        """The next hop answered a client whose flow is pending in the C admission: it
        becomes an established ``Flow`` (None, counted, when there is none or the answer
        came from elsewhere)."""
        hop = self.native.hop_of(key)
        if hop < 0:
            self.drops.add("return_no_flow")
            return None
        nxt = self._native_hops[hop]
        if source != nxt.key:
            self.drops.add("return_wrong_source")
            return None
        _, cluster_id, transceiver_id, created, packets, size = self.native.take(key)
        flow = self.table.open(key, client, None, nxt, None, cluster_id, transceiver_id, now,
                               "stun", False)
        if flow is None:
            return None
        flow.created = created
        flow.words[UP_PACKETS], flow.words[UP_BYTES] = packets, size
        self.publisher.established(flow)
        return flow

    # ---------------------------------------------------------------- housekeeping

    def _sweep(self, now: int) -> None:
        if gc.get_count()[0] >= _GC_YOUNG_LIMIT:
            self._collect_garbage()
        self.table.expire_pending(now)
        self.admission.sweep(now)
        for flow in self.table.expire_idle(now, self._idle_ns):
            self.publisher.expired(flow, now)
        if self.recovery is not None:
            self.recovery.sweep(now)
        self.publisher.sweep(self.table.established, now)

    def _collect_garbage(self) -> None:
        started = time.perf_counter()
        found = gc.collect(0)
        log_event(log, "garbage_collected", relay=self.config.name, worker=self.index,
                  unreachable=found, ms=round((time.perf_counter() - started) * 1e3, 1))

    def counters(self) -> dict[str, int]:
        table = self.table
        totals = table.totals()
        values = {
            "packets_to_server": totals[0], "bytes_to_server": totals[1],
            "packets_to_client": totals[2], "bytes_to_client": totals[3],
            "receive_batches": self.receive_batches, "flows_created": table.created,
            "flows_recovered": table.recovered, "flows_expired": table.expired,
            "flows_moved": self.moved,
            "flows_active": len(table), "flows_pending": len(table.pending),
            "flows_pending_created": table.pending_created,
            "flows_pending_expired": table.pending_expired,
            "flows_pending_evicted": table.pending_evicted,
            "rate_limit_untracked": self.admission.limiter.untracked,
        }
        cache = self.cache
        if cache is not None:
            values.update(redis_writes=cache.writes, redis_writes_dropped=cache.writes_dropped,
                          redis_lookups=cache.lookups, redis_hits=cache.hits,
                          redis_errors=cache.errors, redis_up=int(cache.up))
        if self.native is not None:   # its pending flows are the worker's too
            native = self.native.counters()
            values["packets_to_server"] += native["live_packets"] + native["gone_packets"]
            values["bytes_to_server"] += native["live_bytes"] + native["gone_bytes"]
            values["flows_active"] += native["pending"]
            values["flows_pending"] += native["pending"]
            values["flows_pending_created"] += native["created"]
            values["flows_pending_expired"] += native["expired"]
            values["flows_pending_evicted"] += native["evicted"]
        for reason, count in self.drops.counts.items():
            values[f"drops_{reason}"] = count
        values["drops_send_failed"] += (self._send_failed + self.tx_hop.failed
                                        + self.tx_out.failed)
        return values

    def publish(self) -> None:
        self.publisher.publish(self.counters)


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
        place_worker(cpu, config.realtime)
        worker = RelayWorker(config, index, shared, sockets)
        gc.disable()  # see _GC_YOUNG_LIMIT
        gc.freeze()   # what exists now lives as long as the worker: out of every collection
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        signal.signal(signal.SIGINT, lambda *_: worker.stop())
        log_event(log, "worker_started", relay=config.name, worker=index, cpu=cpu,
                  realtime=config.realtime)
        try:
            worker.run()
        finally:
            worker.close()
    except Exception:
        log_event(log, "worker_crashed", level=logging.ERROR, relay=config.name, worker=index,
                  exc_info=True)
        sys.exit(1)
