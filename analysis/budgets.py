"""Latency budgets for CI: check a results folder against analysis/budgets.yaml.

Each budget bounds one percentile of one metric of one architecture: absolutely (``max``,
``min``), relative to the baseline architecture (``max_over_baseline``: the percentile minus the
baseline's), or relative to what the configured world implies (``min_share_of_implied``: the
architecture's advantage over the baseline is at least this share of the advantage the network
floors of the same sessions imply). ``success_pct`` takes no percentile.

A budget fails when its whole bootstrap 95% interval is beyond the limit (analysis.stats, the
report's bootstrap and seed): a p95 of six sessions is one session, and one session that lost a
handshake packet must not fail CI, while a regression that moves every session does. A value
beyond the limit whose interval still reaches back inside is "over, not significant".

Every verdict also carries the smallest regression the budget detects with 80% power at the
run's sample size, from the run's own spread (analysis/power.py says how).

Fault budgets (the budgets file's ``faults`` section, checked on a run of its own scenario)
bound one column of a fault's row in faults.csv (analysis/faults.py): a fault happens once per
run, so the value is judged as measured, without an interval. A budget whose fault row is
missing, not applicable, or lacks the value fails: a fault that did not hit anything proves
nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis.faults import FAULT_METRICS, fault_rows, read_faults_csv
from analysis import archinfo
from analysis.load import ResultsError, as_bool, load_results
from analysis.power import Power, detectable, detectable_failure_rate, simulated_run
from analysis.stats import OVER_FLOOR, Bootstrap, bootstrap_ci, bootstrap_diff_ci, percentile
from voiceedge.errors import ConfigError

BUDGETS_FILE = Path(__file__).with_name("budgets.yaml")
# Relative paths in a budgets file resolve against the folder that holds the analysis and
# scenarios packages (the repository, or site-packages in a non-editable install), never the
# working directory.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
# The network-floor column that goes with a metric, for ``min_share_of_implied``.
FLOOR_OF = {"setup_ms": "floor_setup_ms", "first_ice_rtt_ms": "floor_media_rtt_ms",
            "rtt_ms": "floor_media_rtt_ms", "signaling_ms": "floor_signaling_rtt_ms"}
_METRICS = {"setup_ms", "first_ice_rtt_ms", "signaling_ms", "first_audio_ms", "rtt_ms",
            "jitter_ms", "loss_pct", "success_pct", *OVER_FLOOR}
_BOUNDS = ("max", "min", "max_over_baseline", "min_share_of_implied")
_UPPER = ("max", "max_over_baseline")  # bounds a regression pushes the statistic up against


class BudgetError(ConfigError):
    """A budgets file or results folder the gate cannot use."""


@dataclass(frozen=True)
class Budget:
    architecture: str
    metric: str
    percentile: float | None = None
    max: float | None = None
    min: float | None = None
    max_over_baseline: float | None = None
    min_share_of_implied: float | None = None

    @property
    def bound(self) -> str:
        """Which bound the budget sets: one of max, min, max_over_baseline,
        min_share_of_implied."""
        return next(b for b in _BOUNDS if getattr(self, b) is not None)

    @property
    def value(self) -> float:
        return getattr(self, self.bound)

    @property
    def upper(self) -> bool:
        """True when the statistic must stay below the limit (a regression raises it)."""
        return self.bound in _UPPER

    def describe(self) -> str:
        p = "" if self.percentile is None else f" p{self.percentile:g}"
        if self.bound == "max_over_baseline":
            return f"{self.metric}{p} - baseline{p} <= {self.value:+g}"
        if self.bound == "min_share_of_implied":
            return (f"{self.metric}{p} advantage over baseline >= {self.value:.0%} of "
                    f"implied")
        return f"{self.metric}{p} " + (f"<= {self.value:g}" if self.upper else f">= {self.value:g}")


@dataclass(frozen=True)
class FaultBudget:
    """A bound on one faults.csv column of a fault (its ``fault`` id, or every fault of that
    ``kind``) in an architecture (``*``: each one the fault applies to); ``redis`` picks relay
    kills with or without Redis."""

    fault: str
    metric: str
    architecture: str = "*"
    max: float | None = None
    min: float | None = None
    redis: bool | None = None

    percentile = None  # one value per fault, no percentile

    @property
    def bound(self) -> str:
        return "max" if self.max is not None else "min"

    @property
    def value(self) -> float:
        return getattr(self, self.bound)

    @property
    def upper(self) -> bool:
        return self.bound == "max"

    def describe(self) -> str:
        which = self.fault + {True: " (Redis)", False: " (no Redis)", None: ""}[self.redis]
        return f"{which}: {self.metric} " + (
            f"<= {self.value:g}" if self.upper else f">= {self.value:g}")


@dataclass(frozen=True)
class ConversationBudgets:
    """The budgets file's ``conversation`` section: the conversation scenario, its region, and
    budgets on the turns' figures (analysis/conversation.py METRICS; max or min of a
    percentile over the turns)."""

    scenario: str
    region: str
    budgets: tuple[Budget, ...]

    def scenario_path(self) -> Path:
        path = Path(self.scenario)
        return path if path.is_absolute() else PACKAGE_ROOT / path


@dataclass(frozen=True)
class FaultBudgets:
    """The budgets file's ``faults`` section: the fault scenario, its region, its budgets."""

    scenario: str
    region: str
    budgets: tuple[FaultBudget, ...]

    def scenario_path(self) -> Path:
        path = Path(self.scenario)
        return path if path.is_absolute() else PACKAGE_ROOT / path


@dataclass
class Verdict:
    budget: Budget | FaultBudget
    architecture: str
    measured: float | None
    ci: tuple[float, float] | None
    limit: float | None
    margin: float | None
    ok: bool
    note: str = ""
    sessions: int = 0
    # The smallest regression detected with 80% power (ms, % ...; for success_pct: the
    # per-session failure rate, %), and the share of clean re-runs that fail.
    detectable: float | None = None
    false_alarm: float | None = None
    fault: str = ""  # fault budgets: the fault row's id

    @property
    def set(self) -> str:
        """'latency', 'fault' or 'conversation': which budgets the verdict belongs to."""
        if isinstance(self.budget, FaultBudget):
            return "fault"
        return "latency" if self.budget.metric in _METRICS else "conversation"


def read_budgets_yaml(path: Path):
    """A budgets file's YAML document; BudgetError (one line) when it is missing or not YAML."""
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise BudgetError(f"budgets file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise BudgetError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None


@dataclass(frozen=True)
class BudgetFile:
    scenario: str
    region: str
    budgets: tuple[Budget, ...]
    faults: FaultBudgets | None = None
    conversation: ConversationBudgets | None = None
    mobility: FaultBudgets | None = None   # fault budgets on the mobility scenario's run

    @classmethod
    def load(cls, path: str | Path = BUDGETS_FILE) -> "BudgetFile":
        path = Path(path)
        doc = read_budgets_yaml(path)
        if not isinstance(doc, dict):
            raise BudgetError(f"{path}: must be a mapping with scenario, region and budgets")
        budgets = [_budget(path, n, raw) for n, raw in enumerate(doc.get("budgets") or [])]
        if not budgets:
            raise BudgetError(f"{path}: no budgets")
        return cls(str(doc.get("scenario", "scenarios/ci.yaml")), str(doc.get("region", "")),
                   tuple(budgets), _fault_budgets(path, doc.get("faults")),
                   _conversation_budgets(path, doc.get("conversation")),
                   _fault_budgets(path, doc.get("mobility"), "mobility"))

    def scenario_path(self) -> Path:
        """The scenario file: absolute, or relative to the installed packages' folder."""
        path = Path(self.scenario)
        return path if path.is_absolute() else PACKAGE_ROOT / path


def _budget(path: Path, n: int, raw) -> Budget:
    try:
        b = Budget(**raw)
    except TypeError as exc:
        raise BudgetError(f"{path}: budget {n + 1}: {exc}") from None
    bounds = [x for x in _BOUNDS if getattr(b, x) is not None]
    if b.metric not in _METRICS or len(bounds) != 1 or (
            b.metric != "success_pct" and b.percentile is None):
        raise BudgetError(f"{path}: budget {n + 1} ({raw}): needs a known metric, one "
                          "bound, and a percentile (except success_pct)")
    if b.bound == "min_share_of_implied" and (
            b.metric not in FLOOR_OF or not 0 < b.min_share_of_implied <= 1):
        raise BudgetError(f"{path}: budget {n + 1} ({raw}): min_share_of_implied needs a "
                          f"share in (0, 1] and one of {', '.join(FLOOR_OF)}")
    if b.metric == "success_pct" and b.bound not in ("max", "min"):
        raise BudgetError(f"{path}: budget {n + 1} ({raw}): success_pct takes max or min")
    return b


def _fault_budgets(path: Path, doc, section: str = "faults") -> FaultBudgets | None:
    if doc is None:
        return None
    if not isinstance(doc, dict) or not doc.get("scenario") or not doc.get("budgets"):
        raise BudgetError(f"{path}: {section}: needs a scenario and budgets")
    budgets = []
    for n, raw in enumerate(doc["budgets"]):
        try:
            b = FaultBudget(**raw)
        except TypeError as exc:
            raise BudgetError(f"{path}: fault budget {n + 1}: {exc}") from None
        if b.metric not in FAULT_METRICS or (b.max is None) == (b.min is None) or not b.fault:
            raise BudgetError(f"{path}: fault budget {n + 1} ({raw}): needs a fault (id or "
                              f"kind), one bound (max or min) and a faults.csv column: "
                              f"{', '.join(FAULT_METRICS)}")
        budgets.append(b)
    return FaultBudgets(str(doc["scenario"]), str(doc.get("region", "")), tuple(budgets))


def _conversation_budgets(path: Path, doc) -> ConversationBudgets | None:
    from analysis.conversation import METRICS

    if doc is None:
        return None
    if not isinstance(doc, dict) or not doc.get("scenario") or not doc.get("budgets"):
        raise BudgetError(f"{path}: conversation: needs a scenario and budgets")
    budgets = []
    for n, raw in enumerate(doc["budgets"]):
        try:
            b = Budget(**raw)
        except TypeError as exc:
            raise BudgetError(f"{path}: conversation budget {n + 1}: {exc}") from None
        bounds = [x for x in _BOUNDS if getattr(b, x) is not None]
        if b.metric not in METRICS or bounds not in (["max"], ["min"]) or b.percentile is None:
            raise BudgetError(f"{path}: conversation budget {n + 1} ({raw}): needs one of "
                              f"{', '.join(METRICS)}, a percentile and one bound (max or min)")
        budgets.append(b)
    return ConversationBudgets(str(doc["scenario"]), str(doc.get("region", "")),
                               tuple(budgets))


def check_conversation(results: Path, budgets: ConversationBudgets,
                       boot: Bootstrap = Bootstrap()) -> list[Verdict]:
    """Every conversation budget against a results folder with turns.csv: a percentile over
    the turns of each architecture (turns of saturated sessions left out), with its
    bootstrap interval by client region."""
    from analysis.conversation import load

    turns = load(Path(results))
    if turns is None:
        raise BudgetError(f"{results} has no turns.csv: not a conversation run")
    turns = turns.assign(ok=True)
    archs = list(dict.fromkeys(turns.architecture))
    baseline = _baseline(Path(results))
    return [check_one(turns, b, arch, baseline, boot, power=None)
            for b in budgets.budgets
            for arch in (archs if b.architecture == "*" else [b.architecture])]


def _sessions(results: Path) -> pd.DataFrame:
    path = results / "sessions.csv"
    if not path.is_file():
        raise BudgetError(f"{results} is not a results folder (no sessions.csv)")
    frame = pd.read_csv(path)
    for col in ("architecture", "ok"):
        if col not in frame.columns:
            raise BudgetError(f"{path} lacks column {col}")
    frame["ok"] = as_bool(frame["ok"])
    for name, (measured, floor) in OVER_FLOOR.items():
        if measured in frame.columns and floor in frame.columns:
            frame[name] = pd.to_numeric(frame[measured], errors="coerce") - pd.to_numeric(
                frame[floor], errors="coerce")
    return frame


def _baseline(results: Path) -> str:
    return archinfo.read(results).baseline


@dataclass(frozen=True)
class _Group:
    """One architecture's values of a metric over its successful sessions, with regions."""

    values: np.ndarray
    strata: np.ndarray | None

    @classmethod
    def of(cls, sessions: pd.DataFrame, column: str) -> "_Group":
        ok = sessions[sessions.ok]
        if column not in ok.columns:
            return cls(np.array([]), None)
        values = pd.to_numeric(ok[column], errors="coerce").to_numpy(dtype=float)
        keep = ~np.isnan(values)
        strata = (ok["client_region"].astype(str).to_numpy()[keep]
                  if "client_region" in ok.columns else None)
        return cls(values[keep], strata)


def _statistic(b: Budget, a: _Group, base: _Group | None,
               boot: Bootstrap) -> tuple[float, float, float]:
    """The budget's statistic and its bootstrap interval: the percentile (absolute bounds),
    the percentile minus the baseline's (max_over_baseline), or the baseline's minus the
    architecture's, the advantage (min_share_of_implied)."""
    q = b.percentile
    if b.bound in ("max", "min"):
        lo, hi = bootstrap_ci(a.values, (q,), boot, a.strata)
        return percentile(a.values, q), float(lo[0]), float(hi[0])
    if b.bound == "max_over_baseline":
        d = bootstrap_diff_ci(a.values, base.values, q, boot, a.strata, base.strata)
    else:
        d = bootstrap_diff_ci(base.values, a.values, q, boot, base.strata, a.strata)
    return d.estimate, d.lo, d.hi


def _limit(b: Budget, arch_rows: pd.DataFrame, base_rows: pd.DataFrame | None
           ) -> tuple[float | None, str]:
    """The limit, or None and why there is none."""
    if b.bound != "min_share_of_implied":
        return b.value, ""
    floor = FLOOR_OF[b.metric]
    implied_base = percentile(_Group.of(base_rows, floor).values, b.percentile)
    implied_arch = percentile(_Group.of(arch_rows, floor).values, b.percentile)
    if implied_base is None or implied_arch is None:
        return None, f"no {floor} recorded"
    implied = implied_base - implied_arch
    if implied <= 0:
        # The claim is "this architecture is faster, as the configured paths say it should
        # be"; in a world where they say it is not, the budget must be revised, not passed.
        return None, (f"the configured paths imply no advantage ({implied:+.1f} ms); "
                      f"revise this budget for this world")
    return b.min_share_of_implied * implied, ""


def _detectable(b: Budget, a: _Group, base: _Group | None, limit: float, boot: Bootstrap,
                power: Power, sessions: int | None) -> tuple[float, float]:
    """The gate's decision rule on simulated runs (analysis/power.py)."""
    rng = np.random.default_rng([boot.seed, 1])  # derived from the one seed, its own stream
    needed = []
    for _ in range(power.runs):
        va, sa = simulated_run(a.values, a.strata, rng, sessions)
        sim_base = None
        if base is not None:
            sim_base = _Group(*simulated_run(base.values, base.strata, rng, sessions))
        _, lo, hi = _statistic(b, _Group(va, sa), sim_base, boot)
        needed.append(limit - lo if b.upper else hi - limit)
    found = detectable(needed, power.power)
    return found.regression, found.false_alarm


def _judge(b: Budget, arch: str, measured: float, ci, limit: float, sessions: int) -> Verdict:
    margin = (limit - measured) if b.upper else (measured - limit)
    ok, note = margin >= 0, ""
    if not ok and ci is not None and (ci[0] <= limit if b.upper else ci[1] >= limit):
        ok, note = True, "over, not significant"
    return Verdict(b, arch, round(measured, 2), None if ci is None else
                   (round(ci[0], 2), round(ci[1], 2)), round(limit, 2), round(margin, 2), ok,
                   note, sessions)


def check_one(frame: pd.DataFrame, b: Budget, arch: str, baseline: str,
              boot: Bootstrap = Bootstrap(), power: Power | None = Power(),
              sessions: int | None = None) -> Verdict:
    """The verdict of one budget for one architecture of a run's sessions."""
    mine = frame[frame.architecture == arch]
    if mine.empty:
        return Verdict(b, arch, None, None, None, None, False, "not in this run")
    if b.metric == "success_pct":
        n = len(mine)
        v = _judge(b, arch, 100.0 * int(mine.ok.sum()) / n, None, b.value, n)
        if power is not None and not b.upper:
            v.detectable = round(detectable_failure_rate(sessions or n, b.value, power.power), 1)
        return v
    a = _Group.of(mine, b.metric)
    if a.values.size == 0:
        return Verdict(b, arch, None, None, None, None, False, "no values")
    base_rows, base = None, None
    if b.bound in ("max_over_baseline", "min_share_of_implied"):
        base_rows = frame[frame.architecture == baseline]
        base = _Group.of(base_rows, b.metric)
        if base.values.size == 0:
            return Verdict(b, arch, None, None, None, None, False,
                           f"no baseline ({baseline}) values", a.values.size)
    limit, why = _limit(b, mine, base_rows)
    if limit is None:
        return Verdict(b, arch, None, None, None, None, False, why, a.values.size)
    measured, lo, hi = _statistic(b, a, base, boot)
    v = _judge(b, arch, measured, (lo, hi), limit, a.values.size)
    if power is not None:
        found, false_alarm = _detectable(b, a, base, limit, boot, power, sessions)
        v.detectable, v.false_alarm = round(found, 2), round(false_alarm, 3)
    return v


def check(results: Path, budgets: BudgetFile, boot: Bootstrap = Bootstrap(),
          power: Power | None = Power(), sessions: int | None = None) -> list[Verdict]:
    """Every budget against a results folder. ``sessions``: estimate the detectable
    regressions for runs of that many sessions per client region instead of the run's own."""
    frame = _sessions(Path(results))
    baseline = _baseline(Path(results))
    archs = list(dict.fromkeys(frame.architecture))
    out = []
    for b in budgets.budgets:
        for arch in (archs if b.architecture == "*" else [b.architecture]):
            out.append(check_one(frame, b, arch, baseline, boot, power, sessions))
    return out


def fault_table(results: Path) -> list[dict]:
    """The rows of a fault run: its faults.csv, or computed from faults.json when the run did
    not write one."""
    results = Path(results)
    if (results / "faults.csv").is_file():
        return read_faults_csv(results / "faults.csv")
    if (results / "faults.json").is_file():
        try:
            return fault_rows(load_results(results))
        except ResultsError as exc:
            raise BudgetError(str(exc)) from None
    raise BudgetError(f"{results} has no faults.csv or faults.json: not a run with faults")


def _fault_verdict(b: FaultBudget, row: dict) -> Verdict:
    arch, fault = str(row.get("architecture")), str(row.get("fault"))
    affected = row.get("sessions_affected")
    n = 0 if affected is None else int(affected)
    if not row.get("applicable"):
        return Verdict(b, arch, None, None, b.value, None, False,
                       f"not applicable: {row.get('note') or '-'}", n, fault=fault)
    value = row.get(b.metric)
    if value is None:
        return Verdict(b, arch, None, None, b.value, None, False,
                       f"not measured: {row.get('note') or 'no value'}", n, fault=fault)
    margin = (b.value - value) if b.upper else (value - b.value)
    return Verdict(b, arch, round(float(value), 3), None, b.value, round(margin, 3),
                   margin >= 0, "", n, fault=fault)


def check_faults_rows(rows: list[dict], budgets: tuple[FaultBudget, ...]) -> list[Verdict]:
    """Every fault budget against the rows of faults.csv (see ``check_faults``)."""
    out = []
    for b in budgets:
        named = [r for r in rows if r.get("fault") == b.fault]
        mine = named or [r for r in rows if r.get("kind") == b.fault]
        if b.redis is not None:
            mine = [r for r in mine if r.get("redis") is b.redis]
        if b.architecture != "*":
            mine = [r for r in mine if r.get("architecture") == b.architecture]
        elif any(r.get("applicable") for r in mine):
            mine = [r for r in mine if r.get("applicable")]  # "*": where the fault applies
        if not mine:
            out.append(Verdict(b, b.architecture, None, None, b.value, None, False,
                               "no such fault in this run", fault=b.fault))
        out += [_fault_verdict(b, r) for r in mine]
    return out


def check_faults(results: Path, budgets: FaultBudgets | tuple[FaultBudget, ...]
                 ) -> list[Verdict]:
    """Every fault budget against a fault run's faults.csv: one verdict per matching row; a
    budget without a row, on a row that does not apply, or without a value fails."""
    if isinstance(budgets, FaultBudgets):
        budgets = budgets.budgets
    return check_faults_rows(fault_table(results), budgets)


def _detects(v: Verdict) -> str:
    if v.detectable is None or (not v.ok and v.margin is not None):
        return "-"  # nothing to detect from a run that already fails
    if v.budget.metric == "success_pct":
        return "-" if math.isinf(v.detectable) else f"{v.detectable:g}% failing"
    text = f"{v.detectable:+.3g}"
    if v.false_alarm is not None and v.false_alarm >= 0.05:
        text += f" (fails {v.false_alarm:.0%} of re-runs)"
    return text


def _verdict_text(v: Verdict) -> str:
    return (f"ok ({v.note})" if v.note else "ok") if v.ok else f"[red]OVER[/red] {v.note}"


def print_fault_table(verdicts: list[Verdict], title: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, caption="one value per fault and architecture, as measured "
                  "(faults.csv, docs/faults.md); a fault that is missing, not applicable or "
                  "not measured fails its budgets")
    for col in ("fault", "architecture", "budget", "affected", "measured", "limit", "margin",
                ""):
        table.add_column(col, justify="left" if col in ("fault", "architecture", "budget")
                         else "right")
    for v in verdicts:
        table.add_row(escape(v.fault), escape(v.architecture), escape(v.budget.describe()),
                      str(v.sessions), "-" if v.measured is None else f"{v.measured:g}",
                      "-" if v.limit is None else f"{v.limit:g}",
                      "-" if v.margin is None else f"{v.margin:+g}",
                      _verdict_text(v) if v.ok else f"[red]OVER[/red] {escape(v.note)}")
    Console(width=max(Console().width, 150)).print(table)


def print_table(verdicts: list[Verdict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption="detects: the smallest regression (a shift of every "
                  "session, in the metric's unit; success: a per-session failure rate) failing "
                  "the budget in 80% of simulated runs of this size; re-runs: simulated clean "
                  "runs that fail (docs/budgets.md)")
    for col in ("architecture", "budget", "n", "measured", "95% CI", "limit", "margin",
                "detects", ""):
        table.add_column(col, justify="left" if col in ("architecture", "budget") else "right")
    for v in verdicts:
        ci = "-" if v.ci is None else f"{v.ci[0]:g} .. {v.ci[1]:g}"
        table.add_row(v.architecture, v.budget.describe(), str(v.sessions),
                      "-" if v.measured is None else f"{v.measured:g}", ci,
                      "-" if v.limit is None else f"{v.limit:g}",
                      "-" if v.margin is None else f"{v.margin:+g}", _detects(v),
                      _verdict_text(v))
    Console(width=max(Console().width, 150)).print(table)


def to_json(verdicts: list[Verdict]) -> str:
    from analysis.jsonout import dumps

    return dumps([{"set": v.set, "architecture": v.architecture, "budget": v.budget.describe(),
                   "metric": v.budget.metric, "percentile": v.budget.percentile,
                   "bound": v.budget.bound, "sessions": v.sessions, "measured": v.measured,
                   "ci": v.ci, "limit": v.limit, "margin": v.margin, "ok": v.ok, "note": v.note,
                   "detectable_regression": v.detectable, "false_alarm": v.false_alarm}
                  | ({"fault": v.fault} if v.set == "fault" else {})
                  for v in verdicts])
