"""analysis/: statistics, E-model MOS, loading, plots, report and run comparison, on results
folders built here with the columns of a real run (no root, no network)."""
from __future__ import annotations

import argparse
import csv
import html
import json
import math
import pkgutil
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import plots
from analysis.cli import add_parser, run as cli_run
from analysis.compare import compare, verdict
from analysis.findings import findings
from analysis.load import FILES, ResultsError, load_results, parse_bursts
from analysis.mos import OPUS, EModel, burst_ratio, delay_impairment, \
    effective_equipment_impairment, mos_from_r
from analysis.report import write_report
from analysis.summary import finalize, summarise
from analysis.stats import ALL, Bootstrap, bootstrap_ci, bootstrap_diff_ci, compute_stats, \
    percentile, percentiles, thin_tail, wilson_interval, with_derived
from scenarios.runner import SAMPLE_FIELDS, SESSION_FIELDS
from voiceedge.errors import UserError

PNG = b"\x89PNG\r\n\x1a\n"
ARCHS = ("port-per-session", "cluster-relay", "global-relay")
# What the runner writes about them (docs/scenarios.md, architectures.json), by hand.
_PATH = ["client-{client}", "front-{client}", "impairment-engine", "transceiver-{cluster}",
         "agent-{cluster}"]
ARCHITECTURES_JSON = {"baseline": "port-per-session", "architectures": {
    "port-per-session": {"label": "one port per session", "colour": "#6b6b6b",
                         "role": "baseline", "path": _PATH, "media_link": "public",
                         "ports": "per-session", "fixed_ports_per_client_region": 0,
                         "turn": False, "external": False, "ingress": False,
                         "verifies": ["audio", "datachannel", "envelope"]},
    "cluster-relay": {"label": "cluster relay", "colour": "#0072B2", "role": "compared",
                      "path": _PATH + ["relay-{cluster}"], "media_link": "public",
                      "ports": "shared", "fixed_ports_per_client_region": 0, "turn": False,
                      "external": False, "ingress": False,
                      "verifies": ["audio", "datachannel", "envelope"]},
    "global-relay": {"label": "global relay", "colour": "#009E73", "role": "compared",
                     "path": _PATH + ["ingress-{client}", "relay-{cluster}"],
                     "media_link": "backbone", "ports": "shared",
                     "fixed_ports_per_client_region": 0, "turn": False, "external": False,
                     "ingress": True, "verifies": ["audio", "datachannel", "envelope"]}}}
# (client region, cluster, public media RTT, backbone media RTT, signaling RTT), ms
REGIONS = (("apac-se", "eu-west", 266.0, 190.0, 193.0), ("au", "na-east", 300.0, 220.0, 228.0))


def write_run(directory: Path, *, seed: int = 1, n: int = 40, setup_shift: dict | None = None,
              regions=REGIONS, same_paths: bool = False) -> Path:
    """A results folder shaped like scenarios/runner.py's: every file, every column.
    ``same_paths``: every architecture on the public path, no relay cost (equal runs)."""
    rng = np.random.default_rng(seed)
    setup_shift = setup_shift or {}
    directory.mkdir(parents=True)
    sessions, samples = [], []
    for arch in ARCHS:
        for region, cluster, public, backbone, signaling_rtt in regions:
            media = backbone if arch == "global-relay" and not same_paths else public
            relay_cost = 0.0 if arch == "port-per-session" or same_paths else 4.0
            for i in range(n):
                if i == n - 1 and arch == "cluster-relay":  # one failure per region
                    sessions.append({"architecture": arch, "client_region": region,
                                     "cluster_region": cluster, "session": i, "ok": False,
                                     "error": "setup timeout", "stage": "setup",
                                     "loss_bursts": "[]", "floor_setup_ms": signaling_rtt
                                     + 2 * media, "floor_media_rtt_ms": media,
                                     "floor_signaling_rtt_ms": signaling_rtt})
                    continue
                offer = rng.uniform(2, 6)
                signaling = signaling_rtt + rng.normal(20, 4)
                ice_rtt = media + relay_cost + abs(rng.normal(2, 1))
                ice_connected = offer + signaling + ice_rtt + rng.normal(10, 2)
                setup = (ice_connected + 1.5 * media + rng.normal(30, 6)
                         + setup_shift.get(arch, 0.0))
                rtt = media + relay_cost + rng.normal(1, 0.5)
                bursts = [int(b) for b in rng.choice([1, 1, 1, 2, 3], size=rng.integers(0, 4))]
                lost, received = sum(bursts), 290 - sum(bursts)
                sessions.append({
                    "architecture": arch, "client_region": region, "cluster_region": cluster,
                    "session": i, "ok": True, "error": "", "stage": "done",
                    "signaling_ms": round(signaling, 3), "offer_ms": round(offer, 3),
                    "first_ice_rtt_ms": round(ice_rtt, 3),
                    "ice_connected_ms": round(ice_connected, 3), "setup_ms": round(setup, 3),
                    "first_audio_ms": round(setup + rtt, 3), "rtt_ms": round(rtt, 3),
                    "jitter_ms": round(abs(rng.normal(2.5, 0.5)), 3),
                    "loss_pct": round(100 * lost / 290, 3), "packets_received": received,
                    "packets_lost": lost, "loss_bursts": json.dumps(bursts),
                    "echo_verified": True, "datachannel_verified": True,
                    "floor_signaling_rtt_ms": signaling_rtt, "floor_media_rtt_ms": media,
                    "floor_setup_ms": signaling_rtt + 2 * media})
                for k in range(1, 6):
                    samples.append({"architecture": arch, "client_region": region, "session": i,
                                    "t_ms": 1000.0 * k + setup, "packets_received": 50 * k,
                                    "packets_lost": 0, "jitter_ms": 2.5 + 0.1 * k,
                                    "rtt_ms": "" if k == 1 else rtt})
    with open(directory / "sessions.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SESSION_FIELDS)
        w.writeheader()
        w.writerows(sessions)
    with open(directory / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SAMPLE_FIELDS)
        w.writeheader()
        w.writerows(samples)
    total = n * len(regions)
    with open(directory / "ports.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["architecture", "concurrent_sessions", "public_udp_ports"])
        w.writerows([["port-per-session", total, total], ["cluster-relay", total, 2],
                     ["global-relay", total, len(regions)]])
    counters = {"packets_to_server": 100, "packets_to_client": 90, "flows_created": 3,
                "flows_recovered": 0, "drops_bad_ufrag": 0, "drops_no_route": 2}
    (directory / "relays.json").write_text(json.dumps(
        {"port-per-session": {}, "cluster-relay": {"relay-eu-west": counters},
         "global-relay": {"ingress-apac-se": counters}}))
    names = [r[0] for r in regions]
    (directory / "architectures.json").write_text(json.dumps(ARCHITECTURES_JSON))
    (directory / "config.json").write_text(json.dumps({
        "scenario": {"name": "default", "clusters": ["na-east", "eu-west"],
                     "sessions_per_region": n, "call_duration_s": 6.0, "start_rate": 3.0,
                     "architectures": list(ARCHS), "last_mile": "last_mile_broadband",
                     "profiles": {}},
        "client_regions": names, "clusters": ["na-east", "eu-west"], "backend": "userspace",
        "commit": "abc1234", "started": "2026-11-29T18:05:31+0000",
        "impairments": {"public apac-se->eu-west": {
            "delay_ms": 133.0, "jitter_ms": 2.0, "distribution": "normal", "reorder": True,
            "loss": {"p": 0.25, "r": 33.3, "bad_loss": 100.0, "good_loss": 0.0},
            "rate_mbit": None}}}))
    (directory / "calibration.json").write_text(json.dumps({
        "backend": "userspace", "ok": True, "baseline_ms": 0.09, "paths": [
            {"kind": "public", "src": "apac-se", "dst": "eu-west", "sender": "pub1",
             "receiver": "pub5", "expected_mean_ms": 133.0, "expected_sd_ms": 2.0,
             "expected_loss_pct": 0.7, "sent": 150, "received": 149, "mean_ms": 133.2,
             "sd_ms": 2.1, "loss_pct": 0.67, "reordered": 0, "ok": True}]}))
    (directory / "summary.json").write_text(json.dumps({"backend": "userspace"}))
    return directory


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("runs") / "default-apac-20260101-000000")


@pytest.fixture(scope="module")
def results(run_dir):
    return load_results(run_dir)


@pytest.fixture(scope="module")
def stats(results):
    return compute_stats(results)


# ------------------------------------------------------------------ statistics

def test_percentiles_of_1_to_100_are_numpy_linear_and_statistics_inclusive():
    values = np.arange(1, 101)
    assert percentiles(values, (50, 90, 95, 99)) == pytest.approx([50.5, 90.1, 95.05, 99.01])
    assert percentiles(values, (1, 5)) == pytest.approx([1.99, 5.95])
    inclusive = statistics.quantiles(values, n=100, method="inclusive")
    assert percentiles(values, (50, 95)) == pytest.approx([inclusive[49], inclusive[94]])


def test_percentiles_take_plain_lists_with_gaps_and_return_plain_floats():
    p50, p95 = percentiles([4.0, None, 1.0, float("nan"), 3.0, 2.0], (50, 95))
    assert (p50, p95) == (2.5, pytest.approx(3.85))
    assert type(p50) is float and type(p95) is float
    assert percentiles([], (50, 95)) == [None, None]
    assert percentiles([None, float("nan")], (50,)) == [None]
    assert percentiles([7.0], (50, 95)) == [7.0, 7.0]
    assert percentiles([1.0, 2.0, 4.0], (50, 95), ndigits=1) == [2.0, 3.8]
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 50) is None


def test_bootstrap_ci_contains_the_true_median_and_is_reproducible():
    sample = np.random.default_rng(3).normal(100.0, 15.0, 400)
    lo, hi = bootstrap_ci(sample, (50,))
    assert lo[0] < 100.0 < hi[0]
    assert lo[0] < np.median(sample) < hi[0]
    assert hi[0] - lo[0] < 6  # ~ 2 x 1.96 x 1.25 x 15 / sqrt(400) = 3.7
    again = bootstrap_ci(sample, (50,))
    assert (lo, hi) == (again[0], again[1])


def test_bootstrap_ci_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(11)
    boot = Bootstrap(resamples=400)
    covered = 0
    for _ in range(200):
        lo, hi = bootstrap_ci(rng.normal(0.0, 1.0, 60), (50,), boot)
        covered += lo[0] <= 0.0 <= hi[0]
    assert 0.88 <= covered / 200 <= 0.995


def test_stratified_bootstrap_keeps_each_region_s_share():
    values = [0.0] * 5 + [10.0] * 5
    regions = ["a"] * 5 + ["b"] * 5
    lo, hi = bootstrap_ci(values, (50,), strata=regions)
    assert lo[0] == hi[0] == 5.0
    lo, hi = bootstrap_ci(values, (50,))
    assert lo[0] == 0.0 and hi[0] == 10.0


def test_bootstrap_diff_ci_of_a_known_shift():
    rng = np.random.default_rng(4)
    b = rng.normal(100.0, 5.0, 60)
    a = rng.normal(100.0, 5.0, 60) + 10.0
    d = bootstrap_diff_ci(a, b)
    assert d.estimate == pytest.approx(np.median(a) - np.median(b))
    # SE of a difference of medians ~ 1.25 x 5 x sqrt(2 / 60) = 1.1 ms: the 95% CI is ~ +-2.2
    assert d.significant and 5.0 < d.lo < 10.0 < d.hi < 15.0
    assert bootstrap_diff_ci(a, b) == d  # one seed: reproducible
    same = bootstrap_diff_ci(b, rng.normal(100.0, 5.0, 60))
    assert same.lo < 0 < same.hi and not same.significant
    empty = bootstrap_diff_ci([], b)
    assert math.isnan(empty.estimate) and not empty.significant


def test_bootstrap_diff_ci_flags_about_5_percent_of_equal_pairs():
    rng = np.random.default_rng(8)
    boot = Bootstrap(resamples=400)
    regions = ["a"] * 15 + ["b"] * 15
    flagged = 0
    for _ in range(200):
        a = rng.normal(0.0, 1.0, 30) + np.repeat([0.0, 30.0], 15)  # two regions 30 apart
        b = rng.normal(0.0, 1.0, 30) + np.repeat([0.0, 30.0], 15)
        flagged += bootstrap_diff_ci(a, b, 50, boot, regions, regions).significant
    assert 0.01 <= flagged / 200 <= 0.10


def test_bootstrap_diff_ci_compares_within_strata():
    a = [10.0, 11.0, 12.0, 110.0, 111.0, 112.0]  # regions x and y, 100 ms apart
    b = [20.0, 21.0, 22.0, 120.0, 121.0, 122.0]
    strata = ["x"] * 3 + ["y"] * 3
    d = bootstrap_diff_ci(a, b, 50, Bootstrap(), strata, strata)
    assert d.estimate == -10.0 and d.hi < 0
    # Only the strata both groups have count: y's sessions of b have no counterpart in a.
    d = bootstrap_diff_ci(a[:3], b, 50, Bootstrap(), strata[:3], strata)
    assert d.estimate == -10.0


def test_thin_tail_rule():
    assert not thin_tail(7, 50)
    assert thin_tail(199, 95) and not thin_tail(200, 95)
    assert thin_tail(999, 99) and not thin_tail(1000, 99)
    assert thin_tail(199, 5) and not thin_tail(200, 5)


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(8, 10)
    assert (lo, hi) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def test_success_rate_and_metrics_count_only_successful_sessions(stats):
    s = stats.success_row("cluster-relay")
    assert (s.sessions, s.ok) == (80, 78)
    assert s.success_pct == pytest.approx(97.5)
    assert s.success_lo < 97.5 < s.success_hi
    assert stats.success_row("port-per-session").success_pct == 100.0
    assert stats.row("cluster-relay", "setup_ms").n == 78
    assert stats.row("cluster-relay", "setup_ms", "au").n == 39
    assert set(stats.metrics.client_region) == {ALL, "apac-se", "au"}


def test_overhead_above_floor_and_burst_lengths(results, stats):
    derived = with_derived(results.sessions)
    ok = derived[derived.ok]
    assert np.allclose(ok.setup_over_floor_ms, ok.setup_ms - ok.floor_setup_ms)
    assert np.allclose(ok.first_ice_rtt_over_floor_ms, ok.first_ice_rtt_ms - ok.floor_media_rtt_ms)
    bursts = [b for bs in ok[ok.architecture == "global-relay"].loss_bursts for b in bs]
    row = stats.row("global-relay", "loss_burst_len")
    assert row.n == len(bursts)
    assert row.p50 == pytest.approx(np.percentile(bursts, 50))
    assert stats.row("global-relay", "first_ice_rtt_over_floor_ms").p50 > 0


# ------------------------------------------------------------------ E-model

@pytest.mark.parametrize("r, mos", [(93.2, 4.41), (90, 4.34), (80, 4.03), (70, 3.60),
                                    (60, 3.10), (50, 2.58)])
def test_mos_of_published_r_values(r, mos):
    # G.107 Annex B, Table B.1 (lower limits of the user-satisfaction classes) lists the
    # cubic's values rounded up to two decimals (R = 80 -> 4.024 -> 4.03).
    assert math.ceil(round(mos_from_r(r) * 100, 6)) / 100 == mos
    assert mos_from_r(r) == pytest.approx(mos, abs=0.01)


def test_mos_limits():
    assert mos_from_r(-5) == 1.0
    assert mos_from_r(0) == 1.0
    assert mos_from_r(100) == 4.5
    assert mos_from_r(120) == 4.5
    assert 1.0 <= mos_from_r(3) < 1.2


@pytest.mark.parametrize("d, expected", [(0, 0.0), (100, 2.4), (177.3, 4.2552), (300, 20.697)])
def test_delay_impairment_knee_at_177_3_ms(d, expected):
    assert delay_impairment(d) == pytest.approx(expected, abs=1e-3)


def test_effective_equipment_impairment_and_burst_ratio():
    assert effective_equipment_impairment(OPUS, 0.0) == OPUS.ie
    assert effective_equipment_impairment(OPUS, 1.0) == pytest.approx(95 / 26.1)
    assert (effective_equipment_impairment(OPUS, 2.0, burst_r=3.0)
            > effective_equipment_impairment(OPUS, 2.0, burst_r=1.0))
    assert burst_ratio(990, 10, [1] * 10) == 1.0  # isolated losses: random
    assert burst_ratio(990, 10, [5, 5]) == pytest.approx(1 / (2 / 990 + 2 / 10))
    assert burst_ratio(300, 0, []) == 1.0
    with pytest.raises(ValueError):
        effective_equipment_impairment(OPUS, -1.0)


def test_session_mos_from_rtt_jitter_and_loss():
    model = EModel()
    assert model.one_way_delay(200.0, 5.0) == 130.0  # 100 + 2 x 5 + 20
    # By hand from G.107's defaults (R0 - Is = 93.2) and Opus as analysis/mos.py takes it
    # (Ie = 0, Bpl = 25.1): d = 20 ms, R = 93.2 - 0.48 = 92.72
    assert model.mos(0.0, 0.0, 0.0) == pytest.approx(4.3998023665)
    # d = 150 + 6 + 20 = 176 ms (below the knee): Id = 4.224, R = 88.976
    assert model.mos(300, 3, 0.0) == pytest.approx(4.3131121127)
    # d = 326 ms: Id = 7.824 + 0.11 x 148.7 = 24.181; 3% loss in bursts (BurstR 2):
    # Ie_eff = 95 x 3 / (3/2 + 25.1) = 10.714286; R = 58.304714
    assert model.mos(600, 3, 3.0, burst_r=2.0) == pytest.approx(3.0118159466)
    assert model.mos(300, 3, 0.0) > model.mos(600, 3, 0.0) > model.mos(600, 3, 3.0)


# ------------------------------------------------------------------ loading

def test_parse_bursts():
    assert parse_bursts("[1, 2, 1]") == [1, 2, 1]
    assert parse_bursts("[]") == []
    assert parse_bursts(float("nan")) == []
    assert parse_bursts("") == []
    for bad in ("[0]", "oops", '{"a": 1}', "[1.5]"):
        with pytest.raises(ValueError):
            parse_bursts(bad)


def test_load_reads_every_file(results):
    assert results.architectures == list(ARCHS)
    assert results.client_regions == ["apac-se", "au"]
    assert results.sessions.ok.dtype == bool
    assert results.sessions.loss_bursts.map(type).eq(list).all()
    assert results.config["backend"] == "userspace" and results.calibration["ok"]
    assert len(results.ports) == 3 and "cluster-relay" in results.relays


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_clear_error_for_folders_that_are_not_results(tmp_path, run_dir):
    with pytest.raises(ResultsError) as exc:
        load_results(tmp_path)
    assert "not a results folder" in _one_line(exc)
    with pytest.raises(ResultsError) as exc:
        load_results(tmp_path / "nope")
    assert "not a directory" in _one_line(exc)
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("config.json", "calibration.json"):
        (partial / name).write_text((run_dir / name).read_text())
    with pytest.raises(ResultsError) as exc:
        load_results(partial)
    assert "sessions.csv" in _one_line(exc) and "calibration failed" in str(exc.value)


def test_clear_error_for_a_missing_column_or_bad_bursts(tmp_path, run_dir):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in FILES:
        (bad / name).write_text((run_dir / name).read_text())
    frame = pd.read_csv(run_dir / "sessions.csv")
    frame.drop(columns=["setup_ms"]).to_csv(bad / "sessions.csv", index=False)
    with pytest.raises(ResultsError) as exc:
        load_results(bad)
    assert "setup_ms" in _one_line(exc)
    frame.loc[3, "loss_bursts"] = "[1, -2]"
    frame.to_csv(bad / "sessions.csv", index=False)
    with pytest.raises(ResultsError) as exc:
        load_results(bad)
    assert "row 4" in _one_line(exc)


# ------------------------------------------------------------------ plots

def _png(path: Path) -> None:
    assert path.is_file() and path.suffix == ".png"
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 10_000


@pytest.mark.parametrize("draw", [
    lambda r, s, d: plots.plot_cdf(r, "setup_ms", d, s),
    lambda r, s, d: plots.plot_cdf(r, "first_ice_rtt_ms", d, s),
    lambda r, s, d: plots.plot_setup_timeline(r, d, s),
    lambda r, s, d: plots.plot_media_timeseries(r, d),
    lambda r, s, d: plots.plot_loss_mos(r, d, s),
    lambda r, s, d: plots.plot_ports(r, d),
    lambda r, s, d: plots.plot_region_matrix(r, d, s),
], ids=["cdf_setup", "cdf_ice", "timeline", "media", "loss_mos", "ports", "regions"])
def test_each_plot_writes_a_png(draw, results, stats, tmp_path):
    path = draw(results, stats, tmp_path / "plots")
    assert path.parent == tmp_path / "plots"
    _png(path)


def test_setup_phases_add_up_to_first_audio(results):
    ok = results.sessions[results.sessions.ok]
    phases = plots.setup_phases(ok)
    assert np.allclose(phases.sum(axis=1), ok.first_audio_ms)
    assert (phases.iloc[:, 2] > 0).all()  # ICE after the answer


def test_architecture_colours_are_the_runs_and_distinct(results, tmp_path):
    # the colours architectures.json gives; a spare one for an architecture it does not name
    assert [results.colour(a) for a in ARCHS] == ["#6b6b6b", "#0072B2", "#009E73"]
    facts = results.archinfo
    colours = [facts.colour(a, list(ARCHS) + ["other", "another"])
               for a in ARCHS + ("other", "another")]
    assert len(set(colours)) == len(colours)
    assert results.baseline == "port-per-session"
    assert facts["global-relay"].media_link == "backbone" and facts["global-relay"].ingress
    assert facts["port-per-session"].per_session_ports
    assert not facts["cluster-relay"].per_session_ports
    # a folder written before architectures.json: names and baseline from its config.json,
    # no facts the analysis would have to know from code (spare colours, defaults)
    old = write_run(tmp_path / "old", n=4)
    (old / "architectures.json").unlink()
    config = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps(config | {"baseline": "cluster-relay"}))
    legacy = load_results(old)
    assert legacy.baseline == "cluster-relay"
    assert [legacy.colour(a) for a in ARCHS] == ["#D55E00", "#E69F00", "#56B4E9"]
    assert legacy.archinfo["cluster-relay"].role == "baseline"
    assert legacy.archinfo["global-relay"].media_link == "public"
    assert not legacy.archinfo["global-relay"].ingress


def test_a_folder_that_recorded_no_baseline_takes_its_first_architecture(tmp_path):
    from analysis import archinfo

    # no name from the code: whatever the folder lists first is the baseline
    facts = archinfo.legacy({"architectures": ["my-edge", "cluster-relay"]})
    assert facts.baseline == "my-edge" and facts["my-edge"].role == "baseline"
    (tmp_path / "architectures.json").write_text(json.dumps({"architectures": {
        "cluster-relay": {"role": "compared"}, "my-edge": {"role": "baseline"}}}))
    assert archinfo.read(tmp_path).baseline == "my-edge"
    assert archinfo.legacy({}).baseline == ""


def test_single_region_run_has_no_region_matrix(tmp_path):
    one = load_results(write_run(tmp_path / "one", n=12, regions=REGIONS[:1]))
    written = plots.write_plots(one, tmp_path / "plots")
    assert "region_matrix" not in written and len(written) == 6
    for path in written.values():
        _png(path)


# ------------------------------------------------------------------ report and compare

def test_report_is_self_contained(run_dir, tmp_path):
    html_path, md_path = write_report(run_dir, tmp_path / "report")
    page = html_path.read_text()
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", page, flags=re.I)
    assert refs and all(r.startswith(("data:", "#")) for r in refs)
    assert page.count("data:image/png;base64,") == 7
    assert "<link" not in page and "<script" not in page and "@import" not in page
    for text in ("userspace", "calibration", "abc1234", "sessions per region", "setup timeout"):
        assert text in page
    md = md_path.read_text()
    assert "| cluster-relay | 78/80 |" in md
    assert "plots/cdf_setup_ms.png" in md
    for name in ("cdf_setup_ms", "setup_timeline", "ports", "region_matrix"):
        _png(tmp_path / "report" / "plots" / f"{name}.png")


def test_verdict_needs_disjoint_intervals():
    assert verdict(10, 12, 13, 15) == "regression"
    assert verdict(10, 12, 13, 15, higher_is_better=True) == "improvement"
    assert verdict(10, 12, 5, 9) == "improvement"
    assert verdict(10, 12, 11, 15) == ""
    assert verdict(10, 12, float("nan"), 15) == ""


def test_compare_flags_a_setup_regression(tmp_path, run_dir):
    slower = write_run(tmp_path / "slower", setup_shift={"cluster-relay": 30.0})
    text = compare(run_dir, slower)
    flagged = [line for line in text.splitlines() if line.startswith("- REGRESSION")]
    assert any("cluster-relay setup (ms) p50" in line for line in flagged), text
    assert not any("port-per-session" in line or "global-relay" in line for line in flagged)
    assert "IMPROVEMENT" not in text


def test_compare_does_not_flag_an_unchanged_run(tmp_path, run_dir):
    again = write_run(tmp_path / "again", seed=2)  # same world, other random draws
    text = compare(run_dir, again)
    assert "**No change**" in text, text
    assert "REGRESSION" not in text and "IMPROVEMENT" not in text


def test_compare_names_configuration_differences(tmp_path, run_dir):
    other = write_run(tmp_path / "other", seed=2)
    config = json.loads((other / "config.json").read_text())
    config["backend"] = "netem"
    (other / "config.json").write_text(json.dumps(config))
    assert "backend: userspace -> netem" in compare(run_dir, other)


# ------------------------------------------------------------------ command line

def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["report", *argv])


def test_cli_report_and_compare(run_dir, tmp_path, capsys):
    assert cli_run(_args(str(run_dir), "--out", str(tmp_path / "r"), "--resamples", "200")) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "r" / "report.html"), str(tmp_path / "r" / "report.md")]
    assert cli_run(_args("--compare", str(run_dir), str(run_dir), "--resamples", "200")) == 0
    assert "No change" in capsys.readouterr().out


def test_cli_user_errors(tmp_path):
    with pytest.raises(UserError, match="not a results folder"):
        cli_run(_args(str(tmp_path)))
    with pytest.raises(UserError, match="either RESULTS_DIR or --compare"):
        cli_run(_args())
    with pytest.raises(UserError, match="either"):
        cli_run(_args(str(tmp_path), "--compare", str(tmp_path), str(tmp_path)))


def _strict_json(text: str):
    """JSON as any parser reads it: no NaN or Infinity (Python's json would accept them)."""
    def refuse(constant):
        raise AssertionError(f"{constant} in the JSON output")
    return json.loads(text, parse_constant=refuse)


def test_cli_json_output_parses(run_dir, tmp_path, capsys):
    assert cli_run(_args(str(run_dir), "--out", str(tmp_path / "r"), "--resamples", "200",
                         "--json")) == 0
    doc = _strict_json(capsys.readouterr().out)  # stdout is the JSON and nothing else
    assert doc["report"]["html"] == str(tmp_path / "r" / "report.html")
    assert doc["complete"] and list(doc["summary"]["architectures"]) == list(ARCHS)
    faster = [f for f in doc["findings"] if f["architecture"] == "global-relay"
              and f["metric"] == "first_ice_rtt_ms"]
    assert faster[0]["significant"] and faster[0]["direction"] == "faster"
    slower = write_run(tmp_path / "slower", setup_shift={"cluster-relay": 30.0})
    assert cli_run(_args("--compare", str(run_dir), str(slower), "--resamples", "200",
                         "--json")) == 0
    doc = _strict_json(capsys.readouterr().out)
    assert {(c["architecture"], c["metric"], c["verdict"]) for c in doc["changes"]} >= {
        ("cluster-relay", "setup_ms", "regression")}
    assert all(c["architecture"] == "cluster-relay" for c in doc["changes"])
    assert doc["statistics"] and doc["only_in_one_run"] == []


# ------------------------------------------------------------------ summary and finalize

def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _ok(rows: list[dict], arch: str, region: str | None = None) -> list[dict]:
    return [r for r in rows if r["architecture"] == arch and r["ok"] == "True"
            and region in (None, r["client_region"])]


def test_summarise_reads_the_folder_and_matches_plain_statistics(run_dir):
    summary = summarise(run_dir, Bootstrap(resamples=500))
    rows = _rows(run_dir / "sessions.csv")
    c = summary["architectures"]["cluster-relay"]
    assert (c["sessions"], c["ok"], c["success_pct"]) == (80, 78, 97.5)
    assert c["success_ci"][0] < 97.5 < c["success_ci"][1] <= 100
    setup = [float(r["setup_ms"]) for r in _ok(rows, "cluster-relay")]
    assert c["setup_ms"]["p50"] == pytest.approx(statistics.median(setup), abs=0.01)
    inclusive = statistics.quantiles(setup, n=100, method="inclusive")
    assert c["setup_ms"]["p95"] == pytest.approx(inclusive[94], abs=0.01)
    assert c["setup_ms"]["p50_ci"][0] < c["setup_ms"]["p50"] < c["setup_ms"]["p50_ci"][1]
    over = [float(r["setup_ms"]) - float(r["floor_setup_ms"]) for r in _ok(rows, "cluster-relay")]
    assert c["setup_over_floor_ms"]["p50"] == pytest.approx(statistics.median(over), abs=0.01)
    assert c["floor_setup_ms_p50"] == pytest.approx(statistics.median(
        float(r["floor_setup_ms"]) for r in _ok(rows, "cluster-relay")), abs=0.01)
    assert (c["public_udp_ports"], c["peak_sessions"]) == (2, 80)

    def ice_in(arch: str, region: str) -> list[float]:
        return [float(r["first_ice_rtt_ms"]) for r in _ok(rows, arch, region)]

    g = summary["architectures"]["global-relay"]
    # The difference within each client region, weighted by the region's sessions.
    weighted = [(len(ice_in("global-relay", r)) + len(ice_in("port-per-session", r)),
                 statistics.median(ice_in("global-relay", r))
                 - statistics.median(ice_in("port-per-session", r))) for r in ("apac-se", "au")]
    diff = sum(w * d for w, d in weighted) / sum(w for w, _ in weighted)
    assert diff < -50  # the synthetic backbone path is 76-80 ms shorter
    assert g["vs_baseline_p50"]["first_ice_rtt_ms"] == pytest.approx(diff, abs=0.01)
    lo, hi = g["vs_baseline_p50_ci"]["first_ice_rtt_ms"]
    assert lo < diff < hi < 0
    assert summary["architectures"]["port-per-session"]["vs_baseline_p50"]["setup_ms"] == 0
    assert summary["baseline"] == "port-per-session" and summary["complete"]
    assert summary["missing"] == {"architectures": [], "files": []}
    assert summary["calibration_ok"] and summary["backend"] == "userspace"
    assert summary["client_regions"] == ["apac-se", "au"]
    json.dumps(summary, allow_nan=False)


def test_finalize_writes_stats_summary_and_a_mos_column(tmp_path):
    directory = write_run(tmp_path / "run", n=12)
    frame = pd.read_csv(directory / "sessions.csv")
    frame.insert(14, "some_new_column_ms", 41.5)  # a column the analysis does not read
    frame.to_csv(directory / "sessions.csv", index=False)
    before = _rows(directory / "sessions.csv")
    (directory / "timings.json").write_text(json.dumps({
        "total_s": 80.0, "architectures": {"cluster-relay": 21.5}}))

    summary = finalize(directory, Bootstrap(resamples=300))
    assert json.loads((directory / "summary.json").read_text()) == summary
    assert summary["architectures"]["cluster-relay"]["seconds"] == 21.5
    assert summary["architectures"]["global-relay"]["seconds"] is None
    assert summary["timings"]["total_s"] == 80.0
    rows = _rows(directory / "sessions.csv")
    assert list(rows[0]) == list(before[0]) + ["mos"]
    assert [{k: r[k] for k in before[0]} for r in rows] == before  # every other cell as it was
    # A lossless session's MOS by hand (docs/analysis.md): d = RTT/2 + 2 jitter + 20 ms.
    r = next(r for r in rows if r["ok"] == "True" and float(r["packets_lost"]) == 0)
    d = float(r["rtt_ms"]) / 2 + 2 * float(r["jitter_ms"]) + 20
    big_r = 93.2 - 0.024 * d - (0.11 * (d - 177.3) if d > 177.3 else 0.0)
    mos = 1 + 0.035 * big_r + big_r * (big_r - 60) * (100 - big_r) * 7e-6
    assert float(r["mos"]) == pytest.approx(mos, abs=1e-3)
    failed = [r for r in rows if r["ok"] == "False"]
    assert failed and all(r["mos"] == "" for r in failed)
    finalize(directory, Bootstrap(resamples=300))  # after each architecture: same file again
    assert _rows(directory / "sessions.csv") == rows

    stats = _rows(directory / "stats.csv")
    keys = {(s["architecture"], s["client_region"], s["metric"], s["statistic"]) for s in stats}
    for arch in ARCHS:
        for region in (ALL, "apac-se", "au"):
            assert (arch, region, "success_pct", "rate") in keys
            for metric in ("setup_ms", "first_ice_rtt_over_floor_ms", "mos"):
                for q in (1, 50, 95, 99):
                    assert (arch, region, metric, f"p{q}") in keys
    assert ("global-relay", ALL, "first_ice_rtt_ms", "p50 - port-per-session p50") in keys

    def stat(*key) -> dict:
        return next(s for s in stats
                    if (s["architecture"], s["client_region"], s["metric"], s["statistic"]) == key)

    p50 = stat("cluster-relay", "au", "setup_ms", "p50")
    au = [float(r["setup_ms"]) for r in _ok(rows, "cluster-relay", "au")]
    assert float(p50["value"]) == pytest.approx(statistics.median(au), abs=1e-3)
    assert int(p50["n"]) == 11
    assert float(p50["ci_lo"]) <= float(p50["value"]) <= float(p50["ci_hi"])
    success = stat("cluster-relay", ALL, "success_pct", "rate")
    assert float(success["value"]) == pytest.approx(100 * 22 / 24)
    assert float(success["ci_lo"]) < float(success["value"]) < float(success["ci_hi"])
    assert stat("cluster-relay", ALL, "setup_ms", "p95")["thin_tail"] == "True"
    doc = json.loads((directory / "stats.json").read_text())
    assert len(doc["rows"]) == len(stats) and doc["bootstrap"]["resamples"] == 300
    assert doc["baseline"] == "port-per-session"


def _partial(tmp_path: Path) -> Path:
    """A run interrupted during global-relay: its sessions and some files are missing."""
    directory = write_run(tmp_path / "partial", n=10)
    frame = pd.read_csv(directory / "sessions.csv")
    frame[frame.architecture != "global-relay"].to_csv(directory / "sessions.csv", index=False)
    for name in ("samples.csv", "relays.json", "summary.json"):
        (directory / name).unlink()
    return directory


def test_finalize_and_report_a_partial_folder(tmp_path, capsys):
    directory = _partial(tmp_path)
    summary = finalize(directory, Bootstrap(resamples=200))
    assert list(summary["architectures"]) == ["port-per-session", "cluster-relay"]
    assert summary["missing"] == {"architectures": ["global-relay"],
                                  "files": ["samples.csv", "relays.json"]}
    assert not summary["complete"]
    assert (directory / "stats.csv").is_file() and (directory / "summary.json").is_file()
    assert cli_run(_args(str(directory), "--resamples", "200")) == 0
    out = capsys.readouterr()
    assert "incomplete run" in out.err and "global-relay" in out.err
    assert "samples.csv" in out.err and out.out.split()[0].endswith("report.html")
    page = (directory / "report.html").read_text()
    warning = page[page.index("<div class='warn'>"):]
    warning = warning[:warning.index("</div>")]
    assert "Incomplete run" in warning and "global-relay" in warning and "samples.csv" in warning
    assert "<h3>cluster-relay</h3>" in page  # what was measured is still reported


def test_finalize_before_the_first_architecture_finished(tmp_path, run_dir):
    directory = tmp_path / "early"
    directory.mkdir()
    for name in ("config.json", "calibration.json"):
        (directory / name).write_text((run_dir / name).read_text())
    summary = finalize(directory)
    assert summary["architectures"] == {}
    assert summary["missing"]["architectures"] == list(ARCHS)
    assert "sessions.csv" in summary["missing"]["files"]
    with pytest.raises(ResultsError, match="sessions.csv"):
        load_results(directory)  # a report needs sessions


def test_the_baseline_comes_from_architectures_json_or_config_json(tmp_path):
    directory = write_run(tmp_path / "run", n=10)
    facts = json.loads((directory / "architectures.json").read_text())
    (directory / "architectures.json").write_text(json.dumps(facts | {
        "baseline": "global-relay"}))
    assert summarise(directory, Bootstrap(resamples=200))["baseline"] == "global-relay"
    (directory / "architectures.json").unlink()  # older runners wrote none
    config = json.loads((directory / "config.json").read_text())
    assert "baseline" not in config  # a folder of an older runner: port-per-session
    assert summarise(directory, Bootstrap(resamples=200))["baseline"] == "port-per-session"
    config["baseline"] = "cluster-relay"
    (directory / "config.json").write_text(json.dumps(config))
    summary = summarise(directory, Bootstrap(resamples=200))
    assert summary["baseline"] == "cluster-relay"
    assert summary["architectures"]["cluster-relay"]["vs_baseline_p50"]["setup_ms"] == 0
    assert summary["architectures"]["port-per-session"]["vs_baseline_p50"]["setup_ms"] != 0


# The analysis reads results folders only: it imports nothing of the packages that write them.
# Within those packages, the leaf modules both sides share (each imports nothing of the project
# but the packages it is in): the error types, the names a results folder's writers and readers
# agree on, the rule a measured delay is judged by, the wire formats the captures are decoded
# with.
FORBIDDEN = ("scenarios", "topology", "services", "bench", "voiceedge")
# The budgets gate (analysis/budgets_cli.py) runs its scenarios as child commands, with the
# stop mechanism every command shares: stopsignals, reaper and its watchdog (standard library).
SHARED_LEAVES = ("voiceedge", "voiceedge.errors", "voiceedge.results", "voiceedge.delayrule",
                 "voiceedge.stopsignals", "voiceedge.reaper", "voiceedge.watchdog",
                 "services", "services.wire")
_ROOT = Path(__file__).resolve().parent.parent


def _shared(module: str) -> bool:
    return module in SHARED_LEAVES or module.startswith("services.wire.")


def _project_modules_after(code: str) -> list[str]:
    """The project's modules (``FORBIDDEN`` packages, ``analysis``) loaded by running ``code``
    in a fresh interpreter."""
    probe = (f"import sys\n{code}\n"
             f"print('\\n'.join(m for m in sys.modules if m.split('.')[0] in "
             f"{FORBIDDEN + ('analysis',)!r}))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=_ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sorted(proc.stdout.split())


def test_analysis_never_imports_scenarios_or_the_cli():
    """Every analysis module (analysis.pcap too, found by walking the package) imported, no
    module of scenarios/, topology/, services/, bench/ or voiceedge.cli is loaded."""
    loaded = _project_modules_after(
        "import analysis, pkgutil, importlib\n"
        "names = [m.name for m in pkgutil.walk_packages(analysis.__path__, 'analysis.')]\n"
        "assert 'analysis.pcap.hops' in names and 'analysis.report' in names, names\n"
        "for name in names: importlib.import_module(name)")
    assert "analysis.pcap.hops" in loaded and "analysis.sweepplots" in loaded
    bad = [m for m in loaded if m.split(".")[0] in FORBIDDEN and not _shared(m)]
    assert not bad, f"analysis imports {bad}"


@pytest.mark.parametrize("leaf", [m for m in SHARED_LEAVES if "." in m] + [
    m.name for m in pkgutil.iter_modules([str(_ROOT / "services" / "wire")], "services.wire.")])
def test_the_shared_leaves_import_nothing_of_the_project(leaf):
    """What the guard above lets analysis import stays a leaf: it loads nothing of the project
    but itself, the packages it is in and other shared leaves."""
    loaded = _project_modules_after(f"import {leaf}")
    assert leaf in loaded
    others = [m for m in loaded
              if m != leaf and not leaf.startswith(m + ".") and not _shared(m)]
    assert not others, f"{leaf} imports {others}"


# ------------------------------------------------------------------ the report in words

def _findings_of(page: str, arch: str) -> str:
    """The findings list of one architecture in report.html."""
    start = page.index("<h2 id='findings'>")
    block = page[page.index(f"<h3>{arch}</h3>", start):]
    return html.unescape(block[:block.index("</ul>")])


@pytest.fixture(scope="module")
def report_500(run_dir, tmp_path_factory) -> tuple[Path, Path]:
    """The report of ``run_dir`` with 500 resamples, rendered once for the tests that only read
    it (rendering is ~2.5 s: the plots and the bootstrap)."""
    return write_report(run_dir, tmp_path_factory.mktemp("report-500"), Bootstrap(resamples=500))


def test_the_report_says_in_words_what_is_faster(report_500):
    html_path, md_path = report_500
    page = html_path.read_text()
    assert page.index("What this run says") < page.index("Summary per architecture")
    words = _findings_of(page, "global-relay")
    assert re.search(r"First ICE RTT is \d+ ms faster than with port-per-session \(difference "
                     r"of medians; 95% CI \d+ to \d+ ms faster\)", words), words
    # The relay's 4 ms, against 80 sessions' spread of ~1 ms, is a significant difference.
    assert re.search(r"First ICE RTT is [\d.]+ ms slower than with port-per-session",
                     _findings_of(page, "cluster-relay"))
    assert "First ICE RTT is" in md_path.read_text()


def test_equal_architectures_make_no_significant_difference(tmp_path):
    directory = write_run(tmp_path / "equal", n=20)
    frame = pd.read_csv(directory / "sessions.csv")
    base = frame[frame.architecture == "port-per-session"]
    frame = pd.concat([base.assign(architecture=arch) for arch in ARCHS])  # the same sessions
    frame.to_csv(directory / "sessions.csv", index=False)
    results = load_results(directory)
    found = findings(results, compute_stats(results, Bootstrap(resamples=500)))
    assert len(found) == 2 * 6
    for f in found:
        assert f.difference.estimate == 0 and not f.significant, f.sentence()
        assert "no significant difference from port-per-session" in f.sentence()


def test_tables_scroll_inside_themselves(report_500):
    # The shared report (500 resamples; this test rendered its own with 200): the resamples
    # change the numbers in the cells, not which tables there are (18 either way).
    page = report_500[0].read_text()
    assert ".scroll{overflow-x:auto" in page
    assert page.count("<table") == page.count('<div class="scroll"><table') > 5


def test_saturated_sessions_are_counted_and_left_out_of_every_statistic(tmp_path):
    """A run whose global-relay sessions 0-9 per region were measured while a process on their
    path lagged (scenarios/saturation.py): their setup is 5 s slower. The statistics must not
    see them, the success rate must, and the report must say the host was saturated."""
    from analysis.findings import saturation
    from analysis.summary import summarise

    directory = write_run(tmp_path / "run", seed=7)
    rows = list(csv.DictReader(open(directory / "sessions.csv")))
    for r in rows:
        hit = r["architecture"] == "global-relay" and int(r["session"]) < 10
        r["saturated"] = str(hit)
        r["saturated_by"] = "transceiver-na-east 180 ms" if hit else ""
        if hit:
            r["setup_ms"] = str(float(r["setup_ms"]) + 5000)
    with open(directory / "sessions.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    results = load_results(directory)
    stats = compute_stats(results)
    n_regions = len(results.client_regions)
    success = stats.success_row("global-relay")
    assert (success.ok, success.saturated) == (40 * n_regions, 10 * n_regions)
    setup = stats.row("global-relay", "setup_ms")
    assert setup.n == 30 * n_regions and setup.p99 < 2000  # none of the +5 s sessions
    warning = saturation(stats)
    assert warning.startswith("Host saturated") and f"global-relay: {10 * n_regions} of" in warning
    assert summarise(directory)["architectures"]["global-relay"]["saturated"] == 10 * n_regions
    assert saturation(compute_stats(load_results(write_run(tmp_path / "clean", seed=7)))) == ""


def test_a_run_saturated_throughout_compares_nothing(tmp_path):
    from analysis.findings import lead

    directory = write_run(tmp_path / "run", seed=7)
    frame = pd.read_csv(directory / "sessions.csv")
    frame["saturated"], frame["saturated_by"] = True, "client-apac-se 40 ms"
    frame.to_csv(directory / "sessions.csv", index=False)
    results = load_results(directory)
    stats = compute_stats(results, Bootstrap(resamples=200))
    assert findings(results, stats) == []
    assert lead(results, stats).startswith("Host saturated: every successful session")
    # one session measured while the host kept up is enough to compare again
    frame.loc[0, "saturated"] = False
    frame.to_csv(directory / "sessions.csv", index=False)
    results = load_results(directory)
    assert not lead(results, compute_stats(results, Bootstrap(resamples=200))).startswith(
        "Host saturated")


# ------------------------------------------------------------------ steering


def _timeline(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps({"ts": f"2026-11-30T10:00:{i:02d}.000000Z",
                                        "level": "INFO", "service": "signaling", **r}) + "\n"
                            for i, r in enumerate(records)))
    return path


def test_steering_rows_come_from_the_fronts_log_lines(tmp_path):
    from scenarios.runner import steering_rows

    timeline = _timeline(tmp_path / "timeline.jsonl", [
        {"source": "front-apac-se", "event": "call_created", "region": "apac-se",
         "call": "eu-west~1~AAAAAAAAAAAAAAAA", "cluster": "eu-west", "nearest": True,
         "reason": "nearest"},
        {"source": "front-apac-se", "event": "steering_changed", "region": "apac-se",
         "from": "eu-west", "to": "na-east", "why": "eu-west down"},
        {"source": "front-apac-se", "event": "call_refused", "status": 503},
        {"source": "transceiver-na-east", "event": "call_created", "cluster": "x"},
        {"source": "front-au", "event": "call_created", "call": "na-east~0~B",
         "cluster": "na-east", "nearest": False, "reason": "eu-west down"}])
    rows = steering_rows("global-relay", timeline)
    assert [(r["client_region"], r["event"], r["cluster"], r.get("nearest"), r["reason"])
            for r in rows] == [
        ("apac-se", "call_created", "eu-west", True, "nearest"),
        ("apac-se", "steering_changed", "na-east", None, "eu-west down"),
        ("au", "call_created", "na-east", False, "eu-west down")]
    assert steering_rows("x", tmp_path / "absent.jsonl") == []


def test_a_sessions_moves_and_up_gaps_come_from_its_transceivers_lines(tmp_path):
    """sessions.csv's ``moved``: the transceiver's session_moved lines of every call the
    session made (by the session id in each attempt's location), none of another session's or
    another service's; the up gaps from its rx_gap lines."""
    from scenarios.runner import ServerSide, client_rows
    from scenarios.saturation import LagWindows

    timeline = _timeline(tmp_path / "timeline.jsonl", [
        {"source": "transceiver-na-east", "event": "session_moved", "session": "S1",
         "previous": "10.1.7.1:40127", "client": "10.1.7.1:10429"},
        {"source": "transceiver-na-east", "event": "rx_gap", "session": "S1",
         "start_unix": 1.5, "ms": 700.0},
        {"source": "transceiver-na-east", "event": "session_moved", "session": "S2",
         "previous": "a:1", "client": "b:2"},
        {"source": "front-apac-se", "event": "session_moved", "session": "S1",
         "previous": "x:1", "client": "y:2"}])
    server = ServerSide.read(timeline)
    assert server.gaps == {"S1": [(1.5, 700.0)]}
    assert server.moves["S1"] == [[1796032800.0, "10.1.7.1:40127", "10.1.7.1:10429"]]
    (tmp_path / "sessions-apac-se.jsonl").write_text(json.dumps({
        "index": 0, "ok": True, "attempts": [
            {"attempt": 0, "location": "/v1/calls/na-east~1~S0"},
            {"attempt": 1, "location": "/v1/calls/na-east~1~S1"}]}) + "\n")
    sessions, _, _, gaps = client_rows("global-relay", "apac-se", tmp_path,
                                       LagWindows.from_run(tmp_path / "absent.jsonl"), server)
    assert json.loads(sessions[0]["moved"]) == server.moves["S1"]
    assert [(g["direction"], g["ms"], g["attempt"]) for g in gaps] == [("up", 700.0, 1)]


def test_the_report_says_where_each_client_region_was_steered(tmp_path):
    from scenarios.runner import STEERING_FIELDS

    directory = write_run(tmp_path / "run", n=10)
    rows = []
    for arch in ARCHS:
        rows += [{"architecture": arch, "client_region": "apac-se", "front": "front-apac-se",
                  "event": "call_created", "call": f"eu-west~0~{i}", "cluster": "eu-west",
                  "nearest": True, "reason": "nearest"} for i in range(3)]
    rows += [{"architecture": "global-relay", "client_region": "au", "front": "front-au",
              "event": "steering_changed", "cluster": "na-east", "reason": "eu-west down"},
             {"architecture": "global-relay", "client_region": "au", "front": "front-au",
              "event": "call_created", "call": "na-east~1~x", "cluster": "na-east",
              "nearest": False, "reason": "eu-west down"},
             {"architecture": "global-relay", "client_region": "au", "front": "front-au",
              "event": "call_created", "call": "eu-west~0~y", "cluster": "eu-west",
              "nearest": True, "reason": "nearest"}]
    with open(directory / "steering.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=STEERING_FIELDS)
        w.writeheader()
        w.writerows(rows)
    html_path, md_path = write_report(directory, tmp_path / "report")
    md = md_path.read_text()
    assert "## Where each client region was steered" in md
    assert "| port-per-session | apac-se | eu-west 3 | 0 | 0 |" in md
    assert "| global-relay | au | na-east 1, eu-west 1 | 1 | 1 |" in md
    assert "Where each client region was steered" in html_path.read_text()
    # a folder without steering.csv (older runs) is complete and has no such table
    old = write_run(tmp_path / "old", n=10)
    results = load_results(old)
    assert results.steering.empty and "steering.csv" not in results.missing_files
    _, md_path = write_report(old, tmp_path / "old-report")
    assert "steered" not in md_path.read_text()
