"""Calibration: prove that the emulated world is the configured one before using it.

Every impaired direction of every link is probed (topology/probe.py: UDP at a fixed rate,
monotonic timestamps) and compared with its configuration:

- mean one-way delay within max(1 ms, 5%) + 0.5 ms per hop;
- spread within 25% + 0.5 ms of the configured jitter, with the standard deviation estimated
  robustly (IQR / 1.349, exact for normal jitter): a handful of datagrams held up by the
  probe's own scheduling on a busy 2-core machine must not fail a link (the plain standard
  deviation is reported too);
- the count of lost datagrams inside what the configured loss model gives for that many
  datagrams, simulated (bursty loss is far from binomial on a few hundred packets), with tails
  of 0.1% split over all the paths of the world (Bonferroni): a 51-path world must not fail one
  run in twenty by chance alone;

plus one path that is not impaired, which must measure near zero: a world where impairment
silently does nothing (Mininet's TCLink without netem) fails every delayed link. A world that
fails is not used: callers refuse to go on.
"""
from __future__ import annotations

import functools
import json
import math
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from topology.impairment.model import BernoulliLoss, Impairment, LossModel
from topology.world import World

BASE_PORT = 47000


@dataclass(frozen=True)
class Expectation:
    mean_ms: float
    sd_ms: float
    loss: LossModel | None = None
    hops: int = 1
    distribution: str = "normal"

    @property
    def loss_pct(self) -> float:
        return self.loss.expected_pct if self.loss else 0.0

    @classmethod
    def of(cls, impairment: Impairment | None) -> "Expectation":
        if impairment is None:
            return cls(0.0, 0.0)
        return cls(impairment.delay_ms, impairment.jitter_ms, impairment.loss,
                   distribution=impairment.distribution)


@functools.lru_cache(maxsize=64)
def loss_band(loss: LossModel | None, sent: int, tail: float = 0.001,
              trials: int | None = None) -> tuple[int, int]:
    """Lost-datagram counts between the ``tail`` and 1-``tail`` quantiles of ``sent`` packets
    through ``loss`` (Monte Carlo with a fixed seed, so the band is the same every run; enough
    trials to resolve the tail)."""
    trials = trials or min(400_000, max(20_000, int(20 / tail)))
    if loss is None or loss.expected_pct == 0:
        return 0, 0
    rng = np.random.default_rng(12345)
    if isinstance(loss, BernoulliLoss):
        counts = rng.binomial(sent, loss.pct / 100.0, size=trials)
    else:
        p, r = loss.p / 100.0, loss.r / 100.0
        bad = rng.random(trials) < p / (p + r)  # start in the stationary distribution
        counts = np.zeros(trials, dtype=np.int64)
        for _ in range(sent):
            lost_prob = np.where(bad, loss.bad_loss, loss.good_loss) / 100.0
            counts += rng.random(trials) < lost_prob
            flip = rng.random(trials)
            bad = np.where(bad, flip >= r, flip < p)
    lo, hi = np.quantile(counts, [tail, 1 - tail])
    return int(lo), int(math.ceil(hi))


@dataclass
class PathResult:
    kind: str
    src: str
    dst: str
    sender: str
    receiver: str
    expected_mean_ms: float
    expected_sd_ms: float
    expected_loss_pct: float
    sent: int
    received: int
    mean_ms: float | None
    sd_ms: float | None
    sd_robust_ms: float | None
    loss_pct: float
    mean_ok: bool
    sd_ok: bool
    loss_ok: bool
    reordered: int

    @property
    def ok(self) -> bool:
        return self.mean_ok and self.sd_ok and self.loss_ok


@dataclass
class CalibrationReport:
    backend: str
    paths: list[PathResult]
    baseline_ms: float | None  # the unimpaired path

    @property
    def ok(self) -> bool:
        return bool(self.paths) and all(p.ok for p in self.paths)

    @property
    def failures(self) -> list[PathResult]:
        return [p for p in self.paths if not p.ok]

    def to_dict(self) -> dict:
        return {"backend": self.backend, "ok": self.ok, "baseline_ms": self.baseline_ms,
                "paths": [asdict(p) | {"ok": p.ok} for p in self.paths]}


FAMILY_TAIL = 0.001  # chance per run that a correct world fails its loss checks


def judge(exp: Expectation, sent: int, delays: list[float], reordered: int, kind: str, src: str,
          dst: str, sender: str, receiver: str, paths: int = 1) -> PathResult:
    """Compare one probe's measurements with what the configuration implies."""
    received = len(delays)
    loss_pct = 100.0 * (sent - received) / sent if sent else 100.0
    mean = statistics.fmean(delays) if delays else None
    sd = statistics.pstdev(delays) if len(delays) > 1 else None
    robust = None
    if len(delays) >= 8:
        q1, q3 = np.percentile(delays, [25, 75])
        robust = float(q3 - q1) / 1.349
    tolerance = max(1.0, 0.05 * exp.mean_ms) + 0.5 * exp.hops
    mean_ok = mean is not None and abs(mean - exp.mean_ms) <= tolerance
    # A uniform delay's IQR / 1.349 is 1.284 times its standard deviation.
    expected_spread = exp.sd_ms * (1.284 if exp.distribution == "uniform" else 1.0)
    sd_ok = robust is not None and abs(robust - expected_spread) <= 0.25 * expected_spread + 0.5
    lo, hi = loss_band(exp.loss, sent, tail=FAMILY_TAIL / max(1, paths))
    loss_ok = lo <= sent - received <= hi
    return PathResult(kind, src, dst, sender, receiver, exp.mean_ms, exp.sd_ms, exp.loss_pct,
                      sent, received, None if mean is None else round(mean, 3),
                      None if sd is None else round(sd, 3),
                      None if robust is None else round(robust, 3), round(loss_pct, 2), mean_ok,
                      sd_ok,
                      loss_ok, reordered)


def _probe(world: World, sender: str, receiver: str, target_ip: str, port: int, count: int,
           rate: float) -> tuple[list[float], int]:
    """Run one probe between two hosts of the world; returns (delays ms, reordered count)."""
    recv = world.net[receiver].popen(
        [sys.executable, "-m", "topology.probe", "recv", "--port", str(port), "--count",
         str(count), "--timeout", "2.0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + 10
        while recv.stderr.readline().strip() != "ready":
            if recv.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"probe receiver on {receiver} did not start")
        send = world.net[sender].popen(
            [sys.executable, "-m", "topology.probe", "send", "--to", f"{target_ip}:{port}",
             "--count", str(count), "--rate", str(rate)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        send.wait(timeout=count / rate + 30)
        out, _ = recv.communicate(timeout=count / rate + 30)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    data = json.loads(out)
    order = data["arrival_order"]
    reordered = sum(1 for a, b in zip(order, order[1:]) if b < a)
    return data["delays_ms"], reordered


def calibrate(world: World, count: int = 200, rate: float = 100.0, parallel: int = 4,
              progress=lambda done, total: None) -> CalibrationReport:
    """Probe every impaired direction of the world (and one unimpaired path)."""
    jobs = []
    for n, link in enumerate(world.links):
        jobs.append((link.kind, link.src, link.dst, link.sender, link.receiver,
                     link.receiver_ip, Expectation.of(link.impairment), BASE_PORT + n))
    first = world.spec.regions[0]
    i = world.index[first]
    jobs.append(("unimpaired", first, first, f"edge{i}", f"pub{i}", world.lan(i, 2, 1),
                 Expectation.of(None), BASE_PORT + len(jobs)))
    results: list[PathResult | None] = [None] * len(jobs)
    done = 0

    def run(n: int) -> None:
        kind, src, dst, sender, receiver, ip, exp, port = jobs[n]
        delays, reordered = _probe(world, sender, receiver, ip, port, count, rate)
        results[n] = judge(exp, count, delays, reordered, kind, src, dst, sender, receiver,
                           paths=len(jobs))

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for _ in pool.map(run, range(len(jobs))):
            done += 1
            progress(done, len(jobs))
    baseline = results[-1]
    return CalibrationReport(backend=world.backend.name, paths=list(results),
                             baseline_ms=baseline.mean_ms if baseline else None)
