"""Calibration: prove that the emulated world is the configured one before using it.

Every impaired direction of every link is probed (topology/probe.py: UDP at a fixed rate,
monotonic timestamps, 200-byte datagrams) and compared with its configuration:

- one-way delays by the rule the captures' hops are judged by too (voiceedge/delayrule.py):
  mean within max(1 ms, 5%) + 0.5 ms per hop; spread within 25% + 0.5 ms of the configured
  jitter, with the standard deviation estimated robustly (IQR / 1.349, exact for normal
  jitter): a handful of datagrams held up by the probe's own scheduling on a busy 2-core
  machine must not fail a link (the plain standard deviation is reported too);
- the count of lost datagrams between two quantiles of what the configured loss model gives
  for that many datagrams, simulated (bursty loss is far from binomial on a few hundred
  packets): each tail is 0.1% divided by the number of paths probed (Bonferroni), so a correct
  world fails its loss checks by chance in at most 0.2% of runs however many paths it has;

plus one path that is not impaired, which must measure near zero: a world where impairment
silently does nothing (Mininet's TCLink without netem) fails every delayed link. A world that
fails is not used: callers refuse to go on.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from topology.impairment.model import BernoulliLoss, Impairment, LossModel
from topology.probeprocess import ProbeSpec, probe_in_child, run_probes
from topology.world import ImpairedLink, World
from voiceedge.delayrule import DelayExpectation, judge_delays

PROBE_BYTES = 200  # UDP payload of a probe datagram


@dataclass(frozen=True)
class Expectation(DelayExpectation):
    """A path's configured delay and loss."""

    loss: LossModel | None = None

    @property
    def loss_pct(self) -> float:
        return self.loss.expected_pct if self.loss else 0.0

    @classmethod
    def of(cls, impairment: Impairment | None) -> "Expectation":
        if impairment is None:
            return cls(0.0, 0.0)
        return cls(impairment.delay_ms, impairment.jitter_ms, loss=impairment.loss,
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
    # where the losses were: (first lost sequence number, run length); a run far longer than
    # the loss model's bursts points at the testbed (a stalled probe or engine), not the model
    lost_runs: list[tuple[int, int]] = field(default_factory=list)

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
          dst: str, sender: str, receiver: str, paths: int = 1,
          lost_runs: list[tuple[int, int]] | None = None) -> PathResult:
    """Compare one probe's measurements with what the configuration implies."""
    received = len(delays)
    loss_pct = 100.0 * (sent - received) / sent if sent else 100.0
    mean, sd, robust, mean_ok, sd_ok = judge_delays(exp, delays)
    lo, hi = loss_band(exp.loss, sent, tail=FAMILY_TAIL / max(1, paths))
    loss_ok = lo <= sent - received <= hi
    return PathResult(kind, src, dst, sender, receiver, exp.mean_ms, exp.sd_ms, exp.loss_pct,
                      sent, received, None if mean is None else round(mean, 3),
                      None if sd is None else round(sd, 3),
                      None if robust is None else round(robust, 3), round(loss_pct, 2), mean_ok,
                      sd_ok, loss_ok, reordered, list(lost_runs or []))


@dataclass(frozen=True)
class _Job:
    kind: str
    src: str
    dst: str
    sender: str
    receiver: str
    target_ip: str
    expectation: Expectation


def _spec(world: World, job: _Job, count: int, rate: float) -> ProbeSpec:
    """The probe of one path between two hosts of the world, waiting for stragglers as long as
    the configured delay could hold them."""
    exp = job.expectation
    return ProbeSpec(world.node(job.sender).ns_path, world.node(job.receiver).ns_path,
                     job.target_ip, count, rate, PROBE_BYTES,
                     1.0 + (exp.mean_ms + 6 * exp.sd_ms) / 1000)


def session_links(world: World, client_regions: list[str],
                  clusters: list[str]) -> list[ImpairedLink]:
    """The impaired directions a call from ``client_regions`` to ``clusters`` can cross: the
    clients' last miles (and the access links they may be handed over to), and the public
    internet and backbone between them and the clusters."""
    ends = {(c, k) for c in client_regions for k in clusters if c != k}
    ends |= {(k, c) for c, k in ends}
    return [link for link in world.links
            if (link.kind.startswith(("last_mile", "handover")) and link.src in client_regions)
            or (link.kind in ("public", "backbone") and (link.src, link.dst) in ends)]


def prepare_verdicts(links: list[ImpairedLink], count: int) -> None:
    """Simulate now the loss bands that judging ``links`` (and the unimpaired path) after
    ``count`` probes each will need (they are cached): a calibration at load then does not
    run that simulation, seconds of CPU for Gilbert-Elliott links, beside the calls."""
    paths = len(links) + 1
    for link in links:
        loss_band(Expectation.of(link.impairment).loss, count, tail=FAMILY_TAIL / paths)


def calibrate(world: World, count: int = 200, rate: float = 100.0, parallel: int = 4,
              progress: Callable[[int, int], None] | None = None,
              links: list[ImpairedLink] | None = None,
              in_child: bool = False) -> CalibrationReport:
    """Probe every impaired direction of the world, or only ``links``, and one unimpaired
    path, and judge each.

    ``progress(paths_done, paths_total)`` is called once with 0 before the first probe and
    then after each path is probed (``in_child``: once more, at the end). Probes run
    ``parallel`` at a time, in threads of this process or (``in_child``) of a child process
    (probeprocess.py: beside the calls); verdicts are computed after the last probe, so the
    loss bands' simulation never competes with a probe."""
    jobs = [_Job(link.kind, link.src, link.dst, link.sender, link.receiver, link.receiver_ip,
                 Expectation.of(link.impairment))
            for link in (world.links if links is None else links)]
    first = world.spec.regions[0]
    i = world.index[first]
    jobs.append(_Job("unimpaired", first, first, f"edge{i}", f"pub{i}", world.lan(i, 2, 1),
                     Expectation.of(None)))
    if progress is not None:
        progress(0, len(jobs))
    specs = [_spec(world, job, count, rate) for job in jobs]
    if in_child:
        probes = probe_in_child(specs, parallel)
        if progress is not None:
            progress(len(jobs), len(jobs))
    else:
        probes = run_probes(specs, parallel, progress)
    results = []
    for job, probe in zip(jobs, probes):
        results.append(judge(job.expectation, count, probe.first_delays_ms, probe.reordered,
                             job.kind, job.src, job.dst, job.sender, job.receiver,
                             paths=len(jobs), lost_runs=probe.lost_runs))
    return CalibrationReport(backend=world.backend.name, paths=results,
                             baseline_ms=results[-1].mean_ms)
