"""Budgets over a sweep: a bound that must hold at every point of a sweep folder whose
parameters match a condition (the budgets file's ``sweep_budgets`` section, checked by
``voiceedge budgets --sweep DIR``; docs/budgets.md, "Budgets over a sweep").

    sweep_budgets:
      - {architecture: global-relay, metric: first_ice_rtt_ms, percentile: 50,
         max_over_baseline: -20, where: {public_internet.rtt_scale: ">= 1.2"}}

A budget bounds, at each point in its range, the architecture's median of a metric of the sweep
analysis (analysis/sweep.py: ``max``, ``min``) or its difference from the baseline's median
(``max_over_baseline``, ``min_over_baseline``), judged on the estimate; the bootstrap CI is
reported with it, not used. ``where`` picks the points: per parameter a comparison (``>= 1.2``,
``<= 1.4``, ``== 1.0``, ``> x``, ``< x``, several joined by commas, or a plain value: ``==``);
without it, every point of the sweep.

A budget over a sweep must hold where it says: it FAILS when a point in its range was not
measured (not calibrated, pending, its folder unreadable) or has no value, and when no point is
in its range (nothing proves it).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from analysis.budgets import BUDGETS_FILE, BudgetError, read_budgets_yaml
from analysis.stats import Bootstrap
from analysis.sweep import SWEEP_METRICS, Parameter, Point, Sweep, SweepAnalysis, \
    analyse_sweep, load_sweep

SECTION = "sweep_budgets"
_BOUNDS = ("max", "min", "max_over_baseline", "min_over_baseline")
_UPPER = ("max", "max_over_baseline")
_RELATIVE = ("max_over_baseline", "min_over_baseline")
_FIELDS = {"architecture", "metric", "percentile", "where", *_BOUNDS}
_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        "<": lambda a, b: a < b}
_OP = re.compile(r"^(>=|<=|==|>|<)\s*(.*)$", re.S)
# A comma starts a new comparison only when an operator follows it (">= 1.2, <= 1.4"), so that
# "== [na-east, eu-west]" stays one value.
_AND = re.compile(r",\s*(?=(?:>=|<=|==|>|<))")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _show(x) -> str:
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(map(str, x)) + "]"
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Condition:
    """One comparison of a parameter's value: ``op`` one of >=, <=, ==, >, <."""

    op: str
    operand: object

    def holds(self, value) -> bool:
        if self.op == "==":
            if _number(value) and _number(self.operand):
                return math.isclose(value, self.operand, rel_tol=1e-9, abs_tol=1e-12)
            if isinstance(value, (list, tuple)) and isinstance(self.operand, (list, tuple)):
                return list(value) == list(self.operand)
            return value == self.operand
        return _number(value) and _OPS[self.op](value, self.operand)

    def text(self) -> str:
        return f"{self.op} {_show(self.operand)}"


def _scalar(text: str):
    """A comparison's operand as YAML reads it: '1.2' a number, 'x' a string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_conditions(raw) -> tuple[Condition, ...]:
    """A ``where`` entry: '>= 1.2', '>= 1.2, <= 1.4', '== 1.0', a plain value (==).
    ValueError (one line) for a comparison that cannot be read."""
    if isinstance(raw, str) and raw.strip()[:1] in ("<", ">", "=", "!"):
        out = []
        for part in _AND.split(raw.strip()):
            m = _OP.match(part.strip())
            operand = _scalar(m.group(2)) if m and m.group(2).strip() else None
            if m is None or operand is None:
                raise ValueError(f"{raw!r} is not a comparison (use >=, <=, ==, >, < and a "
                                 f"value, e.g. '>= 1.2', or a plain value)")
            if m.group(1) != "==" and not _number(operand):
                raise ValueError(f"{raw!r}: {m.group(1)} needs a number")
            out.append(Condition(m.group(1), operand))
        return tuple(out)
    if raw is None or isinstance(raw, dict):
        raise ValueError(f"{raw!r} is not a comparison or a value")
    return (Condition("==", _scalar(raw) if isinstance(raw, str) else raw),)


@dataclass(frozen=True)
class SweepBudget:
    """A bound on one architecture's median (or its difference from the baseline's) at every
    point of a sweep whose parameters satisfy ``where`` (parameter name -> conditions)."""

    architecture: str
    metric: str
    percentile: float = 50
    max: float | None = None
    min: float | None = None
    max_over_baseline: float | None = None
    min_over_baseline: float | None = None
    where: tuple[tuple[str, tuple[Condition, ...]], ...] = ()

    @property
    def bound(self) -> str:
        return next(b for b in _BOUNDS if getattr(self, b) is not None)

    @property
    def value(self) -> float:
        return float(getattr(self, self.bound))

    @property
    def upper(self) -> bool:
        """True when the value must stay at or below the limit."""
        return self.bound in _UPPER

    @property
    def relative(self) -> bool:
        return self.bound in _RELATIVE

    def describe(self) -> str:
        p = f" p{self.percentile:g}"
        rel = " <= " if self.upper else " >= "
        if self.relative:
            return f"{self.metric}{p} - baseline{p}{rel}{self.value:+g}"
        return f"{self.metric}{p}{rel}{self.value:g}"

    def where_text(self, short: bool = False) -> str:
        """'public_internet.rtt_scale >= 1.2' ('rtt_scale >= 1.2' when short)."""
        if not self.where:
            return "every point"
        return ", ".join(f"{name.split('.')[-1] if short else name} {c.text()}"
                         for name, conds in self.where for c in conds)

    def matches(self, point: Point, names: dict[str, str]) -> bool:
        """``names``: the where keys resolved to the sweep's parameter names."""
        return all(c.holds(point.values[names[key]]) for key, conds in self.where
                   for c in conds)


def _sweep_budget(path: Path, n: int, raw) -> SweepBudget:
    head = f"{path}: sweep budget {n + 1}"
    if not isinstance(raw, dict):
        raise BudgetError(f"{head}: not a mapping ({raw!r})")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise BudgetError(f"{head}: unknown key(s) {', '.join(map(str, unknown))} (use "
                          f"architecture, metric, percentile, where and one of "
                          f"{', '.join(_BOUNDS)})")
    arch, metric = raw.get("architecture"), raw.get("metric")
    if not isinstance(arch, str) or not arch:
        raise BudgetError(f"{head}: needs an architecture")
    if metric not in SWEEP_METRICS:
        raise BudgetError(f"{head}: metric {metric!r} is not one the sweep analysis has "
                          f"({', '.join(SWEEP_METRICS)})")
    percentile = raw.get("percentile", 50)
    if not _number(percentile) or percentile != 50:
        raise BudgetError(f"{head}: percentile {percentile!r}: only percentile 50 (the sweep "
                          f"analysis computes medians)")
    bounds = [b for b in _BOUNDS if raw.get(b) is not None]
    if len(bounds) != 1 or not _number(raw[bounds[0]]) or not math.isfinite(raw[bounds[0]]):
        raise BudgetError(f"{head}: needs exactly one bound, a number: one of "
                          f"{', '.join(_BOUNDS)}")
    where_raw = raw.get("where")
    if where_raw is None:
        where_raw = {}
    if not isinstance(where_raw, dict):
        raise BudgetError(f"{head}: where must map parameter names to comparisons, e.g. "
                          "{public_internet.rtt_scale: '>= 1.2'}")
    where = []
    for name, cond in where_raw.items():
        try:
            where.append((str(name), parse_conditions(cond)))
        except ValueError as exc:
            raise BudgetError(f"{head}: where {name}: {exc}") from None
    return SweepBudget(arch, metric, float(percentile),
                       **{bounds[0]: float(raw[bounds[0]])}, where=tuple(where))


def load_sweep_budgets(path: str | Path = BUDGETS_FILE) -> tuple[SweepBudget, ...]:
    """The budgets file's ``sweep_budgets`` section. BudgetError (one line) for a file without
    one, or with a budget that cannot be read; the rest of the file is not read."""
    path = Path(path)
    doc = read_budgets_yaml(path)
    raw = doc.get(SECTION) if isinstance(doc, dict) else None
    if raw is None:
        raise BudgetError(f"{path} has no sweep budgets (a '{SECTION}' section)")
    if not isinstance(raw, list) or not raw:
        raise BudgetError(f"{path}: '{SECTION}' must be a non-empty list of budgets")
    return tuple(_sweep_budget(path, n, b) for n, b in enumerate(raw))


# ------------------------------------------------------------------ checking

@dataclass
class PointValue:
    """A budget's value at one point of its range; ``value`` None where there is none (the
    point was not measured, or has no sessions of the architecture or the baseline)."""

    point: str
    where: str  # 'rtt_scale 1.2'
    values: dict
    status: str
    value: float | None
    ci: tuple[float, float] | None
    n: int
    n_baseline: int | None
    limit: float
    margin: float | None
    ok: bool
    note: str = ""

    @property
    def label(self) -> str:
        return f"{self.point} ({self.where})"


@dataclass
class SweepVerdict:
    budget: SweepBudget
    architecture: str
    ok: bool
    note: str
    worst: PointValue | None  # the point with the smallest margin (with a value)
    points: list[PointValue] = field(default_factory=list)


def _resolve(budget: SweepBudget, parameters: tuple[Parameter, ...]) -> dict[str, str]:
    """The where keys as the sweep's parameter names (a key may be the full name or, when it
    is not ambiguous, the short label: rtt_scale). BudgetError for anything else."""
    names = {p.name: p for p in parameters}
    out = {}
    for key, conds in budget.where:
        if key in names:
            param = names[key]
        else:
            by_label = [p for p in parameters if p.label == key]
            if len(by_label) != 1:
                raise BudgetError(f"sweep budget ({budget.architecture}, {budget.describe()}): "
                                  f"where names {key!r}, not a parameter of this sweep "
                                  f"({', '.join(names)})")
            param = by_label[0]
        if any(c.op != "==" for c in conds) and not param.numeric:
            raise BudgetError(f"sweep budget ({budget.architecture}, {budget.describe()}): "
                              f"where {key}: {param.name}'s values are not numbers; use == or "
                              f"a plain value")
        out[key] = param.name
    return out


def _architectures(budget: SweepBudget, sweep: Sweep) -> list[str]:
    archs = sweep.architectures
    if budget.architecture == "*":
        found = [a for a in archs if not (budget.relative and a == sweep.baseline)]
        if not found:
            raise BudgetError(f"sweep budget (*, {budget.describe()}): this sweep has no "
                              f"architecture to check it on")
        return found
    if budget.architecture not in archs:
        raise BudgetError(f"sweep budget ({budget.architecture}, {budget.describe()}): "
                          f"{budget.architecture} is not an architecture of this sweep "
                          f"({', '.join(archs)})")
    if budget.relative and budget.architecture == sweep.baseline:
        raise BudgetError(f"sweep budget ({budget.architecture}, {budget.describe()}): "
                          f"{budget.architecture} is the sweep's baseline; a bound over the "
                          f"baseline needs another architecture")
    return [budget.architecture]


def _digits(metric: str) -> int:
    return 3 if metric in ("mos", "loss_pct") else 2


def _at(analysis: SweepAnalysis, b: SweepBudget, arch: str, p: Point) -> PointValue:
    s = analysis.sweep
    blank = dict(point=p.id, where=s.where(p), values=dict(p.values), status=p.status,
                 limit=b.value)

    def missing(why: str, n: int = 0, n_base: int | None = None) -> PointValue:
        return PointValue(**blank, value=None, ci=None, n=n, n_baseline=n_base, margin=None,
                          ok=False, note=why)

    if not p.analysed:
        return missing(f"not measured: its folder cannot be read: {p.problem}" if p.problem
                       else f"not measured: {p.status}")
    cell = analysis.cell(p.id, arch, b.metric)
    if cell is None:
        return missing(f"{arch} not measured at this point")
    if b.relative:
        d = cell.diff
        if d is None:
            return missing(f"no baseline ({s.baseline}) at this point", cell.n)
        if math.isnan(d.estimate):
            return missing("no sessions to compare with the baseline's", d.n_a, d.n_b)
        value, ci, n, n_base = d.estimate, (d.lo, d.hi), d.n_a, d.n_b
    else:
        if not cell.n or math.isnan(cell.p50):
            return missing(f"no {b.metric} values of {arch}", cell.n)
        value, ci, n, n_base = cell.p50, (cell.lo, cell.hi), cell.n, None
    margin = (b.value - value) if b.upper else (value - b.value)
    k = _digits(b.metric)
    note = "status failed: measured" if p.status == "failed" else ""
    return PointValue(**blank, value=round(value, k), ci=(round(ci[0], k), round(ci[1], k)),
                      n=n, n_baseline=n_base, margin=round(margin, k), ok=margin >= 0,
                      note=note)


def _verdict(b: SweepBudget, arch: str, points: list[PointValue]) -> SweepVerdict:
    if not points:
        return SweepVerdict(b, arch, False, f"no point of the sweep has {b.where_text()}: "
                                            f"nothing proves the budget", None, [])
    valued = [p for p in points if p.value is not None]
    worst = min(valued, key=lambda p: p.margin) if valued else None
    over = [p for p in valued if not p.ok]
    unmeasured = [p for p in points if p.value is None]
    notes = []
    if over:
        notes.append(f"over at {len(over)} of {len(points)} points: "
                     + ", ".join(p.label for p in over))
    if unmeasured:
        notes.append("no value at " + "; ".join(f"{p.label}: {p.note}" for p in unmeasured))
    return SweepVerdict(b, arch, not notes, "; ".join(notes), worst, points)


def check_sweep(sweep: str | Path | Sweep | SweepAnalysis, budgets,
                boot: Bootstrap = Bootstrap()) -> list[SweepVerdict]:
    """Every sweep budget against a sweep folder (or its loaded Sweep, or its analysis): one
    verdict per budget and architecture. The budgets are matched against the sweep's
    parameters and architectures first (BudgetError, one line), before anything is computed."""
    if isinstance(sweep, SweepAnalysis):
        analysis, loaded = sweep, sweep.sweep
    else:
        analysis, loaded = None, sweep if isinstance(sweep, Sweep) else load_sweep(sweep)
    plan = [(b, _resolve(b, loaded.parameters), _architectures(b, loaded)) for b in budgets]
    if analysis is None:
        analysis = analyse_sweep(loaded, boot)
    out = []
    for b, names, archs in plan:
        in_range = [p for p in loaded.points if b.matches(p, names)]
        for arch in archs:
            out.append(_verdict(b, arch, [_at(analysis, b, arch, p) for p in in_range]))
    return out


# ------------------------------------------------------------------ output

def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _summary(v: SweepVerdict) -> str:
    """The verdict in a few words (the points' rows say which and why)."""
    if v.ok:
        return "[green]PASS[/green]"
    if not v.points:
        return "[red]FAIL[/red]: no point in range"
    over = sum(1 for p in v.points if p.value is not None and not p.ok)
    missing = sum(1 for p in v.points if p.value is None)
    parts = ([f"over at {over}"] if over else []) + (
        [f"no value at {missing}"] if missing else [])
    return f"[red]FAIL[/red]: {' and '.join(parts)} of {len(v.points)} points"


def print_sweep_table(verdicts: list[SweepVerdict], title: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, caption="value: the point's median (max/min) or its median "
                  "minus the baseline's (over_baseline), saturated sessions left out as in the "
                  "sweep's report; judged on the value, its bootstrap 95% CI shown, not used. "
                  "A point in range without a value, or a range without points, fails the "
                  "budget (docs/budgets.md)")
    for col in ("architecture", "budget", "point", "n", "value", "95% CI", "limit", "margin",
                ""):
        table.add_column(col, justify="left" if col in ("architecture", "budget", "point", "")
                         else "right")
    for i, v in enumerate(verdicts):
        if i:
            table.add_section()
        head = [escape(v.architecture), escape(f"{v.budget.describe()}\nwhere "
                                               f"{v.budget.where_text(short=True)}")]
        for p in v.points:
            n = str(p.n) if p.n_baseline is None else f"{p.n} / {p.n_baseline}"
            ci = "-" if p.ci is None else f"{p.ci[0]:g} .. {p.ci[1]:g}"
            mark = ("ok" if p.ok else "[red]OVER[/red]") if p.value is not None \
                else "[red]NO VALUE[/red]"
            if p.note:
                mark += f" ({escape(p.note.removeprefix('not measured: '))})"
            table.add_row(*head, escape(p.label), n, _num(p.value), ci, _num(p.limit),
                          "-" if p.margin is None else f"{p.margin:+g}", mark)
            head = ["", ""]
        w = v.worst
        table.add_row(*head, "[bold]worst: " + ("-" if w is None else escape(w.label))
                      + "[/bold]", "", "-" if w is None else _num(w.value), "",
                      _num(v.budget.value), "-" if w is None else f"{w.margin:+g}",
                      _summary(v))
    Console(width=max(Console().width, 150)).print(table)


def _point_json(p: PointValue) -> dict:
    return {"point": p.point, "values": p.values, "status": p.status, "value": p.value,
            "ci": p.ci, "n": p.n, "n_baseline": p.n_baseline, "limit": p.limit,
            "margin": p.margin, "ok": p.ok, "note": p.note}


def sweep_verdicts_json(verdicts: list[SweepVerdict]) -> list[dict]:
    return [{"set": "sweep", "architecture": v.architecture, "budget": v.budget.describe(),
             "metric": v.budget.metric, "percentile": v.budget.percentile,
             "bound": v.budget.bound, "limit": v.budget.value,
             "where": {name: [c.text() for c in conds] for name, conds in v.budget.where},
             "ok": v.ok, "note": v.note,
             "worst": None if v.worst is None else _point_json(v.worst),
             "points": [_point_json(p) for p in v.points]} for v in verdicts]


def to_json(verdicts: list[SweepVerdict]) -> str:
    from analysis.jsonout import dumps

    return dumps(sweep_verdicts_json(verdicts))
