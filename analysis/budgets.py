"""Latency budgets for CI: check a results folder against analysis/budgets.yaml.

Each budget bounds one percentile of one metric of one architecture (absolute, relative to the
port-per-session baseline, or above the network floor the topology implies). The check prints
a table: budget, measured value with a bootstrap 95% confidence interval, margin, verdict.

A percentile budget fails when its whole confidence interval is beyond the limit: a p95 of six
sessions is one session, and one session that lost a handshake packet (a DTLS retransmission)
must not fail CI, while a regression that moves every session does. A measured value beyond the
limit whose interval still reaches back inside is reported as "over, not significant".
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from voiceedge.errors import ConfigError

BUDGETS_FILE = Path(__file__).with_name("budgets.yaml")
BASELINE = "port-per-session"
_DERIVED = {"setup_over_floor_ms": ("setup_ms", "floor_setup_ms"),
            "first_ice_rtt_over_floor_ms": ("first_ice_rtt_ms", "floor_media_rtt_ms")}
_METRICS = {"setup_ms", "first_ice_rtt_ms", "signaling_ms", "first_audio_ms", "rtt_ms",
            "jitter_ms", "loss_pct", "success_pct", *_DERIVED}


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

    def describe(self) -> str:
        p = "" if self.percentile is None else f" p{self.percentile:g}"
        if self.max_over_baseline is not None:
            return f"{self.metric}{p} <= baseline {self.max_over_baseline:+g}"
        return f"{self.metric}{p} " + (f"<= {self.max:g}" if self.max is not None
                                       else f">= {self.min:g}")


@dataclass
class Verdict:
    budget: Budget
    architecture: str
    measured: float | None
    ci: tuple[float, float] | None
    limit: float | None
    margin: float | None
    ok: bool
    note: str = ""


@dataclass(frozen=True)
class BudgetFile:
    scenario: str
    region: str
    budgets: tuple[Budget, ...]

    @classmethod
    def load(cls, path: str | Path = BUDGETS_FILE) -> "BudgetFile":
        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise BudgetError(f"budgets file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise BudgetError(f"{path}: not valid YAML: {exc}") from None
        budgets = []
        for n, raw in enumerate(doc.get("budgets") or []):
            try:
                b = Budget(**raw)
            except TypeError as exc:
                raise BudgetError(f"{path}: budget {n + 1}: {exc}") from None
            bounds = [x for x in (b.max, b.min, b.max_over_baseline) if x is not None]
            if b.metric not in _METRICS or len(bounds) != 1 or (
                    b.metric != "success_pct" and b.percentile is None):
                raise BudgetError(f"{path}: budget {n + 1} ({raw}): needs a known metric, one "
                                  "bound, and a percentile (except success_pct)")
            budgets.append(b)
        if not budgets:
            raise BudgetError(f"{path}: no budgets")
        return cls(str(doc.get("scenario", "scenarios/ci.yaml")), str(doc.get("region", "")),
                   tuple(budgets))


def _sessions(results: Path) -> list[dict]:
    path = results / "sessions.csv"
    if not path.exists():
        raise BudgetError(f"{results} is not a results folder (no sessions.csv)")
    return list(csv.DictReader(open(path)))


def _values(rows: list[dict], metric: str) -> np.ndarray:
    ok = [r for r in rows if r["ok"] == "True"]
    if metric in _DERIVED:
        a, b = _DERIVED[metric]
        vals = [float(r[a]) - float(r[b]) for r in ok if r[a] and r[b]]
    else:
        vals = [float(r[metric]) for r in ok if r.get(metric)]
    return np.asarray(vals, dtype=float)


def percentile_ci(values: np.ndarray, q: float, resamples: int = 2000,
                  seed: int = 7) -> tuple[float, tuple[float, float]]:
    """The ``q`` percentile (numpy linear) and a bootstrap 95% interval."""
    point = float(np.percentile(values, q))
    rng = np.random.default_rng(seed)
    boots = np.percentile(rng.choice(values, size=(resamples, len(values))), q, axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return point, (float(lo), float(hi))


def check(results: Path, budgets: BudgetFile) -> list[Verdict]:
    rows = _sessions(results)
    archs = list(dict.fromkeys(r["architecture"] for r in rows))
    out = []
    for b in budgets.budgets:
        targets = archs if b.architecture == "*" else [b.architecture]
        for arch in targets:
            mine = [r for r in rows if r["architecture"] == arch]
            if not mine:
                out.append(Verdict(b, arch, None, None, None, None, False, "not in this run"))
                continue
            if b.metric == "success_pct":
                measured = 100.0 * sum(r["ok"] == "True" for r in mine) / len(mine)
                out.append(_verdict(b, arch, measured, None, b.min if b.min is not None else b.max))
                continue
            values = _values(mine, b.metric)
            if len(values) == 0:
                out.append(Verdict(b, arch, None, None, None, None, False, "no values"))
                continue
            measured, ci = percentile_ci(values, b.percentile)
            limit = b.max if b.max is not None else b.min
            if b.max_over_baseline is not None:
                base = _values([r for r in rows if r["architecture"] == BASELINE], b.metric)
                if len(base) == 0:
                    out.append(Verdict(b, arch, measured, ci, None, None, False, "no baseline"))
                    continue
                limit = float(np.percentile(base, b.percentile)) + b.max_over_baseline
            out.append(_verdict(b, arch, measured, ci, limit))
    return out


def _verdict(b: Budget, arch: str, measured: float, ci, limit: float) -> Verdict:
    is_min = b.min is not None
    margin = (measured - limit) if is_min else (limit - measured)
    ok, note = margin >= 0, ""
    if not ok and ci is not None:
        inside = ci[1] >= limit if is_min else ci[0] <= limit
        if inside:
            ok, note = True, "over, not significant"
    return Verdict(b, arch, round(measured, 2), None if ci is None else
                   (round(ci[0], 2), round(ci[1], 2)), round(limit, 2), round(margin, 2),
                   ok, note)


def print_table(verdicts: list[Verdict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("architecture", "budget", "measured", "95% CI", "limit", "margin", ""):
        table.add_column(col, justify="left" if col in ("architecture", "budget") else "right")
    for v in verdicts:
        ci = "-" if v.ci is None else f"{v.ci[0]:g} .. {v.ci[1]:g}"
        table.add_row(v.architecture, v.budget.describe(),
                      "-" if v.measured is None else f"{v.measured:g}", ci,
                      "-" if v.limit is None else f"{v.limit:g}",
                      "-" if v.margin is None else f"{v.margin:+g}",
                      (f"ok ({v.note})" if v.note else "ok") if v.ok
                      else f"[red]OVER[/red] {v.note}")
    Console(width=max(Console().width, 110)).print(table)


def to_json(verdicts: list[Verdict]) -> str:
    return json.dumps([{"architecture": v.architecture, "budget": v.budget.describe(),
                        "measured": v.measured, "ci": v.ci, "limit": v.limit,
                        "margin": v.margin, "ok": v.ok, "note": v.note} for v in verdicts],
                      indent=2)
