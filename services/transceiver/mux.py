"""One UDP socket for every session of a transceiver, and the demultiplexer behind it.

Routing of an incoming datagram (after unwrapping a relay's hop header, which tells the real
client address and the relay to answer through):

- STUN request: by the local ufrag in USERNAME, and only once MESSAGE-INTEGRITY verifies with
  that session's password. A verified request teaches the mux the client's address (and the
  relay it came through); an unverified one is dropped without an answer.
- STUN response: to the session that owns the sender's address (it holds the transaction).
- Anything else (DTLS, SRTP, SRTCP): to the session that owns the sender's address.

Sending goes only to learned addresses, wrapped in a hop header when the client came through a
relay. A datagram for an address not learned yet (the session's own checks towards the client's
signalled candidates) is parked and sent the moment an authenticated check from that address
arrives, instead of waiting for the 500 ms STUN retransmission.

Bounds (hostile input): an address that never authenticated leaves no state behind, however
many datagrams it sends; everything the mux holds is per registered session and capped:
learned addresses (``_ADDR_LIMIT``, the least recently checked one is forgotten), parked
datagrams (``_PARK_LIMIT``) and the hop-header cache (one entry per learned address behind a
relay). Every datagram received is either delivered to a session or counted under exactly one
drop reason (``MuxCounters.DROPS``); ``state_sizes()`` says what is held now.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from dataclasses import dataclass, field

from aioice import stun

from services.wire import hop
from services.wire.stun import StunError, read_username, server_ufrag

log = logging.getLogger("voiceedge.transceiver")

_PARK_LIMIT = 16     # parked datagrams per session
_PARK_TTL = 5.0      # seconds a parked datagram waits for its address
_ADDR_LIMIT = 16     # learned addresses per session (a client has a few candidates)
_SO_MEMINFO, _SK_MEMINFO_DROPS = 55, 8  # linux/sock_diag.h: the socket's kernel drop count
# Socket buffers: the one socket takes what a socket per session would each take, so a short
# stall of the event loop must not overflow it (the relay's sockets have the same).
_BUFFER_BYTES = 4 << 20
_SO_RCVBUFFORCE, _SO_SNDBUFFORCE = 33, 32
# Datagrams read per readiness event. asyncio's datagram transport reads one per turn of the
# event loop, and a turn runs every ready callback of every session: under the hostile flood
# (~6,000 checks a second for no session, besides the calls' media) the socket's queue
# overflowed while the loop turned. So the mux reads a batch per readiness event; the bound
# keeps the sessions' own callbacks running between batches.
_READ_BATCH = 64
_MAX_DATAGRAM = 65535


class MuxPort:
    """What the mux needs of a session: its ufrag/password and two sinks.

    ``datagram_received`` takes STUN (aioice's StunProtocol, subclassed in ice.py), through
    ``stun_received`` with the message the mux has already parsed; ``media_received`` takes
    everything else, which the mux has already told from STUN.
    """

    ufrag: str
    password: bytes

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # pragma: no cover
        raise NotImplementedError

    def media_received(self, data: bytes) -> None:  # pragma: no cover
        raise NotImplementedError

    def stun_received(self, message: stun.Message, data: bytes,
                      addr: tuple[str, int]) -> None:
        """A STUN message the mux parsed (a request: authenticated too); by default its bytes
        go to ``datagram_received``. A port that can take the parsed message saves a parse."""
        self.datagram_received(data, addr)


@dataclass
class MuxCounters:
    """``datagrams_in == delivered + sum of DROPS``; ``parked == parked_sent + parked_expired
    + parked now`` (``parked_dropped`` were never parked)."""

    DROPS = ("bad_hop_header", "empty", "stun_malformed", "stun_unknown_ufrag",
             "stun_unauthenticated", "stun_unknown_address", "unknown_address")

    datagrams_in: int = 0
    delivered: int = 0             # to a session (STUN or media)
    delivered_rtp: int = 0         # of which RTP (RFC 7983 128-191, not RTCP)
    datagrams_out: int = 0
    from_relays: int = 0
    bad_hop_header: int = 0        # undecodable, or the direction towards the client
    empty: int = 0                 # no bytes (after the hop header, if any)
    stun_malformed: int = 0        # first byte in STUN's range (0-3), not a STUN message
    stun_unknown_ufrag: int = 0    # request for no registered session
    stun_unauthenticated: int = 0  # request whose MESSAGE-INTEGRITY does not verify
    stun_unknown_address: int = 0  # response or indication from an address not learned
    unknown_address: int = 0       # anything else from an address not learned
    parked: int = 0
    parked_sent: int = 0
    parked_expired: int = 0        # never sent: its TTL passed or its session ended first
    parked_dropped: int = 0        # not parked: its session had _PARK_LIMIT parked already
    send_unregistered: int = 0     # a send from a session no longer registered
    send_failed: int = 0           # the kernel refused a send (buffer full, unreachable): lost
    addresses_evicted: int = 0     # learned addresses forgotten for a session's newer ones
    kernel_drops: int = 0  # datagrams the kernel dropped for this socket (receive buffer full)


@dataclass
class _Learned:
    port: MuxPort
    relay: tuple[str, int] | None  # None: the client reaches this socket directly
    header: bytes = b""            # the hop header towards this client, once made
    hop_key: bytes = b""           # the client's header from the relay, once cached


@dataclass
class _Parked:
    items: list[tuple[float, bytes, tuple[str, int]]] = field(default_factory=list)


class SharedSocket:
    """The transceiver's single UDP socket. Use ``await SharedSocket.open(host, port)``.

    The mux owns the socket itself rather than through an asyncio transport: the event loop
    says when it is readable and the mux reads up to _READ_BATCH datagrams (or the native
    plane does, ``read_through``); it sends with ``sendto`` at once, and a send the kernel
    refuses is lost as a datagram on a full link is (``send_failed``). Owning the fd is what
    lets the plane read it, on asyncio's own loop and on uvloop alike (uvloop's transports
    keep their fd to themselves)."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        """``sock``: bound and non-blocking, read from the running loop. Without one (tests,
        fuzzers) the mux demultiplexes what ``datagram_received`` gives it and sends nothing."""
        self._sock: socket.socket | None = sock
        self._loop = asyncio.get_running_loop() if sock is not None else None
        self.counters = MuxCounters()
        self._by_ufrag: dict[str, MuxPort] = {}
        self._by_addr: dict[tuple[str, int], _Learned] = {}
        # id(port) -> its learned addresses, least recently authenticated first
        self._addrs_of: dict[int, dict[tuple[str, int], None]] = {}
        self._parked: dict[int, _Parked] = {}
        self._swept_at = time.monotonic()
        # Parsing a hop header makes an ipaddress object, each way, per datagram: instead,
        # a learned client's header bytes map to its address, and a learned address keeps
        # the header towards it. Only learned clients: a flood of headers naming unknown
        # clients must neither grow this nor push the real clients out.
        self._hop_clients: dict[bytes, tuple[str, int]] = {}
        self._plane = None  # the native media plane, once it reads the socket (nativeplane.py)
        if sock is not None:
            self._loop.add_reader(sock.fileno(), self._on_readable)

    @classmethod
    async def open(cls, host: str, port: int, buffer_bytes: int = _BUFFER_BYTES) -> "SharedSocket":
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                             socket.SOCK_DGRAM)
        try:
            for opt, force in ((socket.SO_RCVBUF, _SO_RCVBUFFORCE),
                               (socket.SO_SNDBUF, _SO_SNDBUFFORCE)):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, force, buffer_bytes)  # root
                except PermissionError:
                    sock.setsockopt(socket.SOL_SOCKET, opt, buffer_bytes)  # up to rmem_max
            sock.bind((host, port))
            sock.setblocking(False)
            return cls(sock)
        except BaseException:
            sock.close()
            raise

    @property
    def address(self) -> tuple[str, int]:
        return self._sock.getsockname()[:2]

    def get_extra_info(self, name: str, default=None):
        """What an asyncio transport would say of the socket (aioice asks for ``sockname``)."""
        if self._sock is None:
            return default
        if name == "socket":
            return self._sock
        if name == "sockname":
            return self._sock.getsockname()
        return default

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            sock.close()

    def read_kernel_drops(self) -> int:
        """Update ``counters.kernel_drops`` from the kernel (SO_MEMINFO) and return it."""
        if self._sock is not None:
            try:
                raw = self._sock.getsockopt(socket.SOL_SOCKET, _SO_MEMINFO, 9 * 4)
                self.counters.kernel_drops = struct.unpack("9I", raw)[_SK_MEMINFO_DROPS]
            except OSError:
                pass
        return self.counters.kernel_drops

    def fileno(self) -> int:
        return self._sock.fileno()

    def read_through(self, plane) -> None:
        """Hand the socket's reads to ``plane``, the native media plane: it reads in batches,
        keeps its sessions' RTP and returns everything else, which is received here as
        before (sends still go out here)."""
        self._plane = plane
        self._loop.remove_reader(self._sock.fileno())
        self._loop.add_reader(self._sock.fileno(), self._read_plane)

    def _read_plane(self) -> None:
        if self._sock is None:
            return
        for data, addr in self._plane.read():
            self._receive(data, addr)

    def relay_of(self, client: tuple[str, int]) -> tuple[str, int] | None:
        """The relay a learned client last came through (None: directly, or not learned)."""
        learned = self._by_addr.get(client)
        return learned.relay if learned is not None else None


    # ------------------------------------------------------------ registration

    def register(self, port: MuxPort) -> None:
        if port.ufrag in self._by_ufrag:
            raise ValueError(f"ufrag {port.ufrag} is already registered")
        self._by_ufrag[port.ufrag] = port
        self._addrs_of[id(port)] = {}

    def rename(self, port: MuxPort, old_ufrag: str) -> None:
        """Route requests by the port's new ufrag instead of ``old_ufrag`` (an ICE restart,
        services/icerestart.py); the addresses it learned stay, so the media carries on."""
        other = self._by_ufrag.get(port.ufrag)
        if other is not None and other is not port:
            raise ValueError(f"ufrag {port.ufrag} is already registered")
        if self._by_ufrag.get(old_ufrag) is port:
            del self._by_ufrag[old_ufrag]
        self._by_ufrag[port.ufrag] = port

    def unregister(self, port: MuxPort) -> None:
        if self._by_ufrag.get(port.ufrag) is port:
            del self._by_ufrag[port.ufrag]
        for addr in self._addrs_of.pop(id(port), {}):
            self._forget(addr)
        parked = self._parked.pop(id(port), None)
        if parked is not None:
            self.counters.parked_expired += len(parked.items)

    @property
    def sessions(self) -> int:
        return len(self._by_ufrag)

    def state_sizes(self) -> dict[str, int]:
        """What the mux holds now; each is bounded by the registered sessions."""
        return {"learned_addresses": len(self._by_addr), "ufrags": len(self._by_ufrag),
                "parked": sum(len(p.items) for p in self._parked.values()),
                "parked_lists": len(self._parked), "hop_cache": len(self._hop_clients)}

    def _forget(self, addr: tuple[str, int]) -> None:
        learned = self._by_addr.pop(addr, None)
        if learned is not None and learned.hop_key:
            self._hop_clients.pop(learned.hop_key, None)

    # ------------------------------------------------------------ receive

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        """One datagram, as if read off the socket."""
        self._receive(data, addr)

    def _on_readable(self) -> None:
        """Up to _READ_BATCH datagrams per readiness event: a batch, then the sessions'
        callbacks get their turn."""
        for _ in range(_READ_BATCH):
            sock = self._sock
            if sock is None:
                return
            try:
                data, addr = sock.recvfrom(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # an ICMP error queued on the socket (reading it clears it)
                continue
            self._receive(data, addr)

    def _receive(self, data: bytes, addr: tuple) -> None:
        counters = self.counters
        counters.datagrams_in += 1
        relay = None
        if data and data[0] == hop.MAGIC:
            key = data[:hop.IPV4_LENGTH]
            client = self._hop_clients.get(key)
            if client is not None:  # only valid IPv4 headers towards the server are cached
                data = data[hop.IPV4_LENGTH:]
            else:
                try:
                    header, payload = hop.decode(data)
                except hop.HopHeaderError:
                    counters.bad_hop_header += 1
                    return
                if header.direction != hop.TO_SERVER:
                    counters.bad_hop_header += 1
                    return
                client, data = header.client, bytes(payload)
                learned = self._by_addr.get(client)
                if learned is not None and header.length == hop.IPV4_LENGTH:
                    self._hop_clients[key] = client
                    learned.hop_key = key
            counters.from_relays += 1
            relay = (addr[0], addr[1])
        else:
            client = (addr[0], addr[1])

        if not data:
            counters.empty += 1
            return
        if data[0] < 4:
            if len(data) > 1 and not data[0] & 0x01 and not data[1] & 0x10:  # a request
                self._check_received(data, client, relay)
            else:
                self._stun_from_peer(data, client)
            return
        learned = self._by_addr.get(client)
        if learned is None:
            counters.unknown_address += 1
            return
        if relay is not None:
            learned.relay = relay  # answers follow the relay that last delivered the client
        counters.delivered += 1
        if 127 < data[0] < 192 and len(data) > 1 and not 191 < data[1] < 224:
            counters.delivered_rtp += 1  # the native plane takes these once a session is on it
        learned.port.media_received(data)

    def _check_received(self, data: bytes, client, relay) -> None:
        """A STUN request: delivered to its session once its MESSAGE-INTEGRITY verifies."""
        port = self._session_named(data)
        if port is None:
            return
        message = self._parse(data)
        if message is None:
            return
        if not message.check_message_integrity(port.password):
            self.counters.stun_unauthenticated += 1
            return
        self._learn(port, client, relay)
        self.counters.delivered += 1
        port.stun_received(message, data, client)

    def _session_named(self, data: bytes) -> MuxPort | None:
        """The session a STUN request's USERNAME names, read with a walk to it (counted as a
        drop when none): a flood of checks for ufrags that route here (the ufrag is public)
        but name no session costs a dict lookup, not aioice's parse of every attribute."""
        try:
            username = read_username(data)
        except StunError:
            self.counters.stun_malformed += 1
            return None
        port = (self._by_ufrag.get(server_ufrag(username).decode("utf-8", "replace"))
                if username is not None else None)
        if port is None:
            self.counters.stun_unknown_ufrag += 1
        return port

    def _stun_from_peer(self, data: bytes, client) -> None:
        """A STUN response or indication (or bytes too short to say): delivered by the address
        it came from."""
        message = self._parse(data)
        if message is None:
            return
        learned = self._by_addr.get(client)
        if learned is None:
            self.counters.stun_unknown_address += 1
            return
        self.counters.delivered += 1
        learned.port.stun_received(message, data, client)

    def _parse(self, data: bytes) -> stun.Message | None:
        try:
            return stun.parse_message(data)
        except (ValueError, struct.error):  # aioice: struct.error for short attributes
            self.counters.stun_malformed += 1
            return None

    def _learn(self, port: MuxPort, client: tuple[str, int], relay) -> None:
        addrs = self._addrs_of[id(port)]
        known = self._by_addr.get(client)
        if known is not None and known.port is port:
            known.relay = relay
            del addrs[client]  # most recently authenticated last
            addrs[client] = None
            return
        if known is not None:  # the address moved to another session: forget it there
            self._addrs_of.get(id(known.port), {}).pop(client, None)
            self._forget(client)
        while len(addrs) >= _ADDR_LIMIT:
            oldest = next(iter(addrs))
            del addrs[oldest]
            self._forget(oldest)
            self.counters.addresses_evicted += 1
        self._by_addr[client] = _Learned(port, relay)
        addrs[client] = None
        parked = self._parked.get(id(port))
        if parked:
            now, keep = time.monotonic(), []
            for at, data, addr in parked.items:
                if addr == client:
                    self._send(data, client, relay)
                    self.counters.parked_sent += 1
                elif now - at < _PARK_TTL:
                    keep.append((at, data, addr))
                else:
                    self.counters.parked_expired += 1
            parked.items = keep
            if not keep:
                del self._parked[id(port)]

    # ------------------------------------------------------------ send

    def sendto(self, port: MuxPort, data: bytes, addr: tuple[str, int]) -> None:
        learned = self._by_addr.get(addr)
        if learned is not None and learned.port is port:
            self._send(data, addr, learned.relay, learned)
            return
        if id(port) not in self._addrs_of:
            self.counters.send_unregistered += 1
            return
        now = time.monotonic()
        if now - self._swept_at >= _PARK_TTL:
            self._sweep_parked(now)
        parked = self._parked.setdefault(id(port), _Parked())
        if len(parked.items) >= _PARK_LIMIT:
            self._expire(parked, now)
        if len(parked.items) < _PARK_LIMIT:
            parked.items.append((now, data, addr))
            self.counters.parked += 1
        else:
            self.counters.parked_dropped += 1

    def _expire(self, parked: _Parked, now: float) -> None:
        keep = [item for item in parked.items if now - item[0] < _PARK_TTL]
        self.counters.parked_expired += len(parked.items) - len(keep)
        parked.items = keep

    def _sweep_parked(self, now: float) -> None:
        """Expire every session's parked datagrams; drop the lists left empty (sessions whose
        checks went nowhere would otherwise each keep one until they end)."""
        self._swept_at = now
        for key, parked in list(self._parked.items()):
            self._expire(parked, now)
            if not parked.items:
                del self._parked[key]

    def _send(self, data: bytes, client: tuple[str, int], relay, learned=None) -> None:
        sock = self._sock
        if sock is None:
            return
        self.counters.datagrams_out += 1
        if relay is not None:
            if learned is None:
                header = hop.encode(client, hop.TO_CLIENT)
            else:
                header = learned.header or hop.encode(client, hop.TO_CLIENT)
                learned.header = header
            data, client = header + data, relay
        try:
            sock.sendto(data, client)
        except OSError:  # a full send buffer, an ICMP error: the datagram is lost
            self.counters.send_failed += 1
