"""Budgets over a sweep (analysis/sweepbudgets.py, ``voiceedge budgets --sweep``) on a sweep
folder built here: global-relay's first ICE RTT minus the baseline's is constructed at every
point, so which point passes, fails or is missing is known before the code runs (no root, no
network, no world)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import analysis.sweepbudgets as sweepbudgets
from analysis.budgets import BUDGETS_FILE, PACKAGE_ROOT, BudgetError, BudgetFile
from analysis.stats import Bootstrap
from analysis.sweep import analyse_sweep
from analysis.sweepbudgets import check_sweep, load_sweep_budgets, parse_conditions
from tests.test_analysis_sweep import ARCHS, BASE, CLUSTER, GLOBAL, write_sweep
from voiceedge.cli import main

BOOT = Bootstrap(resamples=400)
RTT = "public_internet.rtt_scale"


def _figures(base: float, glob: float) -> dict:
    """The baseline's and cluster-relay's first ICE RTT (and media RTT) median ``base``,
    global-relay's ``glob``: its difference from the baseline is ``glob - base`` exactly."""
    return {BASE: (100, base, base), CLUSTER: (100, base, base), GLOBAL: (100, glob, glob)}


# global-relay's first ICE RTT p50 (and minus the baseline's) at each rtt_scale:
#   1.0 190 (-10) | 1.2 215 (-25; status 'failed': measured) | 1.4 262 (-18)
#   1.6 not calibrated (its folder says +100: never read) | 1.8 320 (-40) | 2.0 pending
SCALES = [1.0, 1.2, 1.4, 1.6, 1.8, 2.0]
POINTS = [
    {"values": {RTT: 1.0}, "status": "measured", "figures": _figures(200, 190)},
    {"values": {RTT: 1.2}, "status": "failed", "figures": _figures(240, 215)},
    {"values": {RTT: 1.4}, "status": "measured", "figures": _figures(280, 262)},
    {"values": {RTT: 1.6}, "status": "not calibrated", "calibrated": False,
     "error": "calibration failed", "figures": _figures(300, 400)},
    {"values": {RTT: 1.8}, "status": "measured", "figures": _figures(360, 320)},
    {"values": {RTT: 2.0}, "status": "pending"},
]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    return write_sweep(tmp_path_factory.mktemp("sweeps") / "sweep-sweep-apac-20261201-120000",
                       [(RTT, SCALES)], POINTS)


@pytest.fixture(scope="module")
def analysis(sweep_dir):
    return analyse_sweep(sweep_dir, BOOT)


def _file(tmp_path: Path, *budgets: dict, name: str = "b.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"sweep_budgets": list(budgets)}))
    return path


def _budget(**kw) -> dict:
    return {"architecture": GLOBAL, "metric": "first_ice_rtt_ms", "percentile": 50, **kw}


def _check(analysis, tmp_path, *budgets: dict):
    return check_sweep(analysis, load_sweep_budgets(_file(tmp_path, *budgets)))


def _values(verdict) -> dict:
    return {p.point: p.value for p in verdict.points}


# ------------------------------------------------------------------ passing and failing

def test_a_budget_that_holds_at_every_point_of_its_range_passes(analysis, tmp_path):
    v, = _check(analysis, tmp_path, _budget(max_over_baseline=-15,
                                            where={RTT: ">= 1.2, <= 1.4"}))
    assert v.ok and v.note == ""
    assert _values(v) == {"p01": pytest.approx(-25), "p02": pytest.approx(-18)}
    assert v.worst.point == "p02" and v.worst.margin == pytest.approx(3)
    for p in v.points:
        assert p.ci[0] <= p.value <= p.ci[1] and p.ci[0] < p.ci[1]  # the CI is reported
        assert (p.n, p.n_baseline) == (41, 41)
    # 'failed' (an architecture below min_success_pct) is measured, and says so
    assert (v.points[0].status, v.points[0].note) == ("failed", "status failed: measured")


def test_a_budget_that_fails_at_one_point_names_that_point(analysis, tmp_path):
    v, = _check(analysis, tmp_path, _budget(max_over_baseline=-20,
                                            where={RTT: "> 1.0, <= 1.4"}))
    assert not v.ok
    assert [(p.point, p.ok) for p in v.points] == [("p01", True), ("p02", False)]
    assert (v.worst.point, v.worst.value, v.worst.margin) == ("p02", pytest.approx(-18),
                                                               pytest.approx(-2))
    assert "over at 1 of 2 points: p02 (rtt_scale 1.4)" in v.note and "p01" not in v.note


def test_the_examples_budget_fails_where_it_is_over_and_where_nothing_was_measured(
        analysis, tmp_path):
    """The shipped example's budget on this sweep: over at 1.4, and 1.6 and 2.0 unmeasured."""
    v, = _check(analysis, tmp_path, _budget(max_over_baseline=-20, where={RTT: ">= 1.2"}))
    assert not v.ok
    assert [p.point for p in v.points] == ["p01", "p02", "p03", "p04", "p05"]
    assert _values(v) == {"p01": pytest.approx(-25), "p02": pytest.approx(-18), "p03": None,
                          "p04": pytest.approx(-40), "p05": None}
    assert v.worst.point == "p02"
    assert "p02 (rtt_scale 1.4)" in v.note
    assert "p03 (rtt_scale 1.6): not measured: not calibrated" in v.note
    assert "p05 (rtt_scale 2): not measured: pending" in v.note


def test_an_unmeasured_point_in_range_fails_the_budget_and_is_named(analysis, tmp_path):
    v, = _check(analysis, tmp_path, _budget(max_over_baseline=-20,
                                            where={RTT: ">= 1.6, <= 1.8"}))
    assert not v.ok
    assert [(p.point, p.value, p.ok) for p in v.points] == [
        ("p03", None, False), ("p04", pytest.approx(-40), True)]
    assert v.worst.point == "p04"  # every value inside; the missing point fails it
    assert "p03 (rtt_scale 1.6): not measured: not calibrated" in v.note
    pending, = _check(analysis, tmp_path, _budget(max=1000, where={RTT: "> 1.8"}))
    assert not pending.ok and pending.worst is None
    assert "p05 (rtt_scale 2): not measured: pending" in pending.note


def test_a_range_without_points_fails(analysis, tmp_path):
    for where in ({RTT: "> 2.0"}, {RTT: 1.3}, {RTT: "< 1.0"}):
        v, = _check(analysis, tmp_path, _budget(max=1000, where=where))
        assert not v.ok and v.points == [] and v.worst is None
        assert "no point of the sweep has" in v.note and "nothing proves" in v.note


def test_plain_values_equality_and_the_short_name(analysis, tmp_path):
    results = _check(analysis, tmp_path,
                     _budget(max_over_baseline=-30, where={RTT: 1.8}),
                     _budget(max_over_baseline=-30, where={"rtt_scale": "== 1.8"}),
                     _budget(max_over_baseline=-45, where={RTT: 1.8}))
    assert [[p.point for p in v.points] for v in results] == [["p04"]] * 3
    assert [v.ok for v in results] == [True, True, False]
    assert results[2].worst.margin == pytest.approx(-5)


def test_absolute_bounds_are_on_the_points_median(analysis, tmp_path):
    upper, lower, everywhere = _check(
        analysis, tmp_path, _budget(max=265, where={RTT: "<= 1.4"}),
        _budget(min=200, where={RTT: "<= 1.4"}), _budget(max=330))
    assert upper.ok and _values(upper) == {"p00": pytest.approx(190), "p01": pytest.approx(215),
                                           "p02": pytest.approx(262)}
    assert upper.worst.point == "p02" and upper.worst.n_baseline is None
    assert not lower.ok and [p.point for p in lower.points if not p.ok] == ["p00"]
    assert lower.worst.margin == pytest.approx(-10)
    # no where: every point of the sweep, so the two that were not measured fail it
    assert [p.point for p in everywhere.points] == [f"p0{i}" for i in range(6)]
    assert not everywhere.ok and {p.point for p in everywhere.points if not p.ok} == {"p03",
                                                                                      "p05"}


def test_min_over_baseline_and_every_architecture(analysis, tmp_path):
    ice, mos, cluster, glob = _check(
        analysis, tmp_path, _budget(min_over_baseline=-20, where={RTT: "<= 1.4"}),
        _budget(metric="mos", min_over_baseline=0, where={RTT: "<= 1.4"}),
        _budget(architecture="*", max_over_baseline=0, where={RTT: "<= 1.4"}))
    assert not ice.ok and [p.point for p in ice.points if not p.ok] == ["p01"]  # -25 < -20
    assert mos.ok and all(p.value > 0 for p in mos.points)  # a shorter RTT: a higher MOS
    # "*" with a bound over the baseline: each architecture but the baseline
    assert (cluster.architecture, glob.architecture) == (CLUSTER, GLOBAL)
    assert cluster.ok and set(_values(cluster).values()) == {0} and glob.ok
    cluster, glob = _check(analysis, tmp_path, _budget(architecture="*", max_over_baseline=-10.5,
                                                       where={RTT: "<= 1.4"}))
    assert not cluster.ok and not glob.ok and glob.worst.point == "p00"
    assert [p.point for p in glob.points if not p.ok] == ["p00"]


def test_a_measured_point_whose_folder_is_missing_fails_the_budget(tmp_path):
    directory = write_sweep(tmp_path / "s", [(RTT, [1.0, 1.2])],
                            [POINTS[0], {"values": {RTT: 1.2}, "status": "measured"}])
    v, = check_sweep(analyse_sweep(directory, BOOT),
                     load_sweep_budgets(_file(tmp_path, _budget(max=1000))))
    assert not v.ok and v.points[0].ok and v.points[1].value is None
    assert "p01 (rtt_scale 1.2): not measured: its folder cannot be read: " in v.note


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("entry, message", [
    (_budget(percentile=95, max=1), "only percentile 50"),
    (_budget(metric="signaling_ms", max=1), "not one the sweep analysis has"),
    (_budget(max=1, min=0), "exactly one bound"),
    (_budget(), "exactly one bound"),
    (_budget(max="x"), "exactly one bound"),
    (_budget(max=1, where={RTT: "=> 1.2"}), "not a comparison"),
    (_budget(max=1, where={RTT: ">= fast"}), "needs a number"),
    (_budget(max=1, where={RTT: ">= 1.2, <="}), "not a comparison"),
    (_budget(max=1, where=[">= 1.2"]), "where must map"),
    (_budget(max=1, percentle=50), "unknown key"),
    ({"metric": "rtt_ms", "max": 1}, "needs an architecture"),
])
def test_bad_sweep_budgets_are_one_line_errors(tmp_path, entry, message):
    with pytest.raises(BudgetError, match=message) as exc:
        load_sweep_budgets(_file(tmp_path, entry))
    assert "\n" not in str(exc.value) and "sweep budget 1" in str(exc.value)


@pytest.mark.parametrize("entry, message", [
    (_budget(max=1, where={"loss_pct": "<= 1"}), "'loss_pct', not a parameter of this sweep"),
    (_budget(architecture="turn", max=1), "not an architecture of this sweep"),
    (_budget(architecture=BASE, max_over_baseline=1), "the sweep's baseline"),
])
def test_budgets_that_do_not_fit_the_sweep_are_one_line_errors(sweep_dir, tmp_path, entry,
                                                               message, monkeypatch):
    def no_analysis(*_):  # refused before any statistic is computed
        raise AssertionError("analysed a sweep its budgets do not fit")

    monkeypatch.setattr(sweepbudgets, "analyse_sweep", no_analysis)
    with pytest.raises(BudgetError, match=message) as exc:
        check_sweep(sweep_dir, load_sweep_budgets(_file(tmp_path, entry)))
    assert "\n" not in str(exc.value)


def test_an_ordering_on_a_parameter_of_names_is_refused(tmp_path):
    directory = write_sweep(tmp_path / "s", [("last_mile", ["last_mile_broadband",
                                                            "last_mile_mobile"])],
                            [{"values": {"last_mile": n}, "status": "pending"}
                             for n in ("last_mile_broadband", "last_mile_mobile")])
    with pytest.raises(BudgetError, match="not numbers"):
        check_sweep(directory, load_sweep_budgets(_file(tmp_path, _budget(
            max=1, where={"last_mile": "> 1"}))))
    v, = check_sweep(directory, load_sweep_budgets(_file(tmp_path, _budget(
        max=1, where={"last_mile": "last_mile_mobile"}))))
    assert [p.point for p in v.points] == ["p01"] and not v.ok  # pending


def test_comparisons_parse():
    assert [c.text() for c in parse_conditions(">= 1.2, <= 1.4")] == [">= 1.2", "<= 1.4"]
    assert [(c.op, c.operand) for c in parse_conditions("== [na-east, eu-west]")] == [
        ("==", ["na-east", "eu-west"])]
    assert [(c.op, c.operand) for c in parse_conditions("1.2")] == [("==", 1.2)]
    assert parse_conditions(1.2)[0].holds(1.2) and not parse_conditions("< 1.2")[0].holds(1.2)
    assert parse_conditions("> 1")[0].holds(1.2) and not parse_conditions("> 1")[0].holds("x")


def test_a_budgets_file_without_sweep_budgets_is_refused(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("budgets:\n  - {architecture: x, metric: setup_ms, percentile: 50, "
                    "max: 1}\n")
    with pytest.raises(BudgetError, match="no sweep budgets") as exc:
        load_sweep_budgets(path)
    assert "\n" not in str(exc.value)
    path.write_text("sweep_budgets: []\n")
    with pytest.raises(BudgetError, match="non-empty list"):
        load_sweep_budgets(path)


# ------------------------------------------------------------------ the shipped file

def test_the_shipped_file_loads_with_its_sweep_example():
    budgets = BudgetFile.load()  # the latency gate ignores the sweep section
    assert budgets.budgets and budgets.faults is not None
    example, = load_sweep_budgets(BUDGETS_FILE)
    assert (example.architecture, example.metric, example.bound, example.value) == (
        GLOBAL, "first_ice_rtt_ms", "max_over_baseline", -20)
    # written for the shipped sweep: its parameter, and a range that has points of it
    swept = yaml.safe_load((PACKAGE_ROOT / "scenarios" / "sweep.yaml").read_text())
    values = swept["sweep"]["parameters"][RTT]
    (name, conditions), = example.where
    assert name == RTT and values == [1.0, 1.2, 1.4, 1.8]
    assert [v for v in values if all(c.holds(v) for c in conditions)] == [1.2, 1.4, 1.8]


# ------------------------------------------------------------------ the command

@pytest.fixture
def fast(monkeypatch):
    """The command's analysis with fewer resamples (the verdicts here do not depend on it)."""
    monkeypatch.setattr(sweepbudgets, "analyse_sweep", lambda s, boot: analyse_sweep(s, BOOT))


def test_voiceedge_budgets_sweep_exit_status_table_and_json(sweep_dir, tmp_path, capsys, fast):
    good = _file(tmp_path, _budget(max_over_baseline=-15, where={RTT: ">= 1.2, <= 1.4"}),
                 name="good.yaml")
    bad = _file(tmp_path, _budget(max_over_baseline=-15, where={RTT: ">= 1.2, <= 1.4"}),
                _budget(max_over_baseline=-20, where={RTT: "> 1.0, <= 1.4"}), name="bad.yaml")
    assert main(["budgets", "--sweep", str(sweep_dir), "--budgets", str(good)]) == 0
    out = capsys.readouterr().out
    assert "sweep budgets (good.yaml)" in out and "worst: p02" in out
    assert "PASS" in out and "FAIL" not in out
    assert main(["budgets", "--sweep", str(sweep_dir), "--budgets", str(bad), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [(v["set"], v["ok"]) for v in doc] == [("sweep", True), ("sweep", False)]
    assert doc[1]["worst"]["point"] == "p02" and doc[1]["worst"]["value"] == pytest.approx(-18)
    assert doc[1]["where"] == {RTT: ["> 1", "<= 1.4"]} and doc[1]["bound"] == "max_over_baseline"
    assert [p["point"] for p in doc[1]["points"]] == ["p01", "p02"]
    assert doc[1]["points"][0]["values"] == {RTT: 1.2} and len(doc[1]["points"][0]["ci"]) == 2


@pytest.mark.parametrize("argv, message", [
    (["--budgets", "{no_section}"], "no sweep budgets"),
    (["--budgets", "{unknown_parameter}"], "not a parameter of this sweep"),
    (["{sweep}"], "takes no results folders"),
    (["--only", "latency"], "takes no results folders"),
])
def test_voiceedge_budgets_sweep_bad_input_is_exit_2_and_one_line(
        sweep_dir, tmp_path, capsys, fast, argv, message):
    no_section = tmp_path / "plain.yaml"
    no_section.write_text("budgets:\n  - {architecture: x, metric: setup_ms, percentile: 50, "
                          "max: 1}\n")
    unknown = _file(tmp_path, _budget(max=1, where={"loss_pct": 1}), name="unknown.yaml")
    argv = [a.format(no_section=no_section, unknown_parameter=unknown, sweep=sweep_dir)
            for a in argv]
    assert main(["budgets", "--sweep", str(sweep_dir), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_voiceedge_budgets_sweep_on_a_folder_that_is_not_a_sweep(tmp_path, capsys, fast):
    assert main(["budgets", "--sweep", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a sweep folder" in err and "\n" not in err
