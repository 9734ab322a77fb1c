"""``voiceedge bench relay``: the relay's own cost and added latency, side by side in one run.

Phases, each with the same traffic (``flows`` client sockets, ``size``-byte datagrams, ``rate``
per second in all, after one STUN binding request per flow):

1. ``direct``: straight from the generator to the sink: the latency floor of this machine.
2. ``relay`` with 1 worker pinned to ``relay_cpu`` (the generator and sink on ``gen_cpu``).
3. ``relay`` with 2 workers (one on each CPU; the second shares a core with the generator).
4. ``naive``: a reference relay that does one recvfrom/sendto per datagram, as a plain CPython
   loop would, pinned like the 1-worker relay.

Relay CPU per packet is the workers' user+system time over the phase (from /proc) divided by
the datagrams the sink received; added latency is a phase's percentile minus the direct one.
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from analysis.stats import percentile
from bench.loadgen import LoadGenerator, PhaseResult, Sink
from services.relay.config import RelayConfig, RouteTable
from services.procfs import precise_cpu_seconds
from services.relay.server import RelayServer
from services.wire import hop as hopwire
from services.wire.stun import binding_request
from services.wire.ufrag import UfragCodec
from voiceedge.errors import UserError



@dataclass(frozen=True)
class BenchConfig:
    rate: int = 50_000
    flows: int = 100
    size: int = 200
    seconds: float = 2.0
    relay_cpu: int = 0
    gen_cpu: int = 1
    workers: tuple[int, ...] = (1, 2)
    naive: bool = True
    rounds: int = 3


@dataclass
class PhaseRow:
    phase: str
    workers: int
    sent: int
    received: int
    lost: int
    relay_drops: int
    rate_pps: float
    cpu_us_per_packet: float | None  # median over rounds
    cpu_us_per_packet_rounds: list[float] | None
    latency_p50_us: float
    latency_p99_us: float
    batch_mean: float | None = None  # datagrams per wake-up of the relay
    added_p50_us: float | None = None
    added_p99_us: float | None = None


def _percentile(values: list[float], q: float) -> float:
    """The project's one percentile definition (analysis/stats.py); NaN for no values."""
    value = percentile(values, q)
    return float("nan") if value is None else value


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _naive_relay(listen: socket.socket, sink: tuple[str, int], cpu: int) -> None:
    """The reference: one system call per datagram, a new bytes object per datagram."""
    os.sched_setaffinity(0, {cpu})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flows: dict = {}
    while True:
        data, addr = listen.recvfrom(2048)
        header = flows.get(addr)
        if header is None:
            if data[0] > 3:
                continue
            header = flows[addr] = hopwire.encode(addr)
        out.sendto(header + data, sink)


class _Target:
    """Something the generator sends through: the sink itself, a relay, the naive reference."""

    name = "direct"
    workers = 0

    def __init__(self, sink: Sink) -> None:
        self.address = sink.address

    def pids(self) -> list[int]:
        return []

    def batch_mean(self) -> float | None:
        return None

    def drops(self) -> int:
        return 0

    def stop(self) -> None:
        pass


class _RelayTarget(_Target):
    name = "relay"

    def __init__(self, sink: Sink, secret: bytes, workers: int, cpus: tuple[int, ...],
                 flows: int) -> None:
        port = _free_udp_port()
        self.workers = workers
        self.address = ("127.0.0.1", port)
        self.server = RelayServer(RelayConfig(
            routes=RouteTable("ingress", {1: sink.address}), listen=self.address,
            hop_bind="127.0.0.1", secret=secret, workers=workers, cpus=cpus, metrics=None,
            relay_id=f"bench-{port}",
            # Every flow of the bench comes from 127.0.0.1: the per-address cap on pending
            # flows (a flood defence, 64 by default) would refuse all flows past the 64th.
            pending_per_ip=max(RelayConfig.pending_per_ip, flows)))
        self.server.start()

    def pids(self) -> list[int]:
        return self.server.worker_pids()

    def _totals(self) -> dict[str, int]:
        time.sleep(0.6)  # workers publish counters twice a second
        return self.server.totals()

    def batch_mean(self) -> float | None:
        t = self._totals()
        return round(t["packets_to_server"] / max(t["receive_batches"], 1), 2)

    def drops(self) -> int:
        return sum(v for k, v in self._totals().items() if k.startswith("drops_"))

    def stop(self) -> None:
        self.server.stop()


class _NaiveTarget(_Target):
    name = "naive"
    workers = 1

    def __init__(self, sink: Sink, cpu: int) -> None:
        self.listen = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.listen.setsockopt(socket.SOL_SOCKET, 33, 4 << 20)
        self.listen.bind(("127.0.0.1", 0))
        self.address = self.listen.getsockname()
        self.proc = multiprocessing.get_context("fork").Process(
            target=_naive_relay, args=(self.listen, sink.address, cpu), daemon=True)
        self.proc.start()

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.join()
        self.listen.close()


def _prime(target: _Target, gen: LoadGenerator, sink: Sink, ufrag: str) -> None:
    """First packets (STUN) for every flow; wait until the sink has seen them all."""
    sink.reset()
    gen.send_first(target.address, lambda k: binding_request(f"{ufrag}:c{k:04d}".encode()))
    deadline = time.monotonic() + 5
    while len(sink.first_packets) < len(gen.socks) and time.monotonic() < deadline:
        sink.drain()
        time.sleep(0.005)
    if len(sink.first_packets) < len(gen.socks):
        raise RuntimeError(f"only {len(sink.first_packets)} of {len(gen.socks)} flows "
                           f"reached the sink through the {target.name}")
    time.sleep(0.05)  # the sink answered each first packet: the relay establishes the flows


def run_bench(cfg: BenchConfig, say=lambda msg: None) -> list[PhaseRow]:
    """Every target, ``rounds`` times, interleaved; the caller's process becomes the generator
    and sink, pinned to ``gen_cpu``. CPU per packet is the median over rounds; latency
    percentiles pool every round's datagrams."""
    cpus = os.sched_getaffinity(0)
    if not {cfg.relay_cpu, cfg.gen_cpu} <= cpus or cfg.relay_cpu == cfg.gen_cpu:
        raise ValueError(f"needs two distinct CPUs from {sorted(cpus)} "
                         f"(got relay {cfg.relay_cpu}, generator {cfg.gen_cpu})")
    logging.getLogger("voiceedge.relay").setLevel(logging.WARNING)  # no line per bench flow
    secret = b"voiceedge-bench-secret-0123456789"
    ufrag = UfragCodec(secret).encode(1, 1)
    sink, gen = Sink(), LoadGenerator(cfg.flows, cfg.size)
    targets: list[_Target] = [_Target(sink)]
    try:
        for w in cfg.workers:
            pinned = (cfg.relay_cpu,) if w == 1 else tuple(sorted({cfg.relay_cpu, cfg.gen_cpu}))
            targets.append(_RelayTarget(sink, secret, w, pinned, cfg.flows))
        if cfg.naive:
            targets.append(_NaiveTarget(sink, cfg.relay_cpu))
        os.sched_setaffinity(0, {cfg.gen_cpu})
        time.sleep(0.2)  # SO_TIMESTAMPNS takes effect a moment after it is first enabled
        for t in targets[1:]:
            _prime(t, gen, sink, ufrag)
        results: dict[int, list[tuple[PhaseResult, float | None]]] = {i: [] for i in range(len(targets))}
        for r in range(cfg.rounds):
            for i, t in enumerate(targets):
                say(f"round {r + 1}/{cfg.rounds}: {t.name}"
                    + (f", {t.workers} worker(s)" if t.workers else ""))
                pids = t.pids()
                before = sum(precise_cpu_seconds(p) for p in pids)
                result = gen.run(t.address, cfg.rate, cfg.seconds, sink, seed=r)
                cpu = sum(precise_cpu_seconds(p) for p in pids) - before if pids else None
                results[i].append((result, cpu))
        rows = [_summarise(t, results[i]) for i, t in enumerate(targets)]
    finally:
        os.sched_setaffinity(0, cpus)
        for t in targets:
            t.stop()
        sink.close()
        gen.close()
    base = rows[0]
    for row in rows[1:]:
        row.added_p50_us = round(row.latency_p50_us - base.latency_p50_us, 1)
        row.added_p99_us = round(row.latency_p99_us - base.latency_p99_us, 1)
    return rows


def _summarise(target: _Target, runs: list[tuple[PhaseResult, float | None]]) -> PhaseRow:
    latencies = [x for result, _ in runs for x in result.latencies_us]
    sent = sum(r.sent for r, _ in runs)
    received = sum(r.received for r, _ in runs)
    seconds = sum(r.seconds for r, _ in runs)
    cpu = [c / max(r.received, 1) * 1e6 for r, c in runs if c is not None]
    return PhaseRow(
        phase=target.name, workers=target.workers, sent=sent, received=received,
        lost=sent - received, relay_drops=target.drops(), rate_pps=round(sent / seconds),
        cpu_us_per_packet=round(statistics.median(cpu), 2) if cpu else None,
        cpu_us_per_packet_rounds=[round(c, 2) for c in cpu] or None,
        latency_p50_us=round(_percentile(latencies, 50), 1),
        latency_p99_us=round(_percentile(latencies, 99), 1),
        batch_mean=target.batch_mean())


def add_parser(sub) -> None:
    p = sub.add_parser("relay", help="relay CPU per packet and added latency vs the direct path",
                       description=__doc__.split("\n\n")[0])
    d = BenchConfig()
    p.add_argument("--rate", type=int, default=d.rate, help=f"datagrams per second (default {d.rate})")
    p.add_argument("--flows", type=int, default=d.flows, help=f"client flows (default {d.flows})")
    p.add_argument("--size", type=int, default=d.size, help=f"datagram bytes (default {d.size})")
    p.add_argument("--seconds", type=float, default=d.seconds,
                   help=f"per phase and round (default {d.seconds})")
    p.add_argument("--rounds", type=int, default=d.rounds,
                   help=f"interleaved rounds; medians are reported (default {d.rounds})")
    p.add_argument("--workers", default="1,2", metavar="LIST",
                   help="relay worker counts to measure (default 1,2)")
    p.add_argument("--no-naive", action="store_true", help="skip the naive reference relay")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.set_defaults(func=_main)


def _main(args) -> int:

    if args.rate <= 0 or args.flows <= 0 or args.seconds <= 0 or not 16 <= args.size <= 1400:
        raise UserError("--rate, --flows, --seconds must be positive and --size 16..1400")
    if args.rounds < 1:
        raise UserError("--rounds must be at least 1")
    try:
        workers = tuple(int(w) for w in args.workers.split(","))
    except ValueError:
        raise UserError(f"--workers {args.workers!r} is not a list like 1,2") from None
    if not workers or min(workers) < 1:
        raise UserError("--workers counts must be at least 1")
    cfg = BenchConfig(rate=args.rate, flows=args.flows, size=args.size, seconds=args.seconds,
                      naive=not args.no_naive, rounds=args.rounds, workers=workers)
    if args.json:
        say = lambda msg: None  # noqa: E731
    else:
        from rich.console import Console
        console = Console(stderr=True)
        say = lambda msg: console.print(f"[dim]… {msg} ({cfg.seconds:g} s)[/dim]")  # noqa: E731
    try:
        rows = run_bench(cfg, say)
    except (ValueError, RuntimeError, OSError) as exc:
        raise UserError(str(exc)) from None
    if args.json:
        json.dump({"config": asdict(cfg), "phases": [asdict(r) for r in rows]}, sys.stdout, indent=2)
        print()
        return 0
    _print_table(cfg, rows)
    return 0


def _print_table(cfg: BenchConfig, rows: list[PhaseRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"relay bench: {cfg.rate} datagrams/s (Poisson), {cfg.flows} flows, "
                        f"{cfg.size} B, {cfg.rounds} x {cfg.seconds:g} s per phase",
                  caption="CPU: median over rounds of the relay processes' CPU time per "
                          "datagram; latency: one-way, kernel timestamps; +: above direct")
    for col in ("phase", "workers", "rate/s", "sent", "lost", "drops", "CPU us/pkt", "batch",
                "p50 us", "p99 us", "+p50 us", "+p99 us"):
        table.add_column(col, justify="right")
    fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    for r in rows:
        table.add_row(r.phase, str(r.workers) if r.workers else "-", f"{r.rate_pps:g}",
                      str(r.sent), str(r.lost), str(r.relay_drops), fmt(r.cpu_us_per_packet),
                      fmt(r.batch_mean), fmt(r.latency_p50_us), fmt(r.latency_p99_us),
                      fmt(r.added_p50_us), fmt(r.added_p99_us))
    Console(width=max(Console().width, 130)).print(table)
