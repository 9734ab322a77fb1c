"""A sweep folder (scenarios/sweep.py writes it), analysed: each point's medians with their CIs,
each architecture's difference from the baseline along the swept parameters, where an advantage
stops being significant (the crossover), and the sweep's report.

    results/<scenario>-sweep-<region>-<time>/
      sweep.json     the parameters; each point's values, status, directory, order, seconds
      points/<id>/   each point's own results folder (analysis/load.py)
      sessions.csv   every measured point's sessions, ``point`` and the parameters in front

The report (sweep_stats.csv, sweep_summary.json, plots, sweep_report.html/.md) is
analysis/sweepreport.py's (docs/sweeps.md, "Reading a sweep"). Only measured points (status
``measured`` or ``failed``) are analysed; the others are listed with their status, never
plotted.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from analysis.jsonout import plain
from analysis import archinfo
from analysis.family import ALPHA, MARGINS, Family, holm
from analysis.load import Results, ResultsError, load_results
from analysis.mos import EModel
from analysis.stats import METRIC_BY_NAME, Bootstrap, Difference, Stats, compute_stats
from analysis.tables import fmt

SWEEP_FILE = "sweep.json"
MEASURED = "measured"
# The statuses whose points are analysed: "failed" is a measured point where an architecture
# fell below min_success_pct (its success rate is a finding, and in the tables).
ANALYSED = (MEASURED, "failed")
SWEEP_METRICS = ("setup_ms", "setup_over_floor_ms", "first_ice_rtt_ms", "rtt_ms", "jitter_ms",
                 "loss_pct", "mos")
BETTER, NONE, WORSE = "better", "none", "worse"  # an architecture against the baseline
STATE_WORDS = {BETTER: "significantly better", NONE: "no significant difference",
               WORSE: "significantly worse"}
BEYOND = "beyond the swept range"
_UNITS = {"loss_pct": " percentage points", "mos": ""}


class SweepError(ResultsError):
    """A folder that is not a readable sweep folder; the message is one line."""


# ------------------------------------------------------------------ the folder

@dataclass(frozen=True)
class Parameter:
    """A swept parameter and its values, in sweep.json's order."""

    name: str
    values: tuple

    @property
    def label(self) -> str:
        """The short name: 'rtt_scale' for public_internet.rtt_scale."""
        return self.name.split(".")[-1]

    @property
    def numeric(self) -> bool:
        """Numbers: an axis, ordered by value; otherwise categories, in the given order."""
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)

    def show(self, value) -> str:
        if isinstance(value, (list, tuple)):
            return "+".join(map(str, value))
        return f"{value:g}" if isinstance(value, float) else str(value)

    def position(self, value) -> float:
        """Where a value sits on a plot's axis: itself, or its index for categories."""
        return float(value) if self.numeric else float(list(self.values).index(value))


@dataclass
class Point:
    """One point of sweep.json; ``results`` is loaded for an analysed point."""

    id: str
    values: dict
    status: str
    directory: str
    order: list = field(default_factory=list)
    seconds: float | None = None
    error: str | None = None
    results: Results | None = None
    problem: str = ""  # why a measured point's folder could not be read

    @property
    def analysed(self) -> bool:
        return self.results is not None


@dataclass
class Sweep:
    path: Path
    doc: dict
    parameters: tuple[Parameter, ...]
    points: list[Point]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def scenario(self) -> str:
        return str(self.doc.get("scenario") or "?")

    @property
    def region(self) -> str:
        return str(self.doc.get("region") or "?")

    @cached_property
    def archinfo(self) -> archinfo.ArchFacts:
        """What the sweep says about its architectures (analysis/archinfo.py)."""
        return archinfo.read(self.path, self.doc)

    @property
    def baseline(self) -> str:
        return self.archinfo.baseline

    @property
    def architectures(self) -> list[str]:
        """sweep.json's architectures, then any other a point measured."""
        out = list(self.doc.get("architectures") or [])
        for p in self.analysed_points:
            out += [a for a in p.results.architectures if a not in out]
        return out

    @property
    def analysed_points(self) -> list[Point]:
        return [p for p in self.points if p.analysed]

    def where(self, point: Point) -> str:
        """'rtt_scale 1.2' (and ', loss_pct 2' for a second parameter)."""
        return ", ".join(f"{p.label} {p.show(point.values[p.name])}" for p in self.parameters)


def _fail(file: Path, what: str):
    raise SweepError(f"{file}: {what}")


def _parameters(doc: dict, file: Path) -> tuple[Parameter, ...]:
    raw = doc.get("parameters")
    if not isinstance(raw, list) or not 1 <= len(raw) <= 2:
        _fail(file, "'parameters' is not a list of one or two parameters")
    out = []
    for p in raw:
        if (not isinstance(p, dict) or not isinstance(p.get("name"), str)
                or not isinstance(p.get("values"), list) or not p["values"]):
            _fail(file, "each parameter needs a 'name' and a non-empty list of 'values'")
        out.append(Parameter(p["name"], tuple(p["values"])))
    return tuple(out)


def _point(raw, parameters: tuple[Parameter, ...], file: Path) -> Point:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        _fail(file, "each point needs an 'id'")
    pid, values = raw["id"], raw.get("values")
    if not isinstance(values, dict) or any(p.name not in values for p in parameters):
        _fail(file, f"point {pid}: 'values' lacks a parameter's value")
    for p in parameters:
        if values[p.name] not in p.values:
            _fail(file, f"point {pid}: {p.name} {values[p.name]!r} is not one of its values")
    if not isinstance(raw.get("status"), str):
        _fail(file, f"point {pid}: no 'status'")
    directory = raw.get("directory") or f"points/{pid}"
    if not isinstance(directory, str) or Path(directory).is_absolute() \
            or ".." in Path(directory).parts:
        _fail(file, f"point {pid}: 'directory' must be a path inside the sweep folder")
    return Point(pid, values, raw["status"], directory, list(raw.get("order") or []),
                 raw.get("seconds"), raw.get("error"))


def load_sweep(path: str | Path) -> Sweep:
    """Read sweep.json and the results folder of every point whose status is ``measured``.
    SweepError (a ResultsError; one line) for a folder that is not a sweep folder; a measured
    point whose folder cannot be read keeps the reason in ``Point.problem``."""
    path = Path(path)
    if not path.is_dir():
        raise SweepError(f"{path} is not a directory")
    file = path / SWEEP_FILE
    if not file.is_file():
        raise SweepError(f"{path} is not a sweep folder (no {SWEEP_FILE})")
    try:
        doc = json.loads(file.read_text())
    except ValueError as exc:
        raise SweepError(f"{file} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        _fail(file, "not a JSON object")
    parameters = _parameters(doc, file)
    if not isinstance(doc.get("points"), list):
        _fail(file, "'points' is not a list")
    points = [_point(p, parameters, file) for p in doc["points"]]
    if len({p.id for p in points}) != len(points):
        _fail(file, "point ids repeat")
    if not isinstance(doc.get("architectures", []), list):
        _fail(file, "'architectures' is not a list")
    for p in points:
        if p.status in ANALYSED:
            try:
                p.results = load_results(path / p.directory)
            except ResultsError as exc:
                p.problem = str(exc)
    return Sweep(path, doc, parameters, points)


# ------------------------------------------------------------------ statistics per point

@dataclass(frozen=True)
class Cell:
    """One architecture's median of one metric at one point, its CI, and (but for the
    baseline) its difference from the baseline's median with that difference's CI."""

    point: str
    architecture: str
    metric: str
    p50: float
    lo: float
    hi: float
    n: int
    saturated: int  # successful sessions left out: measured while the host lagged
    diff: Difference | None
    p_adjusted: float | None = None  # Holm over the sweep's family (analyse_sweep)

    @property
    def state(self) -> str | None:
        return state_of(self.diff, self.metric, self.p_adjusted)


def state_of(diff: Difference | None, metric: str, p_adjusted: float | None = None,
             alpha: float = ALPHA) -> str | None:
    """BETTER or WORSE (lower is better, but for MOS) when the difference is significant and
    larger than the metric's margin, NONE when not; None without a difference. Significant:
    ``p_adjusted`` under ``alpha`` where the family was adjusted, else the CI excludes zero."""
    if diff is None or math.isnan(diff.estimate):
        return None
    significant = (diff.significant if p_adjusted is None
                   else not math.isnan(p_adjusted) and p_adjusted < alpha)
    if not significant or abs(diff.estimate) < MARGINS.get(metric, 0.0):
        return NONE
    return BETTER if (diff.estimate > 0) == METRIC_BY_NAME[metric].higher_is_better else WORSE


def adjusted(cells: dict[tuple[str, str, str], "Cell"]) -> tuple[dict, Family]:
    """The cells with Holm-adjusted p-values over every difference among them, and the family."""
    keys = [k for k, c in cells.items() if c.diff is not None and not math.isnan(c.diff.p_value)]
    ps = holm([cells[k].diff.p_value for k in keys])
    out = dict(cells)
    for k, p in zip(keys, ps):
        out[k] = replace(cells[k], p_adjusted=p)
    return out, Family(comparisons=len(keys))


def _cells(point: Point, stats: Stats, architectures: list[str], baseline: str) -> list[Cell]:
    out = []
    have_baseline = baseline in point.results.architectures
    for arch in architectures:
        if arch not in point.results.architectures:
            continue
        saturated = int(stats.success_row(arch).saturated)
        for metric in SWEEP_METRICS:
            row = stats.row(arch, metric)
            diff = (stats.difference(arch, baseline, metric)
                    if have_baseline and arch != baseline else None)
            out.append(Cell(point.id, arch, metric, float(row.p50), float(row.p50_lo),
                            float(row.p50_hi), int(row.n), saturated, diff))
    return out


# ------------------------------------------------------------------ crossovers

@dataclass(frozen=True)
class Transition:
    """Neighbouring measured points (parameter values) where the state changes."""

    start: float
    end: float
    before: str
    after: str


def transitions(xs, states) -> tuple[Transition, ...]:
    return tuple(Transition(xs[i], xs[i + 1], states[i], states[i + 1])
                 for i in range(len(xs) - 1) if states[i] != states[i + 1])


def zero_crossings(xs, ys) -> tuple[float, ...]:
    """Where the piecewise-linear ys changes sign (interpolated between neighbours; across a
    run of exact zeros, the run's middle). Touching zero without changing sign is none."""
    out, last = [], None  # last: index of the last non-zero value
    for i, y in enumerate(ys):
        if y == 0:
            continue
        if last is not None and (ys[last] < 0) != (y < 0):
            if last == i - 1:
                out.append(xs[last] + (xs[i] - xs[last]) * ys[last] / (ys[last] - y))
            else:
                out.append((xs[last + 1] + xs[i - 1]) / 2)
        last = i
    return tuple(float(x) for x in out)


def _below(a: float, b: float, fa: float, fb: float) -> tuple[float, float] | None:
    """The part of [a, b] where the line through (a, fa), (b, fb) is <= 0."""
    if fa <= 0 and fb <= 0:
        return a, b
    if fa > 0 and fb > 0:
        return None
    t = a + (b - a) * fa / (fa - fb)
    return (a, t) if fa <= 0 else (t, b)


def insignificant_spans(xs, los, his) -> tuple[tuple[float | None, float | None], ...]:
    """Where the CI, its bounds interpolated linearly between neighbouring points, includes
    zero (lo <= 0 <= hi): (start, end) spans; None for an end at the edge of the swept range
    (the span goes on beyond it, as far as this sweep can tell)."""
    if len(xs) == 1:
        return ((None, None),) if los[0] <= 0 <= his[0] else ()
    pieces = []
    for i in range(len(xs) - 1):
        a, b = xs[i], xs[i + 1]
        lo_part = _below(a, b, los[i], los[i + 1])
        hi_part = _below(a, b, -his[i], -his[i + 1])
        if lo_part and hi_part and max(lo_part[0], hi_part[0]) <= min(lo_part[1], hi_part[1]):
            pieces.append([max(lo_part[0], hi_part[0]), min(lo_part[1], hi_part[1])])
    spans: list[list[float]] = []
    for piece in pieces:
        if spans and spans[-1][1] == piece[0]:
            spans[-1][1] = piece[1]
        else:
            spans.append(piece)
    return tuple((None if s == xs[0] else float(s), None if e == xs[-1] else float(e))
                 for s, e in spans)


@dataclass(frozen=True)
class Crossover:
    """Along a one-parameter numeric sweep: an architecture's state against the baseline at
    each measured point, where it changes (between which points), where the difference's
    estimate crosses zero and where its CI includes zero (both interpolated linearly)."""

    architecture: str
    baseline: str
    metric: str
    parameter: Parameter
    xs: tuple[float, ...]
    states: tuple[str, ...]
    transitions: tuple[Transition, ...]
    zeros: tuple[float, ...]  # where the estimate crosses zero, inside a crossing only
    spans: tuple[tuple[float | None, float | None], ...]
    # significantly better at one value, significantly worse at the next value where it is
    # significant (or the other way round): the only changes called a crossover
    crossings: tuple[Transition, ...] = ()

    def _x(self, x: float | None, side: str) -> str:
        return f"{side} the swept range" if x is None else f"≈{x:.3g}"

    def changes(self) -> str:
        """'1.2-1.4: none -> better' per transition, or what holds throughout."""
        if not self.states:
            return "no measured point to compare"
        if not self.transitions:
            return f"{STATE_WORDS[self.states[0]]} throughout"
        show = self.parameter.show
        return "; ".join(f"between {show(t.start)} and {show(t.end)}: {t.before} -> {t.after}"
                         for t in self.transitions)

    def zero_text(self) -> str:
        if not self.zeros:
            return BEYOND if self.crossings else "-"
        return ", ".join(f"≈{z:.3g}" for z in self.zeros)

    def span_text(self) -> str:
        if not self.spans:
            return "nowhere (significant at every point)"
        if self.spans == ((None, None),):
            return "throughout the swept range"
        return "; ".join(f"from {self._x(s, 'below')} to {self._x(e, 'above')}"
                         for s, e in self.spans)

    def sentence(self) -> str:
        p, label = self.parameter, METRIC_BY_NAME[self.metric].label
        head = f"{self.architecture}'s {label} against {self.baseline}'s along {p.label}"
        if not self.states:
            return f"{head}: no measured point to compare."
        if not self.transitions:
            return (f"{head}: {STATE_WORDS[self.states[0]]} at every measured point "
                    f"({p.show(self.xs[0])} to {p.show(self.xs[-1])}); no crossover in the "
                    f"swept range.")
        if not self.crossings:
            where = {st: [p.show(x) for x, s in zip(self.xs, self.states) if s == st]
                     for st in (BETTER, WORSE)}
            said = "; ".join(f"{STATE_WORDS[st]} at {', '.join(xs)}"
                             for st, xs in where.items() if xs)
            return (f"{head}: {said}, no significant difference elsewhere; no crossover (that "
                    f"needs significantly better at one value and significantly worse at "
                    f"another).")
        parts = [f"{STATE_WORDS[t.before]} at {p.show(t.start)}, {STATE_WORDS[t.after]} at "
                 f"{p.show(t.end)}: a crossover between them" for t in self.crossings]
        return (f"{head}: " + "; ".join(parts) + f". The difference of medians crosses zero "
                f"at {p.label} {self.zero_text()}.")

    def to_dict(self) -> dict:
        return {"architecture": self.architecture, "baseline": self.baseline,
                "metric": self.metric, "parameter": self.parameter.name,
                "states": [{"value": x, "state": s} for x, s in zip(self.xs, self.states)],
                "transitions": [{"between": [t.start, t.end], "from": t.before, "to": t.after}
                                for t in self.transitions],
                "crossings": [{"between": [t.start, t.end], "from": t.before, "to": t.after}
                              for t in self.crossings],
                "estimate_zero": list(self.zeros),  # empty: no crossing
                "ci_includes_zero": [{"from": s, "to": e} for s, e in self.spans],
                "sentence": self.sentence()}


def crossings(xs, states) -> tuple[Transition, ...]:
    """Sign changes between significant states: from the last point significantly better
    (worse) to the next one significantly worse (better), points without a significant
    difference between them skipped."""
    out, last = [], None
    for x, st in zip(xs, states):
        if st not in (BETTER, WORSE):
            continue
        if last is not None and last[1] != st:
            out.append(Transition(last[0], x, last[1], st))
        last = (x, st)
    return tuple(out)


def crossover(parameter: Parameter, architecture: str, baseline: str, metric: str,
              points: list[tuple[float, Cell | Difference]]) -> Crossover:
    """The crossover of one architecture and metric from (parameter value, cell) pairs (a
    bare difference is judged by its CI alone; points without a difference are left out)."""
    judged = []
    for x, c in points:
        diff, p_adj = (c, None) if isinstance(c, Difference) else (c.diff, c.p_adjusted)
        if diff is not None and not math.isnan(diff.estimate):
            judged.append((float(x), diff, state_of(diff, metric, p_adj)))
    judged.sort(key=lambda t: t[0])
    xs = tuple(x for x, _, _ in judged)
    states = tuple(st for _, _, st in judged)
    found = crossings(xs, states)
    zeros = zero_crossings(xs, [d.estimate for _, d, _ in judged])
    inside = tuple(z for z in zeros if any(t.start <= z <= t.end for t in found))
    return Crossover(architecture, baseline, metric, parameter, xs, states,
                     transitions(xs, states), inside,
                     insignificant_spans(xs, [d.lo for _, d, _ in judged],
                                         [d.hi for _, d, _ in judged]) if judged else (),
                     found)


# ------------------------------------------------------------------ the analysis

@dataclass(frozen=True)
class Conclusion:
    """One architecture against the baseline, one metric, at one point, in words."""

    point: str
    where: str
    architecture: str
    baseline: str
    metric: str
    diff: Difference
    p_adjusted: float | None = None

    @property
    def state(self) -> str | None:
        return state_of(self.diff, self.metric, self.p_adjusted)

    def sentence(self) -> str:
        d, m = self.diff, self.metric
        label, unit = METRIC_BY_NAME[m].label, _UNITS.get(m, f" {METRIC_BY_NAME[m].unit}")
        head = f"at {self.where}, {self.architecture}'s {label}"
        if math.isnan(d.estimate):
            return f"{head}: no measured sessions to compare with {self.baseline}'s"
        if d.estimate == 0:
            text = (f"{head} equals {self.baseline}'s (difference 0{unit}, CI "
                    f"[{fmt(d.lo, m)}, {fmt(d.hi, m)}])")
        else:
            below = d.estimate < 0
            size, a, b = (-d.estimate, -d.hi, -d.lo) if below else (d.estimate, d.lo, d.hi)
            text = (f"{head} is {fmt(size, m)}{unit} [{fmt(a, m)}, {fmt(b, m)}] "
                    f"{'below' if below else 'above'} {self.baseline}'s")
        verdict = {BETTER: "significant (better)", WORSE: "significant (worse)",
                   NONE: "not significant"}[self.state]
        if self.p_adjusted is not None and not math.isnan(self.p_adjusted):
            verdict += f", adjusted p {self.p_adjusted:.2g}"
        return f"{text}: {verdict}"


@dataclass
class Grid:
    """A metric's difference from the baseline over a two-parameter sweep: rows the second
    parameter's values, columns the first's; NaN and the point's status where not analysed."""

    x: Parameter
    y: Parameter
    estimate: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    significant: np.ndarray
    labels: list[list[str]]  # '' where analysed, else the point's status (or 'no point')


@dataclass
class SweepAnalysis:
    sweep: Sweep
    cells: dict[tuple[str, str, str], Cell]  # (point, architecture, metric)
    crossovers: list[Crossover]
    bootstrap: Bootstrap
    model: EModel
    stats: dict[str, Stats] = field(default_factory=dict)  # per analysed point
    family: Family = field(default_factory=lambda: Family(comparisons=0))

    def cell(self, point: str, architecture: str, metric: str) -> Cell | None:
        return self.cells.get((point, architecture, metric))

    def crossover_of(self, architecture: str, metric: str) -> Crossover | None:
        return next((c for c in self.crossovers if (c.architecture, c.metric)
                     == (architecture, metric)), None)

    def series(self, architecture: str, metric: str, fixed=None) -> list[tuple[float, Cell]]:
        """(position on the first parameter's axis, cell) of the analysed points, in order;
        with ``fixed``, only the points where the second parameter has that value."""
        params = self.sweep.parameters
        out = []
        for p in self.sweep.analysed_points:
            if fixed is not None and p.values[params[1].name] != fixed:
                continue
            c = self.cell(p.id, architecture, metric)
            if c is not None and c.n:
                out.append((params[0].position(p.values[params[0].name]), c))
        return sorted(out, key=lambda t: t[0])

    def conclusions(self) -> list[Conclusion]:
        """Every architecture but the baseline, every metric, at every analysed point."""
        out = []
        for p in self.sweep.analysed_points:
            for arch in self.sweep.architectures:
                for metric in SWEEP_METRICS:
                    c = self.cell(p.id, arch, metric)
                    if c is not None and c.diff is not None:
                        out.append(Conclusion(p.id, self.sweep.where(p), arch,
                                              self.sweep.baseline, metric, c.diff,
                                              c.p_adjusted))
        return out

    def grid(self, architecture: str, metric: str = "mos") -> Grid | None:
        """The difference over a two-parameter sweep (None for one parameter)."""
        if len(self.sweep.parameters) != 2:
            return None
        x, y = self.sweep.parameters
        shape = (len(y.values), len(x.values))
        est, lo, hi = (np.full(shape, np.nan) for _ in range(3))
        sig = np.zeros(shape, dtype=bool)
        labels = [["no point"] * shape[1] for _ in range(shape[0])]
        for p in self.sweep.points:
            i, j = list(y.values).index(p.values[y.name]), list(x.values).index(p.values[x.name])
            if not p.analysed:
                labels[i][j] = "unreadable" if p.problem else p.status
                continue
            c = self.cell(p.id, architecture, metric)
            if c is None or c.diff is None or math.isnan(c.diff.estimate):
                labels[i][j] = "no sessions"
                continue
            labels[i][j] = ""
            est[i, j], lo[i, j], hi[i, j] = c.diff.estimate, c.diff.lo, c.diff.hi
            sig[i, j] = c.state in (BETTER, WORSE)
        return Grid(x, y, est, lo, hi, sig, labels)

    def stats_rows(self) -> list[dict]:
        """The rows of sweep_stats.csv."""
        rows = []
        for p in self.sweep.analysed_points:
            values = {q.name: _cell_value(p.values[q.name]) for q in self.sweep.parameters}
            for arch in self.sweep.architectures:
                for metric in SWEEP_METRICS:
                    c = self.cell(p.id, arch, metric)
                    if c is None:
                        continue
                    d = c.diff
                    rows.append(plain({
                        "point": p.id, **values, "architecture": arch, "metric": metric,
                        "p50": c.p50, "lo": c.lo, "hi": c.hi, "n": c.n, "saturated": c.saturated,
                        "diff": d.estimate if d else None, "diff_lo": d.lo if d else None,
                        "diff_hi": d.hi if d else None, "p": d.p_value if d else None,
                        "p_adjusted": c.p_adjusted, "state": c.state}, 4))
        return rows

    def summary(self) -> dict:
        """sweep_summary.json: the points with their status, the crossovers per metric, the
        conclusions per point, the warnings."""
        s = self.sweep
        crossovers: dict = {}
        for c in self.crossovers:
            crossovers.setdefault(c.metric, {})[c.architecture] = c.to_dict()
        b = self.bootstrap
        return plain({
            "directory": str(s.path), "scenario": s.scenario, "source": s.doc.get("source"),
            "region": s.region, "baseline": s.baseline, "architectures": s.architectures,
            "parameters": [{"name": p.name, "values": list(p.values)} for p in s.parameters],
            "metrics": list(SWEEP_METRICS),
            "bootstrap": {"resamples": b.resamples, "level": b.level, "seed": b.seed},
            "family": self.family.to_dict(),
            "points": [_point_entry(p, s) for p in s.points],
            "crossovers": crossovers,
            "measuring_limits": [m.to_dict() for m in measuring_limits(s)],
            "conclusions": [{"point": c.point, "architecture": c.architecture,
                             "metric": c.metric, "difference_p50": c.diff.estimate,
                             "ci": [c.diff.lo, c.diff.hi], "p_adjusted": c.p_adjusted,
                             "significant": c.state in (BETTER, WORSE),
                             "state": c.state, "sentence": c.sentence()}
                            for c in self.conclusions()],
            "warnings": warnings(self)}, 4)


def _cell_value(value):
    """A parameter value as a CSV cell, as in the sweep's sessions.csv (lists joined by '+')."""
    return "+".join(map(str, value)) if isinstance(value, (list, tuple)) else value


def calibration_status(point: Point, sweep: Sweep) -> str:
    """'passed', 'FAILED', or '-' when the point has no calibration.json."""
    path = sweep.path / point.directory / "calibration.json"
    try:
        ok = json.loads(path.read_text()).get("ok")
    except (OSError, ValueError, AttributeError):
        return "-"
    return "passed" if ok else "FAILED"


def _point_entry(p: Point, sweep: Sweep) -> dict:
    entry = {"id": p.id, "values": p.values, "status": p.status, "directory": p.directory,
             "order": p.order, "seconds": p.seconds, "error": p.error, "analysed": p.analysed,
             "problem": p.problem or None, "calibration": calibration_status(p, sweep)}
    if p.analysed:
        r = p.results
        entry["calibration_at_load_ok"] = {a: bool(c.get("ok"))
                                           for a, c in r.calibration_at_load.items()}
        entry["missing"] = {"architectures": r.missing_architectures, "files": r.missing_files}
        entry["sessions"] = point_sessions(r)
    return entry


def point_sessions(results: Results) -> dict[str, dict]:
    """Per architecture: sessions, ok, and the ok ones measured while the host lagged."""
    s = results.sessions
    return {a: {"sessions": int((s.architecture == a).sum()),
                "ok": int((s.ok & (s.architecture == a)).sum()),
                "saturated": int((s.ok & s.saturated & (s.architecture == a)).sum())}
            for a in results.architectures}


@dataclass(frozen=True)
class LoadStep:
    """One architecture at one point: is the testbed still measuring the network there?"""

    point: str
    live_max: int | None    # live sessions at the peak while the world was probed at load
    live_mean: float | None
    ok: int
    saturated: int          # successful sessions measured while a process on their path lagged
    calibration_ok: bool | None  # calibration at load; None: not run

    @property
    def measuring(self) -> bool:
        return self.ok > 0 and self.saturated == 0 and self.calibration_ok is not False


@dataclass(frozen=True)
class MeasuringLimit:
    """Where an architecture stops measuring the network along a sweep's (first) parameter:
    the first point with a saturated session or a failed calibration at load, and the last
    point before it."""

    architecture: str
    steps: tuple[LoadStep, ...]

    @property
    def first_off(self) -> LoadStep | None:
        return next((st for st in self.steps if not st.measuring), None)

    @property
    def last_clean(self) -> LoadStep | None:
        clean = None
        for st in self.steps:
            if not st.measuring:
                break
            clean = st
        return clean

    def to_dict(self) -> dict:
        last, off = self.last_clean, self.first_off
        return {"architecture": self.architecture,
                "last_measuring_point": last.point if last else None,
                "last_measuring_live_max": last.live_max if last else None,
                "first_point_off": off.point if off else None,
                "steps": [{"point": st.point, "live_max": st.live_max,
                           "live_mean": st.live_mean, "ok": st.ok,
                           "saturated": st.saturated, "calibration_at_load_ok": st.calibration_ok,
                           "measuring": st.measuring} for st in self.steps]}


def measuring_limits(sweep: Sweep) -> list[MeasuringLimit]:
    """Per architecture, the analysed points in the sweep's order as LoadSteps."""
    limits = []
    for arch in sweep.architectures:
        steps = []
        for p in sweep.analysed_points:
            n = point_sessions(p.results).get(arch)
            if n is None:
                continue
            cal = p.results.calibration_at_load.get(arch)
            steps.append(LoadStep(p.id, None if cal is None else cal.get("live_sessions_max"),
                                  None if cal is None else cal.get("live_sessions_mean"),
                                  n["ok"], n["saturated"],
                                  None if cal is None else bool(cal.get("ok"))))
        limits.append(MeasuringLimit(arch, tuple(steps)))
    return limits


def analyse_sweep(directory: str | Path | Sweep, boot: Bootstrap = Bootstrap(),
                  model: EModel = EModel()) -> SweepAnalysis:
    """Each analysed point's statistics (analysis.stats.compute_stats: successful sessions
    measured while the host kept up), a Cell per (point, architecture, metric) judged within
    the sweep's family (analysis/family.py), and for a sweep of one numeric parameter a
    Crossover per (architecture but the baseline, metric)."""
    sweep = directory if isinstance(directory, Sweep) else load_sweep(directory)
    cells, stats = {}, {}
    for p in sweep.analysed_points:
        stats[p.id] = compute_stats(p.results, boot, model)
        for c in _cells(p, stats[p.id], sweep.architectures, sweep.baseline):
            cells[(c.point, c.architecture, c.metric)] = c
    cells, family = adjusted(cells)
    analysis = SweepAnalysis(sweep, cells, [], boot, model, stats, family)
    param = sweep.parameters[0]
    if len(sweep.parameters) == 1 and param.numeric:
        for arch in sweep.architectures:
            if arch == sweep.baseline:
                continue
            for metric in SWEEP_METRICS:
                pts = list(analysis.series(arch, metric))
                analysis.crossovers.append(crossover(param, arch, sweep.baseline, metric, pts))
    return analysis


def warnings(analysis: SweepAnalysis) -> list[str]:
    """What a reader must know before trusting the sweep's numbers."""
    s, out = analysis.sweep, []
    skipped = [p for p in s.points if not p.analysed]
    if skipped:
        listed = "; ".join(f"{p.id} ({s.where(p)}) {p.status}"
                           + (f": {p.problem}" if p.problem else "") for p in skipped)
        out.append(f"{len(skipped)} of {len(s.points)} points not analysed ({listed}): listed "
                   f"below, never plotted or used for a crossover.")
    for p in s.analysed_points:
        r = p.results
        if r.missing_text():
            out.append(f"{p.id} ({s.where(p)}): incomplete: {r.missing_text()}.")
        bad = [a for a, c in r.calibration_at_load.items() if not c.get("ok", False)]
        if bad:
            out.append(f"{p.id} ({s.where(p)}): calibration at load FAILED for "
                       f"{', '.join(bad)}: the world was not the configured one while they ran.")
    hit = [f"{p.id} {a}: {n['saturated']} of {n['ok']}" for p in s.analysed_points
           for a, n in point_sessions(p.results).items() if n["saturated"]]
    if hit:
        out.append(f"Host saturated at some points ({', '.join(hit)}): those sessions are left "
                   f"out of every statistic (see Sessions per point).")
    return out
