"""Coverage-guided fuzzing of the native media plane (services/mediaplane/_mediaplane.c).

    python -m bench.fuzz_mediaplane --runs 1000000     fuzz: atheris (libFuzzer) drives the C
    python -m bench.fuzz_mediaplane --replay PATH...   run inputs once (a crash file, a corpus)
    python -m bench.fuzz_mediaplane --regressions      the inputs that once broke an invariant
    python -m bench.fuzz_mediaplane --coverage [DIR]   line/branch coverage of the C over a corpus

The extension is built a second time, with clang's ``-fsanitize=address,undefined,
fuzzer-no-link`` (edge counters and comparison tracing for libFuzzer, ASan and UBSan fatal),
under build/fuzz-mediaplane/ (never over the in-tree .so), and the fuzzing runs in a child
process with atheris's ASan+libFuzzer runtime preloaded and ``PYTHONMALLOC=malloc`` (so ASan
sees every Python buffer the plane reads; ``--pymalloc`` trades that for ~1.8x the speed).
Needs Debian's clang (``apt-get install clang``) and atheris (``pip install atheris``); neither
is a dependency of the project yet.

An input is a small program against one fresh Plane (so every input replays alone): a config
byte (capacity, a shared socket or none, the first sessions: AES128_CM_SHA1_80 on libsrtp2 and
AEAD_AES_256_GCM on the plane's own GCM, srtp_gcm.c; direct and relayed, Opus and pcm16, one
with a socket of its own; sessions added later may be AEAD_AES_128_GCM too), then up
to 64 operations: datagrams (the harness's bytes as RTP protected by the peer with the
session's keys, with another session's keys, protected then tampered, or raw; with or without
the relay's hop header; from the session's address, a stranger's, the other path's; through
``process`` or through the real loopback socket and ``read``/``read_session``, in bursts of up
to 80 copies or series of up to 16 packets), ``put_batch`` records (well-formed or raw),
``tick`` (every session, or one send group's), ``take_batch``, ``add`` (good and bad
parameters, sessions with a socket of their own: a client's with a script, keeping what it hears
or not, a port-per-session server's without, either through a TURN channel or not), ``remove``,
``set_pcm``, ``move`` (to another client address, bare or through a relay; refused onto
another session's address), ``stats``, ``take_arrivals``, ``take_heard`` and ``decode`` (what was heard, whole
and cut short). The harness's sockets are
on 127.90.0.0/24 (loopback only; every address the plane can send to is one of them).

Beside "no crash" (ASan, UBSan, a signal), a model of the plane checks after every operation:
each datagram lands in exactly one counter, and ``datagrams == to_python + rtp_in + the SRTP
and RTP drops + recv_truncated``; what goes to Python is the datagram unchanged, exactly when
the routing rules say no session owns it; no packet reaches a session unless protected with
its keys (forged, replayed or misrouted ones never do); ``take_batch`` names only live
channels and gives each exactly the payloads the model queued (RFC 3550 parsing, 8 frames kept);
``put_batch`` queues and counts records as specified (a pcm16 session's 1920-byte record
encoded, one of 1-1275 bytes passed through); a keeping client's ``take_heard`` gives
each payload it took, with its sequence number and timestamp, until its log is full (then
``heard_lost``), and ``decode`` gives 20 ms of PCM per well-formed record and refuses a cut one; every packet ``tick`` counts as sent
arrives where the session says, decrypts with the peer's keys and carries the expected
sequence, timestamp, SSRC, header extensions and payload; channels are generation-numbered and
never reused; ``stats`` agrees. A broken invariant raises ``Violation``: libFuzzer saves the
input (``crash-*``) and stops.
"""
from __future__ import annotations

import hashlib
import operator
import os
import select
import socket
import struct
import sys
from collections import deque
from pathlib import Path

from bench.fuzzing import Harness, Tally, Target, command

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "build" / "fuzz-mediaplane"
ENV_SOURCE = "VOICEEDGE_FUZZ_MEDIAPLANE_SOURCE"  # another copy of the C to build
TRACE = bool(os.environ.get("VOICEEDGE_FUZZ_TRACE"))  # --replay --trace: every operation


# _mediaplane.c's sizes
SLOT_BYTES, FRAME_MAX, RING, OUT_KEEP, PCM_BYTES, OPUS_MAX, ARRIVALS = 2048, 1920, 8, 5, 1920, 1275, 2048
HEARD_BYTES, HEARD_HEAD = 65536, 16
# from add's SSRC (no byte of its own, so older inputs read the same): a client session keeps
# what it hears (not pcm16) with 0x2 set; a server session asks to (refused) with 0xE in the
# low nibble; the send group is bits 2-3
TAKEN = ("rtp_in", "drop_srtp_auth", "drop_srtp_replay", "drop_srtp_other", "drop_rtp_malformed",
         "recv_truncated", "drop_ssrc_limit", "rtcp_in", "drop_rtcp_auth", "drop_rtcp_replay",
         "drop_rtcp_other", "drop_rtcp_malformed")
CNAME = b"fuzz"       # a session keeps its RTCP in the plane when its SSRC is odd
# an own session's u16 after add's parameters: the script's length (low 9 bits), a TURN
# channel (the next 6: with 0x20 set, 0x4000 + the low 5, or 0x3F: one out of range), no
# script (the top bit)
OWN_SERVER, TURN_SHIFT, TURN_ON, TURN_BAD = 0x8000, 9, 0x20, 0x3F
# libsrtp's profiles and their key+salt lengths: 1 AES128_CM_SHA1_80, 2 AES128_CM_SHA1_32,
# 5 NULL_SHA1_80, 7 AEAD_AES_128_GCM, 8 AEAD_AES_256_GCM
KEY_LENGTHS = {1: 30, 2: 30, 5: 30, 7: 28, 8: 44}
SILENCE = b"\xf8\xff\xfe"
PCM = object()        # a pcm16 frame: its bytes are the codec's, only its length is known
CODED_SILENCE = 3     # a pcm16 session's silent frames encoded after its audio (_mediaplane.c)

# the operations, by the low 4 bits of their byte
OPS = ("datagram",) * 6 + ("put", "put", "tick", "tick", "take", "add", "add", "remove",
                           "set_pcm", "stats")
MAX_OPS = 64
# the first sessions, by the config byte: profile, relayed, pcm
INITIAL = ((1, False, False), (8, True, False), (1, False, True), (8, False, False))


class Violation(AssertionError):
    """The plane broke one of the invariants the harness checks."""


def check(ok: bool, what: str, *detail) -> None:
    if not ok:
        raise Violation(what + (": " + ", ".join(repr(d) for d in detail) if detail else ""))


# ------------------------------------------------------------------ the extension and its builds

TARGET = Target(suffix="._mediaplane", work=WORK, source_env=ENV_SOURCE, tool="fuzz_mediaplane")
extension, build, load = TARGET.extension, TARGET.build, TARGET.load


# ------------------------------------------------------------------ the harness

# The harness's sockets are at fixed loopback addresses, so the keys and with them the plane's
# hash-table layout are the same in every run and an input replays exactly (an address already
# taken falls back to an ephemeral port: the run goes on, table-layout-dependent inputs may not
# replay). Indices: 1-20 clients, 21-22 relays, 23 the stranger, 24-27 own sockets, 250 the plane.
HOST, PORT = "127.90.0.%d", 47111


def udp(index: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((HOST % index, PORT))
    except OSError:
        s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    # room for a burst of 80 datagrams of 2 KiB (the default buffer holds ~48 of them)
    for opt in (getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF):
        try:
            s.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
            break
        except OSError:
            continue
    return s


def key_of(addr: tuple[str, int]) -> bytes:
    """A client's 48-bit key as the plane has it: port, then IPv4, network order (hop.py)."""
    return struct.pack("!H", addr[1]) + socket.inet_aton(addr[0])


def rtp_payload(clear: bytes):
    """What the plane should hand the agent from an unprotected RTP packet: the payload after
    the CSRCs and the header extension, less the padding (RFC 3550 5.1, 5.3.1); None when the
    header does not fit, or a padding count of 0 (the count includes itself)."""
    if len(clear) < 12 or clear[0] >> 6 != 2:
        return None
    off = 12 + 4 * (clear[0] & 0x0F)
    if clear[0] & 0x10:
        if off + 4 > len(clear):
            return None
        off += 4 + 4 * int.from_bytes(clear[off + 2:off + 4], "big")
    end = len(clear)
    if clear[0] & 0x20:
        if end <= off or clear[end - 1] == 0:
            return None
        end -= clear[end - 1]
    return None if off > end else clear[off:end]


def records(blob: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos < len(blob):
        check(len(blob) - pos >= 6, "take_batch: a record header cut short", blob[pos:])
        channel, length = struct.unpack_from("!IH", blob, pos)
        check(pos + 6 + length <= len(blob), "take_batch: a record cut short", channel, length)
        out.append((channel, blob[pos + 6:pos + 6 + length]))
        pos += 6 + length
    return out


class Reader:
    """The input, consumed front to back; zeros once it is spent."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def u16(self) -> int:
        return self.byte() << 8 | self.byte()

    def u32(self) -> int:
        return self.u16() << 16 | self.u16()

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out


class World:
    """What lives across inputs: the sockets (the plane's, the clients', two relays', a
    stranger's, the own sockets of client sessions) and a keeper plane whose one session keeps
    libsrtp's crypto backend initialised (Debian's libsrtp2 is built on NSS, and an srtp_create
    with no other context alive costs ~1 ms of NSS start-up)."""

    def __init__(self, module) -> None:
        import pylibsrtp
        from services.wire import hop
        self.module, self.srtp, self.hop = module, pylibsrtp, hop
        self.sock = udp(250)
        self.addr = self.sock.getsockname()
        self.clients = [udp(1 + i) for i in range(20)]
        self.relays = [udp(21 + i) for i in range(2)]
        self.stranger = udp(23)
        self.own = [udp(24 + i) for i in range(4)]
        self.sinks = self.clients + self.relays + [self.stranger]
        self.everyone = self.sinks + self.own + [self.sock]
        self.by_addr = {s.getsockname(): s for s in self.everyone}
        self.name = {s.fileno(): s.getsockname() for s in self.everyone}
        self.by_fd = {s.fileno(): s for s in self.everyone}
        self.poll = select.poll()
        for s in self.everyone:
            self.poll.register(s, select.POLLIN)
        self.client_addrs = [s.getsockname() for s in self.clients]
        self.relay_addrs = [s.getsockname() for s in self.relays]
        self.stranger_addr = self.stranger.getsockname()
        self.keeper = module.Plane(self.sock.fileno(), 1)
        self.keeper.add(("127.0.0.1", 9), None, 1, bytes(30), bytes(30), 0, 0, 0, 111, b"", 0, 0, b"")
        self.has_own = hasattr(module.Plane, "read_session")
        self.has_set_pcm = hasattr(module.Plane, "set_pcm")
        self.has_rtcp = hasattr(module.Plane, "report")
        self.has_keep = hasattr(module.Plane, "take_heard")
        self.has_move = hasattr(module.Plane, "move")
        self.tally = Tally()

    def ready(self) -> list[socket.socket]:
        """The sockets with something to read (one poll for all of them)."""
        return [self.by_fd[fd] for fd, _ in self.poll.poll(0)]

    def drain(self, sock: socket.socket) -> list[tuple[bytes, tuple]]:
        out = []
        while True:
            try:
                out.append(sock.recvfrom(65536))
            except BlockingIOError:
                return out

    def key(self, profile: int, n: int) -> bytes:
        return hashlib.blake2b(b"%d:%d" % (profile, n), digest_size=64).digest()[:KEY_LENGTHS[profile]]

    def peer(self, profile: int, key: bytes, outbound: bool):
        P = self.srtp.Policy
        policy = P(key=key, ssrc_type=P.SSRC_ANY_OUTBOUND if outbound else P.SSRC_ANY_INBOUND,
                   srtp_profile=profile)
        if outbound:
            policy.allow_repeat_tx = True
        return self.srtp.Session(policy)


class Session:
    """The model of one session on the plane."""

    def __init__(self, case: "Case", slot: int, channel: int, profile: int, client, relay,
                 pcm: bool, ssrc: int, seq: int, ts: int, pt: int, mid: bytes, mid_id: int,
                 ast_id: int, silence: bytes, up: bytes, down: bytes, own=None, script=(),
                 client_session: bool = False, turn: int = 0):
        self.slot, self.channel, self.profile, self.client = slot, channel, profile, client
        self.key = key_of(client)
        self.relayed = relay is not None
        self.relay = relay if relay is not None else ("0.0.0.0", 0)
        self.home_relay = self.relay
        self.pcm, self.ssrc, self.seq, self.ts, self.pt = pcm, ssrc, seq, ts, pt
        self.coded = CODED_SILENCE   # pcm16: silent frames encoded since its audio ended
        self.mid, self.mid_id, self.ast_id, self.silence = mid, mid_id, ast_id, silence
        self.own, self.script, self.script_pos = own, list(script), 0
        self.client_session = client_session   # own socket and a script: logs, keeps nothing
        self.turn = turn                       # ChannelData of this channel, to/from client
        self.tx = case.world.peer(profile, up, True)        # the peer's protect, towards the plane
        self.down, self._rx = down, None
        self.world = case.world
        self.inq: deque = deque(maxlen=RING)                   # what take_batch should give
        self.outq: deque = deque(maxlen=OUT_KEEP)              # what tick should send
        self.expect: deque = deque()                           # sent, not yet seen arriving
        self.arrivals: list = []
        self.packets_sent, self.live = 0, True
        self.rtcp = False
        self.reports: deque = deque()                          # (packets sent, bye) asked for
        self.keep, self.group = False, 0
        self.heard: list = []                                  # (seq, ts, payload) kept
        self.heard_bytes = 0

    @property
    def rx(self):   # the peer's unprotect of what the plane sends
        if self._rx is None:
            self._rx = self.world.peer(self.profile, self.down, False)
        return self._rx

    def ext(self) -> bytes:
        e = b""
        if self.mid_id and self.mid:
            e += bytes([self.mid_id << 4 | (len(self.mid) - 1)]) + self.mid
        if self.ast_id:
            e += bytes([self.ast_id << 4 | 2]) + b"\0\0\0"
        return e + b"\0" * (-len(e) % 4)


class Case:
    """One input against a fresh plane, with the model beside it."""

    def __init__(self, world: World, data: bytes) -> None:
        self.world, self.r, self.tally = world, Reader(data), world.tally
        cfg = self.r.byte()
        self.capacity = (1, 2, 4, 16)[cfg & 3]
        self.shared = not cfg & 0x40
        self.plane = world.module.Plane(world.sock.fileno() if self.shared else -1, self.capacity)
        self.refs: list[Session] = []
        self.live: dict[int, Session] = {}
        self.gen = [0] * self.capacity
        self.slots: list = [None] * self.capacity
        self.keys = 0
        self.prev = self.plane.counters()
        for i in range(min(self.capacity, 1 + (cfg >> 2 & 3))):
            profile, relayed, pcm = INITIAL[i]
            if i == 0:
                relayed, pcm = relayed ^ bool(cfg & 0x10), pcm ^ bool(cfg & 0x20)
            own = world.own[0] if i == 1 and cfg & 0x80 and world.has_own else None
            self.add(profile, world.client_addrs[i], None if own or not relayed else
                     world.relay_addrs[i % 2], pcm, 0x11223344 + i, 1000 * i, 90000, 111, b"0", 1,
                     3, SILENCE, own=own, script=struct.pack("!IH", 0, 3) + SILENCE if own else b"")

    # -------------------------------------------------------------- bookkeeping

    def delta(self) -> dict:
        now = self.plane.counters()   # the same keys in the same order every time
        d = dict(zip(now, map(operator.sub, now.values(), self.prev.values())))
        self.prev = now
        check(min(d.values()) >= 0, "a counter went down", d)
        check(d["datagrams"] == d["to_python"] + sum(d.get(k, 0) for k in TAKEN),
              "datagrams != to_python + taken", d)
        return d

    def shared_by_key(self, key: bytes):
        for s in self.live.values():
            if s.own is None and s.key == key:
                return s
        return None

    def pick_channel(self) -> int:
        c = self.r.byte()
        if c & 0x80 or not self.refs:
            return self.r.u32()
        return self.refs[c % len(self.refs)].channel

    def other_keys(self, ref: Session):
        """Another session's protect (and that session), or a stranger's (and None)."""
        for s in self.refs:
            if s is not ref and s.profile == ref.profile:
                return s, s.tx
        self.keys += 1
        return None, self.world.peer(ref.profile, self.world.key(ref.profile, 10_000 + self.keys), True)

    def route(self, wire: bytes, src, own: Session | None):
        """The session the plane's rules give ``wire`` from ``src`` (read on the shared socket,
        or on ``own``'s socket): (session or None, whether it is a wrong peer, whether the
        session takes it as SRTCP)."""
        pkt, key, relayed = wire, key_of(src), False
        if own is not None and own.turn:
            if len(wire) < 4 or int.from_bytes(wire[:2], "big") != own.turn:
                return None, False, False
            inner = int.from_bytes(wire[2:4], "big")
            if inner > len(wire) - 4:
                return None, False, False
            if key != own.key:
                return None, True, False
            pkt = wire[4:4 + inner]
        elif wire[:1] == b"\x0e":
            if len(wire) < 8 or wire[1] != 0:
                return None, False, False
            key, pkt, relayed = wire[2:8], wire[8:], True
        if len(pkt) < 2 or not 128 <= pkt[0] <= 191:
            return None, False, False
        rtcp = 192 <= pkt[1] <= 223     # SRTCP: the plane's only for a session that keeps it
        if rtcp and own is not None and not own.rtcp:
            return None, False, False
        if own is not None:
            return (None, True, False) if relayed or own.key != key else (own, False, rtcp)
        s = self.shared_by_key(key)
        if s is None or s.relayed != relayed or (rtcp and not s.rtcp):
            return None, False, False
        return s, False, rtcp

    # -------------------------------------------------------------- operations

    def run(self) -> None:
        for _ in range(MAX_OPS):
            if not self.r.left():
                break
            op = OPS[self.r.byte() & 15]
            self.tally.add("op_" + op)
            if TRACE:
                print(f"@{self.r.pos - 1} {op} live={sorted(self.live)}", file=sys.stderr)
            getattr(self, "op_" + op)()
        self.op_take()
        for sock in self.world.ready():
            stray = self.world.drain(sock)
            check(not stray, "datagrams outside a tick (or unread)", sock.getsockname(), stray[:2])
        check(self.plane.sessions == len(self.live), "sessions", self.plane.sessions, len(self.live))

    def add(self, profile, client, relay, pcm, ssrc, seq, ts, pt, mid, mid_id, ast_id, silence,
            bad: int = 0, bad_arg: int = 0, own=None, script: bytes | None = b"",
            turn: int = 0) -> None:
        """plane.add with what the model expects of it: the channel, or the error."""
        w = self.world
        self.keys += 1
        up, down = w.key(profile, 2 * self.keys), w.key(profile, 2 * self.keys + 1)
        args = dict(client=client, relay=relay, profile=profile, rx_key=up, tx_key=down,
                    ssrc=ssrc, seq=seq, timestamp=ts, payload_type=pt, mid=mid, mid_id=mid_id,
                    abs_send_time_id=ast_id, silence=silence, pcm=pcm)
        if own is not None:
            args.update(fd=own.fileno())
            if script is not None:
                args.update(script=script)
            if turn:
                args.update(turn_channel=turn)
        rtcp = w.has_rtcp and bool(ssrc & 1)
        if rtcp:
            args.update(rtcp=True, cname=CNAME)
        keep = bad_keep = False
        if w.has_keep and own is not None:
            if script is not None and not pcm and ssrc & 2:
                keep = True
            elif script is None and ssrc & 0xF == 0xE:
                keep = bad_keep = True
            if keep:
                args.update(keep=True)
        if w.has_keep:
            args.update(group=ssrc >> 2 & 3)
        # a bad parameter, and the error the plane must answer with (in the order it checks)
        if bad == 1:
            args["profile"] = profile = bad_arg - 8
        elif bad == 2:
            args["rx_key" if bad_arg & 1 else "tx_key"] = (up + b"!")[:len(up) + (1 if bad_arg & 2 else -1)]
        elif bad == 3:
            args["mid"] = bytes(17 + bad_arg % 4)
        elif bad == 4:
            args["silence"] = bytes(65 + bad_arg % 4)
        elif bad == 5:
            args["payload_type"] = 128 + bad_arg if bad_arg & 1 else -1 - bad_arg
        elif bad == 6:
            args["mid_id"] = 15 + bad_arg if bad_arg & 1 else -1
        elif bad == 7:
            args["abs_send_time_id"] = 15 + bad_arg if bad_arg & 1 else -1
        elif bad == 8:
            args["seq"] = 65536 + bad_arg
        elif bad == 9:
            args["client"] = ("::1", 5000) if bad_arg & 1 else ("127.0.0.1", 65536 + bad_arg)
        if own is not None:
            w.drain(own)
        expected = None
        if bad in (3, 4, 5, 6, 7, 8, 9) or 64 <= args["payload_type"] <= 95:   # RFC 5761 4
            expected = ValueError
        elif own is not None and relay is not None:
            expected = ValueError
        elif turn and not 0x4000 <= turn <= 0x4FFF:
            expected = ValueError
        elif bad_keep:
            expected = ValueError
        elif own is None and self.shared_by_key(key_of(client)) is not None:
            expected = ValueError
        elif len(self.live) >= self.capacity:
            expected = OverflowError
        elif profile not in KEY_LENGTHS or not (len(args["rx_key"]) == len(args["tx_key"]) ==
                                                 KEY_LENGTHS[profile]):
            expected = ValueError
        try:
            channel = self.plane.add(**args)
        except (ValueError, OverflowError) as e:
            check(type(e) is expected, "add: an error the model does not expect", args, e)
            self.tally.add("add_refused")
            self.delta()
            return
        check(expected is None, "add: accepted what the model refuses", args, expected)
        slot = self.slots.index(None)
        self.gen[slot] = (self.gen[slot] + 1) & 0xFFFF
        check(channel == (self.gen[slot] << 16 | slot), "add: the channel", channel, slot, self.gen[slot])
        check(all(s.channel != channel for s in self.refs), "add: a channel used again", channel)
        parsed, pos = [], 0
        while pos + 6 <= len(script or b""):   # the script's records, as the plane parses them
            n = int.from_bytes(script[pos + 4:pos + 6], "big")
            if pos + 6 + n > len(script) or n == 0 or n > OPUS_MAX:
                break
            parsed.append(script[pos + 6:pos + 6 + n])
            pos += 6 + n
        s = Session(self, slot, channel, profile, client, relay, pcm, ssrc, seq, ts, pt, mid,
                    mid_id, ast_id, silence, up, down, own, parsed,
                    client_session=own is not None and script is not None, turn=turn)
        s.rtcp = rtcp
        s.keep, s.group = keep, (ssrc >> 2 & 3) if w.has_keep else 0
        self.slots[slot] = s
        self.live[channel] = s
        self.refs.append(s)
        self.tally.add("add" if own is None else "add_own_turn" if turn else
                       "add_own_keep" if keep else
                       "add_own" if script is not None else "add_own_server")
        self.delta()

    def op_add(self) -> None:
        r, w = self.r, self.world
        sel = r.byte()
        profile, relayed, pcm = (1, 8)[sel & 1], bool(sel & 2), bool(sel & 4)
        if profile == 8 and not relayed and sel & 8:   # the relay bit, unused: AES-128 GCM
            profile = 7
        client = w.client_addrs[r.byte() % len(w.client_addrs)]
        relay = w.relay_addrs[sel >> 3 & 1] if relayed else None
        own = None
        if sel & 0x10 and w.has_own:   # a client session: a socket of its own, and a script
            used = {id(s.own) for s in self.live.values() if s.own is not None}
            free = [o for o in w.own if id(o) not in used]
            own = free[sel >> 5 & 3] if len(free) > (sel >> 5 & 3) else (free[0] if free else None)
        bad, bad_arg = (1 + r.byte() % 9, r.byte()) if sel & 0x80 else (0, 0)
        params = (r.u32(), r.u16(), r.u32(), r.byte() & 0x7F, r.take(r.byte() % 17),
                  r.byte() % 15, r.byte() % 15, r.take(r.byte() % 65))
        script, turn = b"", 0
        if own is not None:
            v = r.u16()
            script = r.take(v % 512)
            if v & OWN_SERVER:
                script = None
            t = v >> TURN_SHIFT & 0x3F
            turn = 0x5000 if t == TURN_BAD else (0x4000 + (t & 0x1F) if t & TURN_ON else 0)
        self.add(profile, client, relay, pcm, *params, bad=bad, bad_arg=bad_arg, own=own,
                 script=script, turn=turn)

    def unregister(self, s: Session) -> None:
        s.live = False
        del self.live[s.channel]
        self.slots[s.slot] = None
        if s.own is not None:
            self.world.drain(s.own)

    def op_remove(self) -> None:
        channel = self.pick_channel()
        s = self.live.get(channel)
        check(self.plane.remove(channel) is (s is not None), "remove", channel, s is not None)
        if s is not None:
            self.unregister(s)
        self.delta()
        check(self.plane.sessions == len(self.live), "sessions after remove")

    def op_set_pcm(self) -> None:
        channel, b = self.pick_channel(), self.r.byte()
        if b & 2 and self.world.has_move:   # the op's byte says: move the session instead
            return self.move(channel, b)
        pcm = bool(b & 1)
        if not self.world.has_set_pcm:
            return
        s = self.live.get(channel)
        check(self.plane.set_pcm(channel, pcm) is (s is not None), "set_pcm", channel)
        if s is not None:
            s.pcm = pcm
            s.coded = CODED_SILENCE
            s.inq.clear()
            s.outq.clear()
        self.delta()

    def move(self, channel: int, b: int) -> None:
        """plane.move to one of the clients' addresses, bare or through a relay: refused for a
        shared session onto another's address, and for a session on its own socket through a
        relay or a TURN channel."""
        w = self.world
        client = w.client_addrs[(b >> 2) % len(w.client_addrs)]
        relay = w.relay_addrs[b >> 7] if b & 0x40 else None
        s = self.live.get(channel)
        refused = False
        if s is not None and s.own is not None:
            refused = relay is not None or bool(s.turn)
        elif s is not None:
            other = self.shared_by_key(key_of(client))
            refused = other is not None and other is not s
        try:
            moved = self.plane.move(channel, client, relay)
        except ValueError:
            check(refused, "move refused", channel, client, relay)
            self.delta()
            return
        check(not refused and moved is (s is not None), "move", channel, moved, refused)
        if s is not None:
            s.client, s.key, s.relayed = client, key_of(client), relay is not None
            s.relay = s.home_relay = relay if relay is not None else ("0.0.0.0", 0)
            self.tally.add("moves")
        self.delta()

    def op_stats(self) -> None:
        channel = self.pick_channel()
        s = self.live.get(channel)
        st = self.plane.stats(channel)
        check((st is None) == (s is None), "stats of a channel", channel, st)
        if s is not None:
            for key, want in (("packets_sent", s.packets_sent), ("out_queued", len(s.outq)),
                              ("in_queued", len(s.inq)), ("relay", s.relay)):
                check(st.get(key, want) == want, "stats: " + key, st.get(key), want)
        if self.world.has_own:
            blob = self.plane.take_arrivals(channel)
            if s is None or not s.client_session:
                check(blob is None, "take_arrivals of a session without a log", channel)
            else:
                got = [struct.unpack_from("=dIHH", blob, i)[1:] for i in range(0, len(blob), 16)]
                check(len(blob) % 16 == 0 and got == s.arrivals, "take_arrivals", got, s.arrivals)
                s.arrivals = []
        if self.world.has_keep:
            self.take_heard(channel, s)
        self.delta()

    def take_heard(self, channel: int, s: "Session | None") -> None:
        """take_heard against the model, then decode of what it gave, whole and cut short."""
        import time
        blob = self.plane.take_heard(channel)
        if s is None or not s.keep:
            check(blob is None, "take_heard of a session that keeps nothing", channel)
            try:
                self.plane.decode(channel, b"")
                check(False, "decode on a session that keeps nothing", channel)
            except ValueError:
                pass
            return
        got, records, pos = [], [], 0
        while pos < len(blob):
            at, seq, ts, size = struct.unpack_from("=dHIH", blob, pos)
            payload = blob[pos + HEARD_HEAD:pos + HEARD_HEAD + size]
            check(0 < at <= time.time() and len(payload) == size, "take_heard: a record", at, size)
            got.append((seq, ts, payload))
            records.append(struct.pack("=H", size) + payload)
            pos += HEARD_HEAD + size
        check(got == s.heard, "take_heard", got[:3], s.heard[:3])
        s.heard, s.heard_bytes = [], 0
        self.tally.add("take_heard", len(got))
        pcm = self.plane.decode(channel, b"".join(records))
        check(len(pcm) == PCM_BYTES * len(records), "decode: 20 ms a record", len(pcm), len(records))
        d = self.delta()
        check(d["drop_decode"] <= len(records), "decode: drops", d)
        if records:
            try:
                self.plane.decode(channel, b"".join(records)[:-1])
                check(False, "decode took a cut record")
            except ValueError:
                pass

    def op_datagram(self) -> None:
        r = self.r
        sel, aux, n = r.byte(), r.byte(), r.u16() % 2201
        body = bytearray(r.take(n))
        ref = self.refs[aux % len(self.refs)] if self.refs else None
        mode, route = sel & 3, sel >> 2 & 3
        via_socket = bool(sel & 0x10)
        burst = 1 + r.byte() % 80 if via_socket and sel & 0x20 else 1
        series = 2 + r.byte() % 15 if sel & 0x40 and not via_socket else 1
        tamper = (r.u16(), r.byte() | 1) if mode == 3 else None
        hop_bytes = bytes((0x0E, r.byte())) + r.take(6).ljust(6, b"\0") if route == 2 else b""
        for i in range(series):   # a series: the next packets of the stream, one by one
            if i and len(body) >= 12:
                struct.pack_into("!HI", body, 2, (struct.unpack_from("!H", body, 2)[0] + 1) & 0xFFFF,
                                 (struct.unpack_from("!I", body, 4)[0] + 960) & 0xFFFFFFFF)
            self.datagram(bytearray(body), ref, mode, route, via_socket, burst, aux, tamper, hop_bytes)

    def datagram(self, body: bytearray, ref, mode: int, route: int, via_socket: bool, burst: int,
                 aux: int, tamper, hop_bytes: bytes) -> None:
        """One datagram (``burst`` copies through the socket) and what the model says of it."""
        w = self.world
        wire, keyed = bytes(body), None   # keyed: the session whose keys protected it
        rtcp = len(body) >= 2 and 192 <= body[1] <= 223
        if mode and ref is not None and len(body) >= (8 if rtcp else 12):
            body[0] = 0x80 | (body[0] & 0x3F)
            keyed, tx = (ref, ref.tx) if mode != 2 else self.other_keys(ref)
            try:
                wire = tx.protect_rtcp(bytes(body)) if rtcp else tx.protect(bytes(body))
            except (w.srtp.Error, ValueError):   # a header libsrtp refuses, too long
                keyed = None
                wire, mode = bytes(body), 0
            if mode == 3:   # tampered: one byte anywhere (header, payload or tag) flipped
                wire = bytearray(wire)
                wire[tamper[0] % len(wire)] ^= tamper[1]
                wire, keyed = bytes(wire), None
        self.tally.add(f"datagram_mode{mode}")
        header, src = b"", w.stranger_addr
        if ref is not None and ref.turn and route != 2:
            # its channel's ChannelData (declaring a length from the harness's byte when aux
            # says so), from its TURN server, from a stranger (route 3), or another channel's
            # from its server (route 1)
            declared = len(wire) if not aux & 0x40 else (aux * 7) % (len(wire) + 8)
            channel = ref.turn if route != 1 else ref.turn ^ (1 + (aux & 0x0F))
            header = struct.pack("!HH", channel, declared)
            src = ref.client if route != 3 else src
            if declared != len(wire):
                keyed = None   # the plane reads a cut packet, or hands it all to Python
        elif ref is not None:
            if route == 0:     # its own path
                header = w.hop.encode(ref.client) if ref.relayed else b""
                src = ref.home_relay if ref.relayed else ref.client
            elif route == 1:   # the other path: bare from the client / through a relay
                header = b"" if ref.relayed else w.hop.encode(ref.client)
                src = ref.client if ref.relayed else w.relay_addrs[aux >> 7]
            elif route == 2:   # a hop header of the harness's bytes
                header = hop_bytes
                src = w.relay_addrs[aux >> 7]
            else:              # its own path, from a stranger's address
                header = w.hop.encode(ref.client) if ref.relayed else b""
        wire = header + wire
        own = ref.own if ref is not None and ref.own is not None and via_socket else None
        if own is not None and not ref.live:
            own = None
            via_socket = False
        if not self.shared and own is None:
            via_socket = False
        if not via_socket:
            burst = 1
        expect, wrong_peer, as_rtcp = self.route(wire, src, ref if own is not None else None)
        if TRACE:
            print(f"   mode={mode} route={route} socket={via_socket}x{burst} ref={ref and ref.channel}"
                  f" keyed={keyed and keyed.channel} expect={expect and expect.channel} src={src}"
                  f" wire={wire[:20].hex()}", file=sys.stderr)
        truncated = len(wire) > SLOT_BYTES
        if via_socket:
            self.tally.add("datagram_socket", burst)
            sock = w.by_addr[src]
            for _ in range(burst):
                sock.sendto(wire, w.name[own.fileno()] if own is not None else w.addr)
            out = []
            for i in range(4):
                batches = (aux & 7) - 1 if i == 0 else 4
                out += (self.plane.read_session(ref.channel, batches) if own is not None
                        else self.plane.read(batches))
                if self.plane.counters()["datagrams"] - self.prev["datagrams"] >= burst:
                    break
            out = [(bytes(d), tuple(a)) for d, a in out]
        else:
            result = self.plane.process(wire, src)
            out = [] if result is None else [(bytes(result), tuple(src))]
        d = self.delta()
        check(d["datagrams"] == burst, "datagrams counted", d["datagrams"], burst)
        if truncated:
            self.tally.add("datagram_truncated")
            check(d["recv_truncated"] == burst and not out, "a datagram over 2048 bytes", d)
            return
        if expect is None:
            self.tally.add("datagram_to_python")
            check(d["to_python"] == burst and out == [(wire, tuple(src))] * burst,
                  "what no session owns goes to Python unchanged", d, out[:1], wire[:16])
            check(d.get("wrong_peer", 0) == (burst if wrong_peer else 0), "wrong_peer", d)
            return
        check(d["to_python"] == 0 and not out, "a session's datagram went to Python", d, out[:1])
        if as_rtcp:
            self.rtcp_datagram(d, expect, keyed, bytes(body), burst, wire, src)
            return
        if keyed is not expect:
            self.tally.add("datagram_refused")
            check(d["rtp_in"] == 0, "a packet reached a session without being protected with "
                  "its keys (forged, misrouted or raw)", d, wire[:24])
            return
        payload = rtp_payload(bytes(body))
        check(d["rtp_in"] <= 1, "a burst of one packet delivered more than once", d)
        if payload is None:
            check(d["rtp_in"] == 0, "the plane took an RTP header that does not fit", bytes(body[:24]))
        if not d["rtp_in"]:
            self.tally.add("datagram_srtp_or_malformed_drop")
            return
        self.tally.add(f"delivered_profile{expect.profile}")
        if expect.own is not None:
            self.tally.add("delivered_turn" if expect.turn else "delivered_own_server"
                           if not expect.client_session else "delivered_own_client")
        check(d["drop_srtp_replay"] == burst - 1, "a burst's copies are replays", d)
        check(d["bytes_in"] == len(wire), "bytes_in", d["bytes_in"], len(wire))
        if expect.relayed:
            expect.relay = src
        if expect.client_session:
            seq, ts_ssrc = struct.unpack_from("!H", body, 2)[0], struct.unpack_from("!I", body, 8)[0]
            if len(expect.arrivals) < ARRIVALS:
                expect.arrivals.append((ts_ssrc, seq, len(payload)))
                check(d.get("arrivals_lost", 0) == 0, "arrivals_lost", d)
            else:
                check(d.get("arrivals_lost", 0) == 1, "arrivals_lost", d)
            lost = 0
            if expect.keep and payload:   # logged for its ear, while the log has room
                size = HEARD_HEAD + len(payload)
                if len(payload) <= OPUS_MAX and expect.heard_bytes + size <= HEARD_BYTES:
                    ts = struct.unpack_from("!I", body, 4)[0]
                    expect.heard.append((seq, ts, bytes(payload)))
                    expect.heard_bytes += size
                    self.tally.add("heard")
                else:
                    lost = 1
            check(d.get("heard_lost", 0) == lost, "heard_lost", d, lost)
            return    # a client keeps nothing else of what it hears
        full = len(expect.inq) == RING
        if not payload:
            check(d["drop_in_queue_full"] == 0, "an empty payload queued", d)
        elif expect.pcm:
            self.tally.add("delivered_pcm")
            if not d["drop_decode"]:
                expect.inq.append(PCM)
                check(d["drop_in_queue_full"] == int(full), "drop_in_queue_full", d)
        elif len(payload) > FRAME_MAX:
            check(d["drop_frame_too_big"] == 1, "a payload over FRAME_MAX", d)
        else:
            check(d["drop_decode"] == 0, "an Opus session decoded", d)
            expect.inq.append(payload)
            check(d["drop_in_queue_full"] == int(full), "drop_in_queue_full", d)

    def rtcp_datagram(self, d: dict, s: Session, keyed, clear: bytes, burst: int, wire: bytes,
                      src) -> None:
        """SRTCP the plane took for ``s``: read if it was protected with its keys, its compound
        walked as RFC 3550 6.1 lays it out."""
        check(d["rtp_in"] == 0, "SRTCP counted as RTP", d)
        if keyed is not s:
            self.tally.add("rtcp_refused")
            check(d["rtcp_in"] == 0, "SRTCP reached a session without being protected with its "
                  "keys", d, wire[:24])
            return
        if not d["rtcp_in"]:   # the SSRC limit
            self.tally.add("rtcp_dropped")
            check(d["drop_ssrc_limit"] == burst, "SRTCP with its keys dropped", d)
            return
        self.tally.add("rtcp_taken")
        check(d["rtcp_in"] == 1 and d["drop_rtcp_replay"] == burst - 1,
              "a burst's SRTCP copies are replays", d)
        check(d["bytes_in"] == len(wire), "bytes_in (SRTCP)", d["bytes_in"], len(wire))
        if s.relayed:
            s.relay = src
        bad, byes = rtcp_walk(clear)
        check((d["rtcp_bad_part"], d["rtcp_bye"]) == (bad, byes), "the compound's parts",
              d["rtcp_bad_part"], d["rtcp_bye"], bad, byes, clear[:32].hex())

    def op_take(self) -> None:
        blob = self.plane.take_batch()
        self.delta()
        got: dict[int, list] = {}
        for channel, payload in records(blob or b""):
            check(channel in self.live, "take_batch named a channel that is not live", channel)
            got.setdefault(channel, []).append(payload)
        check((blob is None) == (not got), "take_batch: None only when nothing is queued")
        for s in self.live.values():
            have, want = got.get(s.channel, []), list(s.inq)
            if s.pcm:
                check(len(have) == len(want) and all(len(p) == PCM_BYTES for p in have) and
                      all(p is PCM for p in want), "take_batch: a pcm16 session's frames",
                      len(have), len(want))
            else:
                check(have == want, "take_batch: a session's frames", s.channel, have[:3], want[:3])
            s.inq.clear()
        self.tally.add("take_records", sum(map(len, got.values())))

    def op_put(self) -> None:
        r = self.r
        sel = r.byte()
        if sel & 1:
            blob = r.take(r.u16() % 4096)
        else:
            parts = []
            for _ in range(1 + (sel >> 1 & 7)):
                c = r.byte()
                channel = (r.u32() if c & 0x80 or not self.refs
                           else self.refs[(c & 0x1F) % len(self.refs)].channel)
                length = PCM_BYTES if c & 0x40 else r.u16() % 1400
                payload = r.take(length)
                declared = r.u16() if c & 0x20 else len(payload)
                parts.append(struct.pack("!IH", channel, declared) + payload)
            blob = b"".join(parts) + (r.take(r.byte() % 8) if sel & 0x10 else b"")
        # the model of put_batch
        queued = bad = unknown = dropped = 0
        pos = 0
        while pos < len(blob):
            if len(blob) - pos < 6:
                bad += 1
                break
            channel, length = struct.unpack_from("!IH", blob, pos)
            if length > len(blob) - pos - 6:
                bad += 1
                break
            payload = blob[pos + 6:pos + 6 + length]
            pos += 6 + length
            s = self.live.get(channel)
            if s is None:
                unknown += 1
                continue
            encode = s.pcm and length == PCM_BYTES   # else an Opus payload, sent as it is
            if not encode and (length == 0 or length > OPUS_MAX):
                bad += 1
                continue
            dropped += len(s.outq) == OUT_KEEP
            s.outq.append(PCM if encode else payload)
            if s.pcm:   # audio of its encoder to end, or none (an agent's own Opus)
                s.coded = 0 if encode else CODED_SILENCE
            queued += 1
        got = self.plane.put_batch(blob)
        d = self.delta()
        check(got == queued and d["batch_bad_record"] == bad and d["batch_unknown_channel"] == unknown
              and d["drop_out_queue_full"] == dropped and d["drop_encode"] == 0,
              "put_batch", got, queued, bad, unknown, dropped, d)
        self.tally.add("put_records", queued)

    def op_tick(self) -> None:
        w = self.world
        for sock in w.ready():
            stray = w.drain(sock)
            check(not stray, "datagrams outside a tick", sock.getsockname(), stray[:2])
        raw = self.r.byte()
        arg = raw - 120
        frames = min(max(arg, 1), OUT_KEEP)
        # a send group's tick (raw 32-119 with 0x10 set; older inputs tick every session)
        group = raw >> 5 & 3 if w.has_keep and 32 <= raw < 120 and raw & 0x10 else -1
        everyone = sorted(self.live.values(), key=lambda s: s.slot)
        order = [s for s in everyone if group < 0 or s.group == group]
        unsent = reports = 0
        if raw < 32 and w.has_rtcp:   # every session asked for a report now (odd: with BYE)
            for s in everyone:
                check(self.plane.report(s.channel, bool(raw & 1)) is s.rtcp, "report", s.channel)
                if not s.rtcp:
                    continue
                reports += 1
                if s.own is not None or self.shared:
                    s.reports.append((s.packets_sent, bool(raw & 1)))
                else:
                    unsent += 1
            self.tally.add("reports", reports)
        for _ in range(frames):
            for s in order:
                if s.outq:
                    payload = s.outq.popleft()
                elif s.pcm and s.coded < CODED_SILENCE:   # the audio's end, encoded
                    payload = PCM
                    s.coded += 1
                elif s.own is not None and s.script:
                    payload = s.script[s.script_pos % len(s.script)]
                    s.script_pos += 1
                else:
                    payload = s.silence
                if s.own is not None or self.shared:
                    s.expect.append((s.seq, s.ts, payload))
                else:
                    unsent += 1    # no shared socket: sendmmsg fails, counted
                s.seq, s.ts = (s.seq + 1) & 0xFFFF, (s.ts + 960) & 0xFFFFFFFF
                s.packets_sent += 1
        sent = self.plane.tick(arg, group) if group >= 0 else self.plane.tick(arg)
        d = self.delta()
        check(sent == frames * len(order) == d["rtp_out"], "tick: packets", sent, frames, len(order), d)
        # reports also go out when due (0.5-1.5 s after a session's last): a slow input's
        timed = d.get("rtcp_out", 0) - reports
        check(timed >= 0, "rtcp_out", d, reports)
        check(unsent <= d["send_errors"] <= unsent + (0 if self.shared else timed) and
              d["drop_frame_too_big"] == 0, "tick: sends", d, unsent)
        by_own = {w.name[s.own.fileno()]: s for s in everyone if s.own is not None}
        for sock in w.ready():
            dest = w.name[sock.fileno()]
            for data, sender in w.drain(sock):
                self.arrived(dest, tuple(sender), data, by_own)
        for s in everyone:
            check(not s.expect, "tick: a packet counted as sent did not arrive", s.channel, len(s.expect))
            check(not s.reports, "tick: a report asked for did not arrive", s.channel)
        self.tally.add("tick_packets", sent)

    def arrived(self, dest, sender, data: bytes, by_own: dict) -> None:
        """A packet the plane sent: whose it is, that it decrypts, that it is the next one."""
        if sender in by_own:
            s = by_own[sender]
            check(s.client == dest, "an own socket's packet to another address", dest, s.client)
            pkt = data
            if s.turn:
                check(len(data) >= 4 and struct.unpack_from("!HH", data) == (s.turn, len(data) - 4),
                      "a TURN session's ChannelData header", s.channel, data[:4].hex())
                pkt = data[4:]
        else:
            check(sender == self.world.addr, "a packet from neither socket", sender)
            if data[:1] == b"\x0e":
                check(len(data) >= 8 and data[1] == 1, "a bad hop header towards the client", data[:8])
                s = self.shared_by_key(data[2:8])
                check(s is not None and s.relayed and s.relay == dest,
                      "a relayed packet to the wrong relay or client", dest, data[:8])
                pkt = data[8:]
            else:
                s = self.shared_by_key(key_of(dest))
                check(s is not None and not s.relayed, "a packet to an address of no session", dest)
                pkt = data
        if len(pkt) >= 2 and pkt[1] in (200, 201):
            return self.report_arrived(s, pkt)
        try:
            clear = s.rx.unprotect(pkt)
        except self.world.srtp.Error as e:
            raise Violation(f"the peer cannot unprotect a packet of channel {s.channel}: {e}")
        check(bool(s.expect), "more packets than sent", s.channel)
        seq, ts, payload = s.expect.popleft()
        first, mpt, got_seq, got_ts, ssrc = struct.unpack_from("!BBHII", clear)
        check((first & 0xEF, mpt, got_seq, got_ts, ssrc) == (0x80, 0x80 | s.pt, seq, ts, s.ssrc),
              "an RTP header", s.channel, clear[:12].hex(), (seq, ts, s.ssrc, s.pt))
        ext = s.ext()
        off = 12
        if ext:
            check(first & 0x10 and clear[12:14] == b"\xbe\xde" and
                  int.from_bytes(clear[14:16], "big") * 4 == len(ext), "the header extension", clear[:24])
            got_ext = clear[16:16 + len(ext)]
            mid_part = len(s.mid) + 1 if s.mid_id and s.mid else 0
            check(got_ext[:mid_part] == ext[:mid_part] and
                  (not s.ast_id or got_ext[mid_part] == ext[mid_part]), "the mid / abs-send-time", got_ext, ext)
            off = 16 + len(ext)
        else:
            check(not first & 0x10, "an extension nobody asked for", clear[:16])
        body = clear[off:]
        if payload is PCM:
            check(0 < len(body) <= OPUS_MAX, "an encoded pcm16 frame", len(body))
        else:
            check(body == payload, "a payload sent", s.channel, body[:16], payload[:16])


    def report_arrived(self, s: Session, pkt: bytes) -> None:
        """A report the plane sent: SR once the session has sent (else RR) with its SSRC and
        counts, SDES CNAME, BYE when asked for."""
        check(s.rtcp, "a report from a session whose RTCP is aiortc's", s.channel)
        try:
            clear = s.rx.unprotect_rtcp(pkt)
        except self.world.srtp.Error as e:
            raise Violation(f"the peer cannot unprotect a report of channel {s.channel}: {e}")
        parts = []
        pos = 0
        while pos + 4 <= len(clear):
            first, kind, words = struct.unpack_from("!BBH", clear, pos)
            parts.append((kind, clear[pos:pos + 4 * (words + 1)]))
            pos += 4 * (words + 1)
        check(pos == len(clear) and rtcp_walk(clear) == (0, sum(k == 203 for k, _ in parts)),
              "a report's compound", clear.hex())
        sent, bye = s.reports.popleft() if s.reports else (None, False)   # None: a timed one
        kinds = [k for k, _ in parts]
        if sent is None:
            check(kinds in ([200, 202], [201, 202]), "a timed report's parts", kinds)
        else:
            check(kinds == [200 if sent else 201, 202] + [203] * bye, "a report's parts", kinds, sent)
        head = parts[0][1]
        check(struct.unpack_from("!I", head, 4)[0] == s.ssrc, "a report's SSRC", head[:8].hex())
        if kinds[0] == 200 and sent is not None:
            check(struct.unpack_from("!I", head, 20)[0] == sent, "an SR's packet count", head.hex(), sent)
        sdes = parts[1][1]
        check(sdes[8:10 + len(CNAME)] == bytes([1, len(CNAME)]) + CNAME, "the CNAME", sdes.hex())
        if bye:
            check(struct.unpack_from("!I", parts[-1][1], 4)[0] == s.ssrc, "the BYE's SSRC")
        self.tally.add("reports_arrived")


def rtcp_walk(clear: bytes) -> tuple[int, int]:
    """(parts that end the walk, BYEs) of a compound RTCP packet (RFC 3550 6.1): a part is a
    version-2 header whose length fits, an SR or RR long enough for its report blocks."""
    pos = byes = 0
    while pos + 4 <= len(clear):
        first, kind, words = struct.unpack_from("!BBH", clear, pos)
        size, count = 4 * (words + 1), first & 0x1F
        if first >> 6 != 2 or pos + size > len(clear):
            return 1, byes
        if kind in (200, 201) and size < (28 if kind == 200 else 8) + 24 * count:
            return 1, byes
        byes += kind == 203
        pos += size
    return 0, byes


def run_input(world: World, data: bytes) -> None:
    case = Case(world, data)
    try:
        case.run()
    finally:
        case.plane = None   # the plane goes (Plane_dealloc) with every input


# ------------------------------------------------------------------ seeds

class Seed:
    """Builds inputs in the harness's format (the initial corpus)."""

    def __init__(self, cfg: int) -> None:
        self.b = bytearray([cfg])

    def op(self, name: str, *fields: bytes | int) -> "Seed":
        self.b.append(OPS.index(name))
        for f in fields:
            self.b += bytes([f]) if isinstance(f, int) else f
        return self

    def datagram(self, sel: int, ref: int, body: bytes, *extra: bytes | int) -> "Seed":
        return self.op("datagram", sel, ref, struct.pack("!H", len(body)), body, *extra)

    def add(self, sel: int, client: int, ssrc: int = 0, seq: int = 0, ts: int = 0, pt: int = 111,
            mid: bytes = b"", mid_id: int = 0, ast_id: int = 0, silence: bytes = b"",
            script: bytes | None = None, bad: tuple[int, int] | None = None,
            own_flags: int = 0) -> "Seed":
        params = struct.pack("!IHIB", ssrc, seq, ts, pt) + bytes([len(mid)]) + mid + \
            bytes([mid_id, ast_id, len(silence)]) + silence
        tail = b"" if script is None else struct.pack("!H", len(script) | own_flags) + script
        return self.op("add", sel | (0x80 if bad else 0), client, bytes(bad or ()), params, tail)

    def put(self, *items: tuple[int, bytes]) -> "Seed":   # structured records to refs
        out = bytearray()
        for ref, payload in items:
            out += bytes([ref | (0x40 if len(payload) == PCM_BYTES else 0)])
            if len(payload) != PCM_BYTES:
                out += struct.pack("!H", len(payload))
            out += payload
        return self.op("put", (len(items) - 1) << 1, bytes(out))


def rtp(seq: int, ts: int, ssrc: int, payload: bytes, pt: int = 111, ext: bytes = b"",
        csrcs: int = 0, padding: int = 0) -> bytes:
    first = 0x80 | csrcs | (0x10 if ext else 0) | (0x20 if padding else 0)
    header = struct.pack("!BBHII", first, pt, seq, ts, ssrc) + b"\0\0\0\1" * csrcs
    if ext:
        header += b"\xbe\xde" + struct.pack("!H", len(ext) // 4) + ext
    return header + payload + ((b"\0" * (padding - 1) + bytes([padding])) if padding else b"")


def seeds() -> list[bytes]:
    opus = b"\x78" + bytes(range(40))
    out = [
        # Opus sessions: direct (AES-CM) and relayed (GCM); the packet, the agent's reply, a tick
        Seed(0b0110).datagram(1, 0, rtp(1, 0, 0xCAFE, b"hello", ext=b"\x10\x30\0\0", padding=4))
        .datagram(1, 1, rtp(5, 960, 0xBEEF, b"via relay", csrcs=2)).op("take")
        .put((0, b"reply"), (1, b"down")).op("tick", 122).op("stats", 0).op("stats", 1),
        # a session removed mid-stream, its address taken again, its old channel in a batch
        Seed(0b0110).datagram(1, 0, rtp(1, 0, 7, b"a")).op("remove", 0)
        .datagram(1, 0, rtp(2, 960, 7, b"late")).add(0, 0, 5, 7, 0, 111, b"1", 1, 3, SILENCE)
        .put((0, b"old"), (2, b"new")).op("tick", 121).op("take"),
        # pcm16: a 20 ms Opus frame decoded, a PCM frame encoded, then its end: 3 silent
        # frames encoded, the cached silence after them
        Seed(0b1010).datagram(1, 2, rtp(1, 0, 3, SILENCE)).datagram(1, 2, rtp(2, 960, 3, opus))
        .put((2, bytes(PCM_BYTES))).op("tick", 121).op("tick", 125).op("take")
        .op("set_pcm", 2, 0),
        # a session moved to another client address (a NAT rebinding), then through a relay
        Seed(0b0110).datagram(1, 0, rtp(1, 0, 7, b"here")).op("set_pcm", 0, 0b1110)
        .datagram(1, 0, rtp(2, 960, 7, b"moved")).op("tick", 121).op("set_pcm", 0, 0b1010110)
        .datagram(1, 0, rtp(3, 1920, 7, b"relayed")).op("tick", 121).op("take"),
        # a series of 14 packets (more than the 8 kept for the agent), 7 replies (more than 5)
        Seed(0b0110).datagram(0x41, 0, rtp(1, 0, 5, b"series"), 12).op("take")
        .put(*[(0, b"r%d" % i) for i in range(7)]).op("tick", 125).op("tick", 125),
        # a burst through the socket (over one recvmmsg batch): one delivery, the rest replays
        Seed(0b0110).datagram(0x31, 0, rtp(9, 0, 1, b"burst"), 69).op("take"),
        # what is not the plane's: STUN, DTLS, SRTCP, hop headers of other kinds, a jumbo
        Seed(0b0110).datagram(0, 0, b"\x00\x01\x00\x00" + bytes(16)).datagram(0, 0, b"\x16\xfe\xfd" + bytes(10))
        .datagram(0, 0, b"\x80\xc8\x00\x06" + bytes(24)).datagram(0x08, 1, b"\x80\x00" + bytes(30), 1, bytes(6))
        .datagram(0, 0, bytes(2100)),
        # a relayed session's packet from a stranger's address: the answers follow it
        Seed(0b0110).datagram(0x0D, 1, rtp(3, 0, 5, b"moved")).op("tick", 121),
        # forged and other-keyed packets
        Seed(0b1110).datagram(3, 0, rtp(1, 0, 5, b"forged"), b"\0\x05", 1)
        .datagram(2, 3, rtp(1, 0, 5, b"other key")).datagram(1, 3, rtp(1, 0, 5, b"gcm", csrcs=15)),
        # bad parameters to add, a full plane
        Seed(0b0001).add(0, 5, bad=(0, 4)).add(0, 6).add(0, 6, bad=(2, 1)).add(1, 7, bad=(7, 0))
        .add(1, 7),
        # a client session: a socket of its own, a script; what it hears, logged
        Seed(0b0010).add(0x10, 7, 9, 0, 0, 111, b"a", 1, 3, SILENCE, script=struct.pack(
            "!IH", 0, 3) + SILENCE + struct.pack("!IH", 0, 2) + b"\x78\x00")
        .datagram(0x11, 1, rtp(1, 0, 9, b"to client")).datagram(0x01, 1, rtp(2, 960, 9, b"shared"))
        .op("tick", 123).op("stats", 1),
        # a conversation's caller (SSRC 0xA: keeps what it hears, send group 2): two Opus
        # payloads heard and decoded, a tick of its group only, then of another group
        Seed(0b0010).add(0x10, 7, 0xA, 0, 0, 111, b"a", 1, 3, SILENCE, script=struct.pack(
            "!IH", 0, 3) + SILENCE)
        .datagram(0x11, 1, rtp(1, 0, 9, SILENCE)).datagram(0x11, 1, rtp(2, 960, 9, opus))
        .op("stats", 1).op("tick", 0x50).op("tick", 0x30).op("stats", 1),
        # a port-per-session server's session (its own socket, no script): what it hears queued
        # for the agent; then a client session through TURN channel 0x4001: ChannelData
        Seed(0b0010).add(0x10, 7, 9, 0, 0, 111, b"a", 1, 3, SILENCE, script=b"",
                         own_flags=OWN_SERVER)
        .datagram(0x11, 1, rtp(1, 0, 9, b"to server")).op("take").put((1, b"back"))
        .op("tick", 121).op("remove", 1)
        .add(0x30, 8, 11, 0, 0, 111, b"a", 1, 3, SILENCE, script=struct.pack("!IH", 0, 3) + SILENCE,
             own_flags=(TURN_ON | 1) << TURN_SHIFT)
        .datagram(0x11, 2, rtp(1, 0, 11, b"via turn")).datagram(0x10, 2, b"\x00\x01\x00\x00" + bytes(16))
        .op("tick", 121).op("stats", 2),
        # SRTCP for a session that keeps its RTCP (session 1: an odd SSRC): SR + RR + BYE, a
        # part longer than the packet, an RR too short for its block; reports asked for
        Seed(0b0110).datagram(1, 1, struct.pack("!BBHIQIII", 0x80, 200, 6, 0xCAFE, 1 << 40, 9, 1, 1)
                              + struct.pack("!BBHI", 0x81, 201, 7, 0xCAFE) + bytes(24)
                              + struct.pack("!BBHI", 0x81, 203, 1, 0xCAFE))
        .datagram(1, 1, struct.pack("!BBHI", 0x80, 201, 9, 0xCAFE))
        .datagram(1, 1, struct.pack("!BBHI", 0x81, 201, 1, 0xCAFE))
        .op("tick", 0).op("tick", 121).op("tick", 1).op("stats", 1),
    ]
    return [bytes(s.b) for s in out]


def c_hash(addr: tuple[str, int], size: int) -> int:
    """_mediaplane.c's hash_key of a client's key."""
    k = int.from_bytes(key_of(addr), "little")
    k ^= k >> 29
    k = k * 0xBF58476D1CE4E5B9 & (1 << 64) - 1
    k ^= k >> 32
    return k & (size - 1)


def regressions() -> dict[str, bytes]:
    """Inputs that broke an invariant once (run with --regressions; each must pass)."""
    client = lambda i: (HOST % (1 + i), PORT)   # noqa: E731 - World's client i
    # capacity 2 (a table of 4): session 0 shared, session 1 with a socket of its own. Removing
    # session 0 leaves a tombstone; a shared session whose key hashes elsewhere takes slot 0
    # and is removed: two tombstones, the table is rebuilt, and table_remove's rebuild put
    # every used slot in it, session 1 too: its peer's packets on the shared socket reached it.
    other = next(i for i in range(2, 20) if c_hash(client(i), 4) != c_hash(client(0), 4))
    return {
        "own-socket-session-in-shared-table": bytes(
            Seed(0x85).op("remove", 0).add(0, other).op("remove", 2)
            .datagram(0x01, 1, rtp(1, 0, 9, b"shared socket")).b),
    }


# ------------------------------------------------------------------ the child processes

HARNESS = Harness(target=TARGET, module="bench.fuzz_mediaplane", doc=__doc__, seeds=seeds,
                  regressions=regressions, world=World, run_input=run_input)

if __name__ == "__main__":
    command(HARNESS)
