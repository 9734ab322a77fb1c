"""The first-packet flood: 10,000 routable STUN first packets a second from thousands of
sources while 20 calls run through the relay.

The rules (the hostile-input issue), checked on a live one-host edge (scenarios/demo_edge.py's,
in a lab namespace: Redis, relay, transceiver, agent, signaling) with real aiortc calls:

- the calls' p99 transit through the relay, measured on the wire, stays under ``max_ratio``
  (2) times its value without the flood, in each direction;
- new calls started in the middle of the flood all connect;
- the relay never holds more than its pending cap (``max_pending`` x workers) of attack flows.

Timeline of one run: the calls connect; a quiet window; the flood window; a short quiet tail;
``new_calls`` fresh calls start in the middle of the quiet window and again in the middle of
the flood, so both windows carry the same traffic apart from the flood.

The flood: a separate process in the namespace writes IPv4/UDP packets through a raw socket,
so every packet has a source address of its own (a first packet): random ports on thousands of
addresses in ``source_net`` (127.96.0.0/11, all local to the namespace's lo) spread over hundreds
of /24s, plus a share from one /24 and a share from one address, which exercise the per-prefix
and per-IP caps and the rate limit. Each carries an ICE binding request with a routable ufrag
(tagged with the relay's secret: the public development secret of the edge) for the cluster's
transceiver, and a MESSAGE-INTEGRITY that does not verify, so the transceiver never answers.

Relay transit: tcpdump on the namespace's lo (every address of the lab is local, so both the
client -> relay datagram and the relay -> transceiver datagram cross lo), the flood's sources
filtered out in the kernel, including the relay's hop-wrapped copies of their checks. Each call
datagram entering the relay is matched with the same datagram leaving it (same client address,
same first bytes, hop header added or removed), and its transit is out time - in time.
"""
from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import os
import random
import resource
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from analysis.stats import percentile
from analysis.pcap.reader import read_udp
from topology.capture import Capture
from services.relay.config import RelayConfig
from services.relay.scheduling import check_realtime
from voiceedge.errors import ConfigError
from services.wire import hop as hopwire
from services.wire.stun import ATTR_USERNAME, MAGIC_COOKIE
from services.wire.ufrag import DEV_SECRET, UfragCodec
from voiceedge import reaper
from voiceedge.reaper import temp_dir

REPO = Path(__file__).resolve().parents[2]
_KEY_BYTES = 192  # datagram bytes compared across the relay (the capture keeps 214 on lo)
_SNAPLEN = 256


@dataclass(frozen=True)
class FloodConfig:
    rate: int = 10_000              # first packets per second
    flood_s: float = 20.0
    quiet_s: float = 12.0           # before the flood
    tail_s: float = 3.0             # quiet again after it
    calls: int = 20                 # live through every window
    new_calls: int = 10             # started mid-window, in the quiet window and in the flood
    new_call_s: float = 3.0
    new_call_setup_s: float = 10.0  # a new call not connected by then failed
    call_start_rate: float = 10.0
    full_clients: int = 2
    sources: int = 4000             # spread addresses ...
    prefixes: int = 400             # ... over this many /24s
    one_prefix_share: float = 0.10  # packets from one /24 (its 254 hosts)
    one_ip_share: float = 0.05      # packets from one address
    source_net: str = "127.96.0.0/11"
    cluster_id: int = 1             # the demo's cluster and transceiver: the ufrags route
    transceiver_id: int = 1
    secret: bytes = DEV_SECRET      # the edge's relay runs with the development secret
    max_pending: int | None = None  # --max-pending (None: the relay's default)
    workers: int = 1
    admission: str | None = None    # the relay's --admission (None: its default)
    relay_args: tuple[str, ...] = ()
    # The relay's worker alone on the host's last CPU at this real-time priority, the bench
    # and every other process it starts on the other CPUs (RelayCore); None: all share them.
    relay_realtime: int | None = 10
    sample_s: float = 0.2           # relay counters
    max_ratio: float = 2.0
    min_rate_share: float = 0.95    # of ``rate`` the sender must reach for a valid run
    seed: int = 1
    workdir: Path | None = None
    # the calls' media on the testbed's side (docs/mediaplane.md): the transceiver's and the
    # light clients'; native leaves the relay the core it would otherwise share with them
    media_path: str = "native"
    light_path: str = "native"

    @classmethod
    def quick(cls) -> "FloodConfig":
        """A few seconds of the full rate and a few calls, with a small pending table so its
        cap is reached (for make test)."""
        return cls(flood_s=4.0, quiet_s=3.0, tail_s=0.5, calls=12, new_calls=3, new_call_s=1.0,
                   new_call_setup_s=3.0, call_start_rate=20.0, full_clients=1, sources=2000,
                   prefixes=200, max_pending=1000)

    @property
    def pending_cap(self) -> int:
        per_worker = self.max_pending if self.max_pending is not None else RelayConfig.max_pending
        return per_worker * self.workers

    def relay_options(self) -> tuple[str, ...]:
        out: list[str] = []
        if self.max_pending is not None:
            out += ["--max-pending", str(self.max_pending)]
        if self.workers != 1:
            out += ["--workers", str(self.workers)]
        if self.admission is not None:
            out += ["--admission", self.admission]
        return (*out, *self.relay_args)

    def __post_init__(self) -> None:
        if self.rate < 1 or self.flood_s <= 0 or self.quiet_s <= 0 or self.calls < 1:
            raise ValueError("rate, flood_s, quiet_s and calls must be positive")
        if self.one_prefix_share + self.one_ip_share >= 1 or self.sources < self.prefixes:
            raise ValueError("the spread sources need a share and at least one per /24")
        net = ipaddress.ip_network(self.source_net)
        if net.num_addresses < (self.prefixes + 2) * 256 or not net.is_loopback:
            raise ValueError(f"{self.source_net}: needs {self.prefixes + 2} /24s inside 127/8")


# ---------------------------------------------------------------- the flood's packets

def binding_request(ufrag: str, rng: random.Random) -> bytes:
    """An ICE check as a browser sends it (USERNAME, PRIORITY, ICE-CONTROLLING,
    MESSAGE-INTEGRITY, FINGERPRINT) whose MESSAGE-INTEGRITY is random: it routes, and no
    transceiver answers it."""
    username = f"{ufrag}:{rng.getrandbits(32):08x}".encode()
    attrs = (struct.pack("!HH", ATTR_USERNAME, len(username)) + username
             + bytes(-len(username) % 4)
             + struct.pack("!HHI", 0x0024, 4, rng.getrandbits(32))         # PRIORITY
             + struct.pack("!HHQ", 0x802A, 8, rng.getrandbits(64))         # ICE-CONTROLLING
             + struct.pack("!HH", 0x0008, 20) + rng.randbytes(20))         # MESSAGE-INTEGRITY
    head = struct.pack("!HHI", 0x0001, len(attrs) + 8, MAGIC_COOKIE) + rng.randbytes(12)
    crc = zlib.crc32(head + attrs) ^ 0x5354554E
    return head + attrs + struct.pack("!HHI", 0x8028, 4, crc)             # FINGERPRINT


@dataclass(frozen=True)
class Sources:
    """The flood's source addresses (as 4 packed bytes) and the share of packets of each."""
    spread: tuple[bytes, ...]
    one_prefix: tuple[bytes, ...]
    one_ip: bytes

    @classmethod
    def plan(cls, cfg: FloodConfig) -> "Sources":
        base = int(ipaddress.ip_network(cfg.source_net).network_address)
        per = cfg.sources // cfg.prefixes
        spread = tuple(struct.pack("!I", base + (p << 8) + h)
                       for p in range(cfg.prefixes) for h in range(1, per + 1))
        one = base + ((cfg.prefixes + 0) << 8)
        return cls(spread, tuple(struct.pack("!I", one + h) for h in range(1, 255)),
                   struct.pack("!I", base + ((cfg.prefixes + 1) << 8) + 1))

    def pick(self, cfg: FloodConfig, rng: random.Random) -> bytes:
        x = rng.random()
        if x < cfg.one_ip_share:
            return self.one_ip
        if x < cfg.one_ip_share + cfg.one_prefix_share:
            return rng.choice(self.one_prefix)
        return rng.choice(self.spread)


def flood_packets(cfg: FloodConfig, target: tuple[str, int], count: int,
                  pool: int = 20_000) -> list[bytes]:
    """``count`` IPv4/UDP packets for a raw socket (the kernel fills in the IP checksum and
    id; no UDP checksum): a source address and port each, payloads from a pool of ``pool``
    binding requests with random routing ufrags."""
    rng = random.Random(cfg.seed)
    codec = UfragCodec(cfg.secret)
    payloads = [binding_request(codec.encode(cfg.cluster_id, cfg.transceiver_id,
                                             rng.randbytes(6)), rng)
                for _ in range(min(count, pool))]
    sources = Sources.plan(cfg)
    dst, dport = socket.inet_aton(target[0]), target[1]
    out = []
    for i in range(count):
        payload = payloads[i % len(payloads)]
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), 0, 0x4000, 64, 17, 0,
                         sources.pick(cfg, rng), dst)
        out.append(ip + struct.pack("!HHHH", rng.randrange(1024, 65536), dport,
                                    8 + len(payload), 0) + payload)
    return out


def _sender(spec: dict) -> None:
    """The flood process: build the packets, say "ready", wait for "go UNIX_TIME" on stdin,
    send ``rate`` a second for ``seconds`` (a batch every millisecond, on an absolute
    schedule), print what it did as JSON."""
    cfg = FloodConfig(secret=bytes.fromhex(spec["secret"]),
                      **{k: v for k, v in spec["config"].items()
                         if k in FloodConfig.__dataclass_fields__})
    target = (spec["target"][0], spec["target"][1])
    count = int(cfg.rate * cfg.flood_s)
    packets = flood_packets(cfg, target, count)
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    if not line or line[0] != "go":
        return
    start_at = float(line[1])
    time.sleep(max(0.0, start_at - time.time()))
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0, u0 = time.perf_counter(), time.time()
    sent = errors = late_max = 0
    sendto, addr, rate = sock.sendto, (target[0], 0), cfg.rate
    while sent < count:
        elapsed = time.perf_counter() - t0
        due = min(count, int(elapsed * rate) + 1)
        late_max = max(late_max, due - sent)
        for packet in packets[sent:due]:
            try:
                sendto(packet, addr)
            except OSError:
                errors += 1
        sent = due
        time.sleep(0.001)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"sent": sent, "send_errors": errors, "started_unix": u0,
                      "seconds": round(seconds, 3), "rate_pps": round(sent / seconds, 1),
                      "cpu_s": round(cpu, 3), "cpu_pct": round(100 * cpu / seconds, 1),
                      "cpu_us_per_packet": round(cpu / max(sent, 1) * 1e6, 2),
                      "largest_batch": late_max, "packet_bytes": len(packets[0])}), flush=True)


class FloodSender:
    """The flood process in the namespace: built before the calls (so its setup does not
    load the quiet window), released by ``go``."""

    def __init__(self, cfg: FloodConfig, netns: str, target: tuple[str, int]) -> None:
        spec = {"config": {k: v for k, v in dataclasses.asdict(cfg).items()
                           if isinstance(v, (int, float, str))},
                "secret": cfg.secret.hex(), "target": list(target)}
        self.cmd = ["ip", "netns", "exec", netns, sys.executable, "-m", "bench.hostile.flood",
                    "--sender", json.dumps(spec)]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        reaper.track_process(self.proc.pid)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.kill()
            raise RuntimeError(f"the flood sender did not start: {line.strip() or 'no output'}")

    def go(self, at_unix: float) -> None:
        self.proc.stdin.write(f"go {at_unix}\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict:
        out, _ = self.proc.communicate(timeout=timeout)
        return json.loads(out.strip().splitlines()[-1])

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def capture_filter(source_net: str) -> str:
    """BPF: UDP without the flood: neither its packets nor the relay's hop-wrapped copies of
    them (hop header magic, then the client address at payload bytes 4-7)."""
    net = ipaddress.ip_network(source_net)
    addr, mask = int(net.network_address), int(net.netmask)
    return (f"udp and not src net {source_net} and not "
            f"(udp[8] = {hopwire.MAGIC:#x} and udp[12:4] & {mask:#x} = {addr:#x})")


# ---------------------------------------------------------------- relay transit, from the wire

@dataclass(frozen=True)
class RelayPath:
    """Where the relay meets the calls: its public address, the transceiver's media socket."""
    public: tuple[str, int]
    media: tuple[str, int]


def relay_transits(datagrams, path: RelayPath):
    """Match the call datagrams across the relay, in capture order; yield (direction,
    in_time, transit_s) for each: in_time None for a departure without a captured arrival,
    transit_s None for an arrival that never left (after all departures).

    Directions: ``to_server`` (client -> public port, then hop socket -> transceiver) and
    ``to_client`` (transceiver -> hop socket, then public port -> client). Identical datagrams
    (a retransmitted check) pair first in, first out.
    """
    waiting: dict[tuple, deque] = {}
    public, media = path.public, path.media
    for d in datagrams:
        ts, src, sport, dst, dport, data = d[:6]
        if (dst, dport) == public:
            waiting.setdefault(("to_server", src, sport, data[:_KEY_BYTES]), deque()).append(ts)
            continue
        if (src, sport) == public:
            key = ("to_client", dst, dport, data[:_KEY_BYTES])
        elif len(data) >= hopwire.IPV4_LENGTH and data[0] == hopwire.MAGIC and not data[1] & 2:
            client = (socket.inet_ntoa(data[4:8]), (data[2] << 8) | data[3])
            direction = "to_client" if data[1] & hopwire.FLAG_DIRECTION else "to_server"
            key = (direction, *client, data[8:8 + _KEY_BYTES])
            if (src, sport) == media and direction == "to_client":
                waiting.setdefault(key, deque()).append(ts)
                continue
            if (dst, dport) != media or direction != "to_server":
                continue
        else:
            continue
        queue = waiting.get(key)
        if queue:
            t_in = queue.popleft()
            yield key[0], t_in, ts - t_in
        else:
            yield key[0], None, None  # left the relay without a matching arrival
    for key, queue in waiting.items():
        for t_in in queue:
            yield key[0], t_in, None  # arrived, never left


@dataclass
class WindowTransit:
    matched: int = 0
    not_forwarded: int = 0
    p50_us: float | None = None
    p99_us: float | None = None
    max_us: float | None = None


def transit_by_window(pcap: Path, path: RelayPath, windows: dict[str, tuple[float, float]]
                      ) -> tuple[dict[str, dict[str, WindowTransit]], dict]:
    """Relay transit per window (by arrival time) and direction; and totals over the capture
    (datagrams read, unmatched departures, distinct client addresses and when each first
    reached the relay)."""
    values: dict[tuple[str, str], list[float]] = {}
    lost: dict[tuple[str, str], int] = {}
    unmatched_out = 0
    clients: dict[tuple[str, int], float] = {}

    def tracked():
        for d in read_udp(pcap):
            if (d.dst_ip, d.dst_port) == path.public:
                clients.setdefault((d.src_ip, d.src_port), d.timestamp_s)
            yield d

    for direction, t_in, transit in relay_transits(tracked(), path):
        if t_in is None:
            unmatched_out += 1
            continue
        for name, (a, b) in windows.items():
            if a <= t_in < b:
                if transit is None:
                    lost[(name, direction)] = lost.get((name, direction), 0) + 1
                else:
                    values.setdefault((name, direction), []).append(transit * 1e6)
    out: dict[str, dict[str, WindowTransit]] = {}
    for name in windows:
        for direction in ("to_server", "to_client"):
            v = values.get((name, direction), [])
            row = WindowTransit(len(v), lost.get((name, direction), 0))
            if v:
                row.p50_us, row.p99_us = percentile(v, 50, 1), percentile(v, 99, 1)
                row.max_us = round(max(v), 1)
            out.setdefault(name, {})[direction] = row
    return out, {"unmatched_departures": unmatched_out, "client_addresses": clients}


# ---------------------------------------------------------------- the relay's core

class RelayCore:
    """A CPU of the relay's own for the length of a run.

    On entry every thread of this process moves to all CPUs but the last, so every process the
    bench starts from then on (the edge's services, the calls' clients, the flood's sender,
    tcpdump) runs there; ``relay_args`` pins the relay's worker to the last CPU at real-time
    priority. On exit the threads get their CPUs back. Measured on the 2-core VM: with the
    relay's worker sharing the CPUs, the machine's own agent and kernel threads held its CPU
    for 1-6 ms at a time, and those stalls, not the flood, made a window's p99
    (docs/hostile.md, "A core of its own").
    """

    def __init__(self, realtime: int | None) -> None:
        self.realtime = realtime
        self.cpu: int | None = None
        self.others: set[int] = set()
        self.refused: str | None = None  # why real-time priority was not available
        self._saved: dict[int, set[int]] = {}

    def __enter__(self) -> "RelayCore":
        cpus = sorted(os.sched_getaffinity(0))
        if self.realtime is None or len(cpus) < 2:
            return self
        self.cpu, self.others = cpus[-1], set(cpus[:-1])
        try:
            check_realtime(self.realtime)
        except ConfigError as exc:  # pinned only; the result says why
            self.realtime, self.refused = None, str(exc)
        for tid in _threads():
            try:
                self._saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, self.others)
            except OSError:  # the thread ended meanwhile
                pass
        return self

    def __exit__(self, *exc) -> None:
        if self.cpu is None:
            return
        everything = set().union(*self._saved.values()) | {self.cpu} | self.others
        for tid in _threads():  # threads started meanwhile had the narrow set too
            try:
                os.sched_setaffinity(tid, self._saved.get(tid, everything))
            except OSError:
                pass

    def relay_args(self) -> tuple[str, ...]:
        if self.cpu is None:
            return ()
        priority = () if self.realtime is None else ("--realtime", str(self.realtime))
        return ("--cpus", str(self.cpu), *priority)

    def describe(self) -> dict | None:
        if self.cpu is None:
            return None
        return {"cpu": self.cpu, "realtime": self.realtime, "others": sorted(self.others),
                "realtime_refused": self.refused}


def relay_core_text(core: dict | None) -> str:
    """``RelayCore.describe()`` in words."""
    if not core:
        return "relay's worker: sharing the CPUs with everything else"
    priority = (f"at real-time priority {core['realtime']}" if core["realtime"] else
                f"at ordinary priority ({core['realtime_refused']})")
    return (f"relay's worker: CPU {core['cpu']} of its own {priority}, everything else on "
            f"CPU {','.join(map(str, core['others']))}")


def _threads() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


# ---------------------------------------------------------------- the run

def run(config: FloodConfig, say=lambda m: None, progress=None) -> dict:
    """The flood against a live one-host edge; a JSON-ready result with ``violations`` (empty
    when every rule held). ``progress(seconds_done, seconds_total)`` during the windows."""
    from scenarios.demo_edge import demo_plan
    from services.transceiver.ice import SHARED
    from topology.netns import in_namespace, lab_namespace

    workdir = config.workdir or temp_dir("voiceedge-flood-")
    workdir.mkdir(parents=True, exist_ok=True)
    with RelayCore(config.relay_realtime) as core, lab_namespace("veflood") as ns:
        say(relay_core_text(core.describe()))
        plan = dataclasses.replace(demo_plan(SHARED, ns.name, *ns.addresses, config.media_path),
                                   relay_args=config.relay_options() + core.relay_args())
        result = in_namespace(ns.name, asyncio.run,
                              _flood(config, plan, ns.name, workdir, say, progress))
        result["relay_core"] = core.describe()
        return result


async def _flood(cfg: FloodConfig, plan, netns: str, workdir: Path, say, progress) -> dict:
    from scenarios.demo_edge import CpuMark
    from scenarios.edge import Edge
    from services.client.config import ClientConfig
    from services.client.runner import run_sessions

    loop = asyncio.get_running_loop()
    edge = Edge(plan, workdir)
    cluster, front = plan.clusters[0], plan.fronts[0]
    path = RelayPath((cluster.public, plan.ports.relay), (cluster.internal, plan.ports.media))
    sender = FloodSender(cfg, netns, path.public)
    capture = Capture(workdir / "calls.pcap", netns=netns, bpf_filter=capture_filter(cfg.source_net),
                      snaplen=_SNAPLEN)
    samples: list[dict] = []
    marks: dict[str, CpuMark] = {}
    status: dict[str, dict] = {}
    kernel: dict[str, dict] = {}
    captured = False
    try:
        say(f"starting the edge in {workdir}")
        await loop.run_in_executor(None, edge.start)
        say(f"building {cfg.rate * cfg.flood_s:,.0f} flood packets")
        await loop.run_in_executor(None, sender.start)
        await loop.run_in_executor(None, capture.start)
        captured = True
        pids = {"relay": edge.services[f"relay-{cluster.name}"].process.pid,
                "transceiver": edge.services[cluster.transceiver_name(1)].process.pid,
                "agent": edge.services[f"agent-{cluster.name}"].process.pid,
                "signaling": edge.services[f"front-{front.region}"].process.pid,
                "tcpdump": capture.pid}
        url = edge.signaling_url(front)
        setup_s = cfg.calls / cfg.call_start_rate + 3.0
        call_s = setup_s + cfg.quiet_s + cfg.flood_s + cfg.tail_s + 1.0
        calls_cfg = ClientConfig(url=url, duration_s=call_s, start_rate=cfg.call_start_rate,
                                 full_sessions=cfg.full_clients, sample_interval_s=0.5,
                                 light_path=cfg.light_path)
        probe_cfg = ClientConfig(url=url, duration_s=cfg.new_call_s, start_rate=20.0,
                                 full_sessions=0, setup_timeout_s=cfg.new_call_setup_s,
                                 light_path=cfg.light_path)
        say(f"{cfg.calls} calls of {call_s:.0f} s; quiet {cfg.quiet_s:g} s, flood "
            f"{cfg.flood_s:g} s at {cfg.rate:,}/s, quiet {cfg.tail_s:g} s")
        t0 = time.time()
        calls = asyncio.create_task(run_sessions(calls_cfg, cfg.calls,
                                                 results_path=workdir / "calls.jsonl"))
        quiet_at = t0 + setup_s
        flood_at = quiet_at + cfg.quiet_s
        end_at = flood_at + cfg.flood_s + cfg.tail_s
        windows = {"quiet": (quiet_at, flood_at), "flood": (flood_at, flood_at + cfg.flood_s)}
        sender.go(flood_at)
        metrics = edge.metrics_url()
        control = f"{edge.control_url(cluster)}/status"
        sampler = asyncio.create_task(_sample(loop, metrics, samples, cfg.sample_s,
                                              quiet_at - 1.0, end_at))

        async def at(when: float, name: str | None = None) -> None:
            await asyncio.sleep(max(0.0, when - time.time()))
            if name is not None:
                marks[name] = CpuMark.take(pids)
                kernel[name] = _udp_errors()
                status[name] = await loop.run_in_executor(None, _get_json, control)
            if progress is not None:
                progress(round(min(when, end_at) - quiet_at, 1), round(end_at - quiet_at, 1))

        probes = {}
        await at(quiet_at, "quiet_start")
        await at(quiet_at + cfg.quiet_s / 2)
        probes["quiet"] = asyncio.create_task(run_sessions(
            probe_cfg, cfg.new_calls, results_path=workdir / "new-quiet.jsonl"))
        await at(flood_at, "flood_start")
        await at(flood_at + cfg.flood_s / 2)
        probes["flood"] = asyncio.create_task(run_sessions(
            probe_cfg, cfg.new_calls, results_path=workdir / "new-flood.jsonl"))
        await at(flood_at + cfg.flood_s, "flood_end")
        # the quiet window's marks end where the flood's start (same length of CPU window)
        flooded = await loop.run_in_executor(None, sender.result, cfg.tail_s + 30)
        await at(end_at)
        await sampler
        call_results = await calls
        probe_results = {k: await t for k, t in probes.items()}
        say("calls over; reading the capture")
    finally:
        sender.kill()
        if captured:
            capture.stop()
        await loop.run_in_executor(None, edge.stop)

    transit, wire = await loop.run_in_executor(None, transit_by_window,
                                               capture.path, path, windows)
    return _result(cfg, windows, samples, marks, status, kernel, flooded, transit, wire,
                   capture, call_results, probe_results, workdir)


def _get_json(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read())


async def _sample(loop, url: str, out: list[dict], every: float, start: float,
                  end: float) -> None:
    """The relay's counters every ``every`` s from ``start`` to ``end`` (unix)."""
    from services.relay.counters import scrape

    await asyncio.sleep(max(0.0, start - time.time()))
    while time.time() < end:
        t = time.time()
        try:
            counters = await loop.run_in_executor(None, scrape, url)
        except OSError as exc:
            counters = {"error": str(exc)}
        out.append({"t": t, **counters})
        await asyncio.sleep(max(0.0, t + every - time.time()))


# ---------------------------------------------------------------- the result

def _udp_errors() -> dict[str, int]:
    """This namespace's UDP counters (the calling thread's: /proc/thread-self)."""
    with open("/proc/thread-self/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    return dict(zip(rows[0][1:], map(int, rows[1][1:])))


def _calls_summary(results, windows) -> dict:
    """The long calls' own figures: ok, loss and RTCP RTT per window (from their samples)."""
    per = {name: {"received": 0, "lost": 0, "rtt": [], "gaps": []} for name in windows}
    for r in results:
        for start, ms, _attempt in r.rx_gaps:
            for name, (a, b) in windows.items():
                if a <= start < b:
                    per[name]["gaps"].append(ms)
        prev = None
        for s in r.samples:
            t = r.started_unix + s.t_ms / 1000
            for name, (a, b) in windows.items():
                if a <= t < b:
                    if prev is not None:
                        per[name]["received"] += s.packets_received - prev.packets_received
                        per[name]["lost"] += s.packets_lost - prev.packets_lost
                    if s.rtt_ms is not None:
                        per[name]["rtt"].append(s.rtt_ms)
            prev = s
    out = {"sessions": len(results), "ok": sum(r.ok for r in results),
           "reconnections": sum(r.reconnections for r in results),
           "loss_pct": percentile([r.loss_pct for r in results if r.loss_pct is not None], 50, 2)}
    for name, p in per.items():
        total = p["received"] + p["lost"]
        call_s = (windows[name][1] - windows[name][0]) * len(results)
        out[name] = {"packets_received": p["received"], "packets_lost": p["lost"],
                     # 50 a second while the agent echoes; fewer: media stopped (a gap)
                     "received_per_call_s": round(p["received"] / call_s, 1) if call_s else None,
                     "gaps": len(p["gaps"]), "gap_ms_max": round(max(p["gaps"]), 1)
                     if p["gaps"] else None,
                     "loss_pct": round(100 * p["lost"] / total, 3) if total else None,
                     "rtt_ms_p50": percentile(p["rtt"], 50, 2),
                     "rtt_ms_max": round(max(p["rtt"]), 2) if p["rtt"] else None}
    return out


def _new_calls(results) -> dict:
    ok = [r for r in results if r.ok]
    setups = [r.setup_ms for r in ok if r.setup_ms is not None]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    return {"started": len(results), "ok": len(ok), "failures": errors,
            "setup_ms_p50": percentile(setups, 50, 1), "setup_ms_max":
            round(max(setups), 1) if setups else None,
            "first_ice_rtt_ms_p50": percentile([r.first_ice_rtt_ms for r in ok], 50, 2)}


def _lagged_seconds(workdir: Path, a: float, b: float) -> dict[str, int]:
    """Seconds in [a, b) each service logged as lagged (``loop_lag``, docs/logs.md)."""
    out: dict[str, int] = {}
    for log in workdir.glob("*.log"):
        seconds = set()
        with open(log, errors="replace") as f:
            for line in f:
                if '"loop_lag"' not in line:
                    continue
                try:
                    start = json.loads(line).get("window_start")
                except ValueError:
                    continue
                if start is not None and a <= start < b:
                    seconds.add(start)
        if seconds:
            out[log.stem] = len(seconds)
    return out


def _result(cfg, windows, samples, marks, status, kernel, flooded, transit, wire, capture,
            call_results, probe_results, workdir) -> dict:
    violations: list[str] = []
    flood_at, flood_end = windows["flood"]
    cap = cfg.pending_cap

    # the table, while the flood ran (and until the pending TTL after it)
    during = [s for s in samples if flood_at <= s["t"] <= flood_end + 1.0 and "error" not in s]
    before = [s for s in samples if s["t"] < flood_at and "error" not in s]
    if not during or "flows_pending" not in during[0]:
        violations.append("the relay exports no flows_pending counter (or was not sampled)")
    base = before[-1] if before else {}
    established_before = base.get("flows_active", 0) - base.get("flows_pending", 0)
    first_seen = sorted(t for t in wire["client_addresses"].values() if t >= flood_at)
    max_attack = 0
    for s in during:
        legit_new = sum(1 for t in first_seen if t <= s["t"])
        created = s.get("flows_created", 0) - base.get("flows_created", 0)
        legit = established_before + min(created, legit_new)
        max_attack = max(max_attack, s.get("flows_active", 0) - legit)
    last = during[-1] if during else {}
    created_during = last.get("flows_created", 0) - base.get("flows_created", 0)
    new_addresses = sum(1 for t in first_seen if t <= flood_end + 1.0)
    delta = {k: last.get(k, 0) - base.get(k, 0) for k in last
             if k != "t" and not k.startswith("flows_active") and k not in ("flows_pending",
                                                                            "redis_up")}
    table = {
        "pending_cap": cap,
        "max_flows_pending": max((s.get("flows_pending", 0) for s in during), default=None),
        "max_flows_active": max((s.get("flows_active", 0) for s in during), default=None),
        "max_attack_flows": max_attack,
        "established_before_flood": established_before,
        "flows_established_during_flood": created_during,
        "new_call_addresses_during_flood": new_addresses,
        "samples": len(during),
        "drops": {k.removeprefix("drops_"): v for k, v in delta.items()
                  if k.startswith("drops_") and v},
        "pending_created": delta.get("flows_pending_created"),
        "pending_evicted": delta.get("flows_pending_evicted"),
        "pending_expired": delta.get("flows_pending_expired"),
        "packets_to_server": delta.get("packets_to_server"),
    }
    # A worker that never gets back to its loop does not publish: frozen counters observe
    # nothing, so the longest stretch without a change is part of the result.
    frozen, since = 0.0, None
    for prev, s in zip(during, during[1:]):
        same = {k: v for k, v in prev.items() if k != "t"} == {k: v for k, v in s.items()
                                                              if k != "t"}
        since = (since if since is not None else prev["t"]) if same else None
        if since is not None:
            frozen = max(frozen, s["t"] - since)
    table["counters_frozen_s_max"] = round(frozen, 1)
    if frozen > 1.0:
        violations.append(f"the relay's counters did not move for {frozen:.1f} s of the flood "
                          "(its worker did not publish): the table was not observed then")
    if table["max_flows_pending"] is not None and table["max_flows_pending"] > cap:
        violations.append(f"flows_pending reached {table['max_flows_pending']} > cap {cap}")
    if max_attack > cap:
        violations.append(f"attack flows in the table reached {max_attack} > cap {cap}")
    if created_during > new_addresses:
        violations.append(f"{created_during - new_addresses} flows were established during "
                          "the flood beyond the new calls' addresses")

    # relay transit
    ratio = {}
    for direction in ("to_server", "to_client"):
        q, f = transit["quiet"][direction], transit["flood"][direction]
        if q.p99_us and f.p99_us:
            ratio[direction] = round(f.p99_us / q.p99_us, 2)
            if ratio[direction] >= cfg.max_ratio:
                violations.append(f"relay transit p99 {direction}: flood {f.p99_us:g} us vs "
                                  f"quiet {q.p99_us:g} us ({ratio[direction]}x >= "
                                  f"{cfg.max_ratio:g}x)")
        else:
            violations.append(f"no relay transit measured {direction} in a window")

    # the sender
    share = flooded["rate_pps"] / cfg.rate
    if share < cfg.min_rate_share or flooded["sent"] < cfg.rate * cfg.flood_s * 0.999:
        violations.append(f"the sender reached {flooded['rate_pps']:,.0f}/s of {cfg.rate:,}/s")
    if flooded["send_errors"]:
        violations.append(f"{flooded['send_errors']} flood sends failed")

    # calls, old and new
    calls = _calls_summary(call_results, windows)
    if calls["ok"] < cfg.calls or calls["reconnections"]:
        violations.append(f"calls: {calls['ok']}/{cfg.calls} ok, "
                          f"{calls['reconnections']} reconnections")
    late = [r.index for r in call_results
            if r.setup_ms is None or r.started_unix + r.setup_ms / 1000 > windows["quiet"][0]]
    if late:
        violations.append(f"calls {late} were not connected when the quiet window began")
    new = {name: _new_calls(rs) for name, rs in probe_results.items()}
    for name, n in new.items():
        if n["ok"] < n["started"]:
            violations.append(f"new calls in the {name} window: {n['ok']}/{n['started']} ok "
                              f"({n['failures']})")
    stats = capture.stats
    if stats is None or stats.dropped_by_kernel:
        violations.append(f"the capture dropped {stats.dropped_by_kernel if stats else '?'} "
                          "packets: transit figures incomplete")
    if wire["unmatched_departures"]:
        violations.append(f"{wire['unmatched_departures']} datagrams left the relay without a "
                          "captured arrival")

    # CPU per window, % of one core
    cpu = {}
    for name, (a, b) in (("quiet", ("quiet_start", "flood_start")),
                         ("flood", ("flood_start", "flood_end"))):
        if a in marks and b in marks:
            seconds = marks[b].at - marks[a].at
            cpu[name] = {k: round(100 * (marks[b].seconds[k] - v) / seconds, 1)
                         for k, v in marks[a].seconds.items() if k in marks[b].seconds}
    cpu.setdefault("flood", {})["sender"] = flooded["cpu_pct"]
    relay_us = None
    if "relay" in cpu.get("quiet", {}) and "relay" in cpu["flood"]:
        # the relay's extra CPU in the flood, per flood packet
        relay_us = round((cpu["flood"]["relay"] - cpu["quiet"]["relay"]) / 100
                         / flooded["rate_pps"] * 1e6, 1)
    mux = {}
    if "flood_start" in status and "flood_end" in status:
        m0, m1 = status["flood_start"].get("mux") or {}, status["flood_end"].get("mux") or {}
        mux = {k: m1[k] - m0.get(k, 0) for k in m1 if isinstance(m1[k], int) and m1[k] - m0.get(k, 0)}

    udp = {}
    if "flood_start" in kernel and "flood_end" in kernel:
        k0, k1 = kernel["flood_start"], kernel["flood_end"]
        udp = {k: k1[k] - k0.get(k, 0) for k in ("InDatagrams", "InErrors", "RcvbufErrors",
                                                  "NoPorts") if k in k1}
    series = [{"t": round(x["t"] - flood_at, 2), **{k: x.get(k) for k in (
        "flows_pending", "flows_active", "flows_created", "flows_pending_created")}}
        for x in samples if "error" not in x]
    return {
        "config": {k: (v.hex() if isinstance(v, bytes) else str(v) if isinstance(v, Path) else v)
                   for k, v in dataclasses.asdict(cfg).items() if k != "secret"},
        "windows": {k: [round(a, 3), round(b, 3)] for k, (a, b) in windows.items()},
        "sender": flooded,
        "relay_transit_us": {w: {d: dataclasses.asdict(v) for d, v in rows.items()}
                             for w, rows in transit.items()},
        "p99_ratio": ratio,
        "calls": calls,
        "new_calls": new,
        "flow_table": table,
        "cpu_pct_of_core": cpu,
        "relay_cpu_us_per_flood_packet": relay_us,
        "transceiver_mux_during_flood": mux,
        "kernel_udp_during_flood": udp,  # the namespace's /proc/net/snmp: socket overflows
        "table_series": series,
        "lagged_seconds": {"quiet": _lagged_seconds(workdir, *windows["quiet"]),
                           "flood": _lagged_seconds(workdir, *windows["flood"])},
        "capture": {**(dataclasses.asdict(stats) if stats else {}),
                    "unmatched_departures": wire["unmatched_departures"],
                    "client_addresses": len(wire["client_addresses"])},
        "workdir": str(workdir),
        "violations": violations,
    }


def lines(result: dict) -> list[str]:
    """A short human table of ``result``."""
    s, t, table = result["sender"], result["relay_transit_us"], result["flow_table"]
    cfg = result["config"]
    fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    out = [f"flood: {s['sent']:,} first packets in {s['seconds']:g} s = {s['rate_pps']:,.0f}/s "
           f"(target {cfg['rate']:,}/s), sender CPU {s['cpu_pct']:g}% of a core "
           f"({s['cpu_us_per_packet']:g} us/packet)",
           "relay transit (us)      quiet p50 / p99 / max      flood p50 / p99 / max    p99 x"]
    out.insert(1, relay_core_text(result.get("relay_core")))
    def us(v):  # us up to 10 ms, then ms, then s
        return "-" if v is None else (f"{v:.0f}" if v < 1e4 else f"{v / 1e3:.0f} ms"
                                      if v < 1e6 else f"{v / 1e6:.1f} s")

    for d in ("to_server", "to_client"):
        q, f = t["quiet"][d], t["flood"][d]
        out.append(f"  {d:<10} {q['matched']:>7} {us(q['p50_us']):>6} / {us(q['p99_us']):>6}"
                   f" / {us(q['max_us']):>7}  {f['matched']:>7} {us(f['p50_us']):>6} / "
                   f"{us(f['p99_us']):>6} / {us(f['max_us']):>7}  "
                   f"{fmt(result['p99_ratio'].get(d))}")
    c = result["calls"]
    q, f = c["quiet"], c["flood"]
    out.append(f"calls: {c['ok']}/{c['sessions']} ok, {c['reconnections']} reconnections; "
               f"received/s per call quiet {fmt(q['received_per_call_s'])} flood "
               f"{fmt(f['received_per_call_s'])}; loss {fmt(q['loss_pct'])}% / "
               f"{fmt(f['loss_pct'])}%; gaps {q['gaps']} / {f['gaps']} (max "
               f"{fmt(f['gap_ms_max'])} ms); RTCP RTT p50 {fmt(q['rtt_ms_p50'])} / "
               f"{fmt(f['rtt_ms_p50'])} ms")
    for name, n in result["new_calls"].items():
        out.append(f"new calls ({name}): {n['ok']}/{n['started']} connected, setup p50 "
                   f"{fmt(n['setup_ms_p50'])} ms, max {fmt(n['setup_ms_max'])} ms")
    out.append(f"flow table: pending max {fmt(table['max_flows_pending'])}, attack flows max "
               f"{table['max_attack_flows']} (cap {table['pending_cap']}); pending created "
               f"{fmt(table['pending_created'])}, evicted {fmt(table['pending_evicted'])}, "
               f"expired {fmt(table['pending_expired'])}")
    out.append("drops: " + (", ".join(f"{k} {v:,}" for k, v in table["drops"].items()) or "none")
               + f"; kernel UDP receive buffer overflows "
               f"{result['kernel_udp_during_flood'].get('RcvbufErrors', '-')}")
    cpu = result["cpu_pct_of_core"]
    if result.get("relay_cpu_us_per_flood_packet") is not None:
        out.append(f"relay CPU per flood packet: {result['relay_cpu_us_per_flood_packet']:g} us")
    for name in ("quiet", "flood"):
        if name in cpu:
            out.append(f"CPU % of a core ({name}): " + ", ".join(
                f"{k} {v:g}" for k, v in cpu[name].items()))
    return out  # the violations: result["violations"] (the command prints them)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--sender":
        _sender(json.loads(sys.argv[2]))
    else:
        sys.exit("usage: python -m bench.hostile.flood --sender SPEC (the flood process; "
                 "bench.hostile.flood.run is the benchmark)")
