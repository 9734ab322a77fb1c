"""Calibration verdicts on constructed measurements (no root needed)."""
from __future__ import annotations

import io

import numpy as np

from topology.calibrate import FAMILY_TAIL, Expectation, judge, loss_band
from topology.impairment.model import BernoulliLoss, GilbertElliottLoss, Impairment
from topology.loadcal import EngineWindow
from voiceedge.delayrule import DelayExpectation, judge_delays, mean_tolerance_ms


def verdict(impairment: Impairment, delays, sent=200):
    return judge(Expectation.of(impairment), sent, list(delays), 0, "public", "a", "b", "x", "y")


def test_the_delay_rule_in_numbers():
    """voiceedge/delayrule.py, shared with the captures' hops: mean within max(1 ms, 5%) +
    0.5 ms per hop; robust spread (IQR / 1.349) within 25% + 0.5 ms of the jitter (x 1.284
    for a uniform delay)."""
    assert mean_tolerance_ms(DelayExpectation(10.0, 0.0)) == 1.5
    assert mean_tolerance_ms(DelayExpectation(100.0, 0.0)) == 5.5
    assert mean_tolerance_ms(DelayExpectation(100.0, 0.0, hops=3)) == 6.5
    delays = [10.0] * 4 + [14.0] * 4  # mean 12, sd 2, IQR 4: robust spread 4 / 1.349 = 2.965
    mean, sd, robust, mean_ok, sd_ok = judge_delays(DelayExpectation(12.0, 3.0), delays)
    assert (mean, sd, round(robust, 3), mean_ok, sd_ok) == (12.0, 2.0, 2.965, True, True)
    assert not judge_delays(DelayExpectation(13.6, 3.0), delays)[3]  # 1.6 ms off, 1.5 allowed
    assert judge_delays(DelayExpectation(13.5, 3.0), delays)[3]
    # jitter 1.6 ms: normal allows 0.9 ms around 1.6; uniform 1.014 around 2.054
    assert not judge_delays(DelayExpectation(12.0, 1.6), delays)[4]
    assert judge_delays(DelayExpectation(12.0, 1.6, distribution="uniform"), delays)[4]
    assert judge_delays(DelayExpectation(12.0, 0.0), delays[:7])[2:] == (None, True, False)


def test_a_configured_path_passes_and_a_few_scheduling_outliers_do_not_fail_it():
    rng = np.random.default_rng(3)
    delays = rng.normal(20, 5, 200)
    delays[:3] += 40  # three datagrams held up by the probe's own scheduling
    r = verdict(Impairment(delay_ms=20, jitter_ms=5), delays)
    assert r.ok and r.sd_ms > 6 and 4 < r.sd_robust_ms < 6


def test_a_flat_world_fails():
    r = verdict(Impairment(delay_ms=20, jitter_ms=5), np.full(200, 0.1))
    assert not r.mean_ok and not r.sd_ok and not r.ok


def test_too_much_jitter_fails():
    r = verdict(Impairment(delay_ms=20, jitter_ms=1), np.random.default_rng(1).normal(20, 4, 200))
    assert r.mean_ok and not r.sd_ok


def test_a_blackhole_fails_and_loss_is_judged_against_its_model():
    assert not verdict(Impairment(delay_ms=20), [], sent=200).ok
    lo, hi = loss_band(BernoulliLoss(2.0), 1000)
    assert lo <= 20 <= hi and hi < 40 and lo > 5
    lo, hi = loss_band(GilbertElliottLoss(p=1.0, r=25.0), 1000)
    assert lo <= 38 <= hi and hi > 60  # bursty loss spreads far wider than binomial
    assert loss_band(None, 200) == (0, 0)
    good = verdict(Impairment(delay_ms=5, loss=BernoulliLoss(2.0)),
                   np.full(196, 5.0), sent=200)
    assert good.loss_ok
    bad = verdict(Impairment(delay_ms=5, loss=BernoulliLoss(2.0)), np.full(150, 5.0), sent=200)
    assert not bad.loss_ok


def test_the_progress_bar_is_drawn_only_on_a_terminal():
    from rich.console import Console

    from topology.cli import paths_progress

    pipe = io.StringIO()
    with paths_progress(Console(file=pipe, force_terminal=False)) as progress:
        assert progress is None
    assert pipe.getvalue() == ""
    tty = io.StringIO()
    with paths_progress(Console(file=tty, force_terminal=True, width=80)) as progress:
        assert tty.getvalue() == ""  # nothing until the first call
        for done in range(4):
            progress(done, 3)
    assert "3/3" in tty.getvalue() and "probing paths" in tty.getvalue()


def test_the_loss_band_is_corrected_for_the_number_of_paths():
    loss = BernoulliLoss(1.0)
    one = loss_band(loss, 200, tail=FAMILY_TAIL)
    many = loss_band(loss, 200, tail=FAMILY_TAIL / 51)
    assert many[0] <= one[0] and many[1] > one[1]
    lost = many[1]  # inside the band of a 51-path world, outside that of a 1-path world
    delays = np.full(200 - lost, 5.0)
    imp = Impairment(delay_ms=5, loss=loss)
    assert judge(Expectation.of(imp), 200, list(delays), 0, "public", "a", "b", "x", "y",
                 paths=51).loss_ok
    assert not judge(Expectation.of(imp), 200, list(delays), 0, "public", "a", "b", "x", "y",
                     paths=1).loss_ok


def test_verdicts_prepared_before_a_calibration_at_load_need_no_simulation_then():
    """The runner prepares the loss bands before the calls (prepare_verdicts): the verdicts
    of a calibration at load over the same links then find every band simulated."""
    from topology.calibrate import prepare_verdicts
    from topology.world import ImpairedLink

    imps = [Impairment(delay_ms=5, loss=GilbertElliottLoss(p=0.7, r=31.0)),
            Impairment(delay_ms=9, loss=BernoulliLoss(0.37))]
    links = [ImpairedLink("public", "a", "b", "x", "y", "10.0.0.1", "y-eth0", imp)
             for imp in imps]
    prepare_verdicts(links, 77)
    misses = loss_band.cache_info().misses
    for imp in imps:
        judge(Expectation.of(imp), 77, [5.0] * 77, 0, "public", "a", "b", "x", "y",
              paths=len(links) + 1)   # as calibrate() judges them: the unimpaired path too
    assert loss_band.cache_info().misses == misses


def test_the_engine_window_is_the_difference_of_two_snapshots():
    before = {"cpu_seconds": 10.0, "lateness_hist": {10: 500, 20: 7}}
    # 100 releases in the window: 89 at 20 us, 10 at 500 us, 1 at 3000 us
    after = {"cpu_seconds": 10.5, "lateness_hist": {10: 500, 20: 96, 500: 10, 3000: 1}}
    w = EngineWindow.between(before, after, seconds=2.0)
    assert (w.cpu_pct, w.releases_per_s) == (25.0, 50.0)
    assert (w.lateness_p50_us, w.lateness_p99_us) == (20.0, 500.0)
    # the releases before the window (500 at 10 us) would have made the p50 10 us
    assert EngineWindow.between({}, after, 2.0).cpu_pct is None  # a backend without an engine
    quiet = EngineWindow.between(before, before, 2.0)
    assert quiet.releases_per_s == 0 and quiet.lateness_p99_us is None
