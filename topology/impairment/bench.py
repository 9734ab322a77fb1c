"""``voiceedge bench impairment``: the userspace engine's cost and accuracy.

Two namespaces joined by a veth (``lab.pair_lab``). First the floor: ``floor_seconds`` of the
same UDP traffic with no impairment. Then the engine impairs what ``b`` receives with
``delay_ms`` (+- ``jitter_ms``) and the probe sends ``rate`` datagrams per second for
``seconds``. Reported: the engine's CPU per packet (scheduler time, /proc/PID/schedstat) and
the same as % of a core at 1000 packets/s, the host's CPU per packet in each phase (every core's
busy time, /proc/stat) and so what impairing adds to it, the engine's release lateness
(verdict time - due time), and the measured one-way delay against the configured one (mean
minus the floor).

The engine's own CPU includes the rest of each packet's trip up the stack, which a verdict
runs in the engine's context and which, unimpaired, the kernel runs anyway in the sender's or
a softirq's; the host's CPU in the two phases, side by side, says what the engine costs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

from services.procfs import HostTimes
from topology.impairment.engine import CORES, NATIVE, check_core
from topology.impairment.lab import pair_lab
from topology.impairment.model import Impairment
from topology.probe import udp_probe
from topology.impairment.userspace import UserspaceBackend
from topology.preflight import check_lab_prerequisites
from voiceedge.errors import UserError

CPU_TARGET_PCT_PER_1000PPS = 10.0
LATENESS_P50_TARGET_US = 100.0


@dataclass(frozen=True)
class BenchConfig:
    delay_ms: float = 20.0
    jitter_ms: float = 0.0
    rate: int = 1000
    seconds: float = 5.0
    size: int = 200
    floor_seconds: float | None = None   # None: as long as the impaired phase
    spin_us: float = 0.0
    core: str = NATIVE
    tick_us: float | None = None  # None: the backend's default

    def __post_init__(self) -> None:
        check_core(self.core)
        if self.rate < 1 or self.seconds <= 0 or (self.floor_seconds or 0) < 0:
            raise ValueError("rate and seconds must be positive")
        if self.spin_us < 0:
            raise ValueError("spin must not be negative")
        if self.tick_us is not None and not 0 <= self.tick_us <= 10000:
            raise ValueError("tick must be 0..10000 us")
        if not 12 <= self.size <= 1400:
            raise ValueError("size must be 12..1400 bytes")
        Impairment(delay_ms=self.delay_ms, jitter_ms=self.jitter_ms)  # validates


@dataclass
class BenchResult:
    config: BenchConfig
    sent: int
    received: int
    floor_mean_ms: float
    mean_ms: float
    sd_ms: float
    p99_ms: float
    added_mean_ms: float  # mean - floor: what the engine added
    delay_error_ms: float  # added - configured
    engine_packets: int
    cpu_us_per_packet: float
    cpu_pct_at_rate: float
    cpu_pct_per_1000pps: float
    lateness_p50_us: float | None
    lateness_p99_us: float | None
    lateness_max_us: float | None
    kernel_dropped: int
    tick_us: float = 0.0  # the native core's busy-mode tick in this run (0: on every event)
    early_max_us: float | None = None
    ticks: int = 0
    # Every core's busy time per packet sent, without impairment and with it (/proc/stat):
    # the difference is what impairing costs the host (None without a floor phase).
    host_us_per_packet_floor: float | None = None
    host_us_per_packet: float | None = None

    @property
    def added_host_us_per_packet(self) -> float | None:
        if self.host_us_per_packet_floor is None or self.host_us_per_packet is None:
            return None
        return round(self.host_us_per_packet - self.host_us_per_packet_floor, 2)

    @property
    def within_targets(self) -> bool:
        return (self.cpu_pct_per_1000pps <= CPU_TARGET_PCT_PER_1000PPS
                and self.lateness_p50_us is not None
                and self.lateness_p50_us < LATENESS_P50_TARGET_US)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["within_targets"] = self.within_targets
        out["added_host_us_per_packet"] = self.added_host_us_per_packet
        return out


def run_bench(cfg: BenchConfig, say=lambda msg: None) -> BenchResult:
    with pair_lab(prefix="vebench", subnet="10.99.1", subnet6="fd99:1::") as lab:
        def probe(seconds: float):
            """The probe, and every core's busy seconds while it ran."""
            before, t0 = HostTimes.read(), time.monotonic()
            result = udp_probe(lab.a.ns_path, lab.b.ns_path, lab.addr_b,
                               count=max(1, round(cfg.rate * seconds)), rate=cfg.rate,
                               size=cfg.size,
                               drain_s=0.2 + (cfg.delay_ms + 4 * cfg.jitter_ms) / 1e3)
            busy = (time.monotonic() - t0) * cpus - (HostTimes.read().idle - before.idle)
            return result, max(busy, 0.0)

        cpus = os.cpu_count() or 1
        floor_seconds = cfg.seconds if cfg.floor_seconds is None else cfg.floor_seconds
        floor, floor_busy = probe(floor_seconds) if floor_seconds else (None, None)
        floor_mean = floor.mean_ms if floor else 0.0
        say(f"floor: {floor_mean:.3f} ms one way without impairment")
        with UserspaceBackend(spin_us=cfg.spin_us, core=cfg.core,
                              tick_us=cfg.tick_us if cfg.core == NATIVE else 0.0) as backend:
            tick_us = backend.tick_us
            backend.apply(lab.b, lab.if_b, Impairment(delay_ms=cfg.delay_ms,
                                                      jitter_ms=cfg.jitter_ms))
            before = backend.stats()
            t0 = time.monotonic()
            say(f"impaired ({cfg.core} core): {cfg.rate} packets/s for {cfg.seconds:g} s, "
                f"{cfg.delay_ms:g} +- {cfg.jitter_ms:g} ms")
            result, busy = probe(cfg.seconds)
            wall = time.monotonic() - t0
            after = backend.stats()
        key = f"{lab.b.name}:{lab.if_b}"
        packets = after["interfaces"][key]["seen"] - before["interfaces"][key]["seen"]
        cpu = after["cpu_seconds"] - before["cpu_seconds"]
        kernel = after["interfaces"][key]["kernel"]
        per_packet = cpu / max(packets, 1)
        added = result.mean_ms - floor_mean
        return BenchResult(
            config=cfg, sent=result.sent, received=result.received,
            floor_mean_ms=round(floor_mean, 4), mean_ms=round(result.mean_ms, 4),
            sd_ms=round(result.sd_ms, 4), p99_ms=round(result.percentile_ms(0.99), 4),
            added_mean_ms=round(added, 4), delay_error_ms=round(added - cfg.delay_ms, 4),
            engine_packets=packets, cpu_us_per_packet=round(per_packet * 1e6, 2),
            cpu_pct_at_rate=round(100 * cpu / wall, 2),
            cpu_pct_per_1000pps=round(per_packet * 1000 * 100, 2),
            lateness_p50_us=after["lateness_p50_us"], lateness_p99_us=after["lateness_p99_us"],
            lateness_max_us=after["lateness_max_us"],
            tick_us=tick_us, early_max_us=after.get("early_max_us"),
            ticks=(after.get("ticks") or 0) - (before.get("ticks") or 0),
            host_us_per_packet_floor=(round(floor_busy / floor.sent * 1e6, 2)
                                      if floor else None),
            host_us_per_packet=round(busy / result.sent * 1e6, 2),
            kernel_dropped=kernel.get("queue_dropped", 0) + kernel.get("user_dropped", 0))


def format_result(r: BenchResult) -> str:
    c = r.config
    rows = [
        ("engine core", c.core + ("" if c.core != NATIVE else
                                  f" (busy-mode tick {r.tick_us:g} us, {r.ticks} ticks)"
                                  if r.tick_us else " (on every event)")),
        ("configured delay", f"{c.delay_ms:g} +- {c.jitter_ms:g} ms"),
        ("floor (no impairment)", f"{r.floor_mean_ms:.3f} ms"),
        ("measured mean / sd / p99", f"{r.mean_ms:.3f} / {r.sd_ms:.3f} / {r.p99_ms:.3f} ms"),
        ("added by the engine", f"{r.added_mean_ms:.3f} ms ({r.delay_error_ms:+.3f} vs configured)"),
        ("received", f"{r.received} of {r.sent} (kernel queue drops {r.kernel_dropped})"),
        ("engine CPU", f"{r.cpu_us_per_packet:.1f} us/packet, {r.cpu_pct_at_rate:.2f}% of a core "
                       f"at {c.rate}/s"),
        ("  per 1000 packets/s", f"{r.cpu_pct_per_1000pps:.2f}% of a core "
                                 f"(target <= {CPU_TARGET_PCT_PER_1000PPS:g}%)"),
        ("release lateness p50 / p99 / max", f"{r.lateness_p50_us} / {r.lateness_p99_us} / "
                                             f"{r.lateness_max_us} us "
                                             f"(target p50 < {LATENESS_P50_TARGET_US:g})"
                                             + (f"; released up to {r.early_max_us} us early"
                                                if r.early_max_us else "")),
        ("host CPU per packet", "no floor phase" if r.added_host_us_per_packet is None else
         f"{r.host_us_per_packet_floor:.1f} us unimpaired, {r.host_us_per_packet:.1f} impaired: "
         f"impairing adds {r.added_host_us_per_packet:.1f} us"),
        ("within targets", "yes" if r.within_targets else "NO"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def add_parser(sub) -> None:
    p = sub.add_parser("impairment", help="the userspace impairment engine's cost and accuracy",
                       description="Impair one direction of a veth between two namespaces with "
                                   "the userspace NFQUEUE engine, send UDP through it, and report "
                                   "engine CPU, release lateness and measured vs configured delay.")
    p.add_argument("--delay-ms", type=float, default=20.0, help="configured delay (default 20)")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="sd of the delay (default 0)")
    p.add_argument("--rate", type=int, default=1000, help="packets per second (default 1000)")
    p.add_argument("--seconds", type=float, default=5.0, help="impaired phase length (default 5)")
    p.add_argument("--size", type=int, default=200, help="UDP payload bytes (default 200)")
    p.add_argument("--floor-seconds", type=float, default=None,
                   help="unimpaired phase measuring the floor and the host's CPU without the "
                        "engine (default: as long as the impaired phase; 0 to skip)")
    p.add_argument("--spin-us", type=float, default=0.0,
                   help="engine wakes this early and waits the rest awake (default 0)")
    p.add_argument("--tick-us", type=float, default=None,
                   help="native core's busy-mode tick (default: the backend's; 0: off)")
    p.add_argument("--core", default="python,native", metavar="LIST",
                   help="engine cores to measure, one after the other in this run "
                        "(default python,native)")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cores = [c.strip() for c in args.core.split(",") if c.strip()]
    if not cores:
        raise UserError(f"--core names no core (choose from {', '.join(CORES)})")
    try:
        cfgs = [BenchConfig(delay_ms=args.delay_ms, jitter_ms=args.jitter_ms, rate=args.rate,
                            seconds=args.seconds, size=args.size,
                            floor_seconds=args.floor_seconds, spin_us=args.spin_us, core=core,
                            tick_us=args.tick_us)
                for core in cores]
    except ValueError as exc:
        raise UserError(str(exc)) from None
    check_lab_prerequisites()
    say = (lambda msg: None) if args.json else (lambda msg: print(msg, file=sys.stderr))
    results = [run_bench(cfg, say) for cfg in cfgs]
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
        return 0
    print("\n\n".join(format_result(r) for r in results))
    if len(results) > 1 and all(r.cpu_us_per_packet for r in results):
        base = results[0]
        for r in results[1:]:
            print(f"\n{r.config.core} / {base.config.core}: CPU per packet "
                  f"{r.cpu_us_per_packet / base.cpu_us_per_packet:.2f}x")
    return 0
