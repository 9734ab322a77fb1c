"""The sweep runner: a scenario's architectures at every point of its sweep.

The world is built once per topology (once, unless the sweep varies ``clusters``) and only
its impairments change between points (``World.reimpair``); every point is calibrated again,
and a point whose world does not calibrate is recorded as ``not calibrated`` and measures
nothing. The architectures run in an order rotated from point to point, and the points from
the outside of the first parameter's range in (serpentine over a grid), so that a drift over
the sweep's time does not line up with the parameter or with an architecture.

Results: ``results/<scenario>-sweep-<region>-<time>/`` with ``sweep.json`` (the parameters, and
each point's values, status, order and time), ``points/<id>/`` (each point's own results
folder) and the points' tables (``sessions.csv``, ``samples.csv``, ...: every measured point's
rows, with a ``point`` column and one column per parameter). A sweep can be resumed: the
points already measured (or found not to calibrate) are not run again.
"""
from __future__ import annotations

import csv
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from analysis.jsonout import plain
from scenarios.runner import CalibrationFailed, ScenarioRunner, write_architectures
from scenarios.spec import Scenario, ScenarioError
from scenarios.sweepspec import SweepPoint, SweepSpec, scenario_at
from topology.world import World

MEASURED, NOT_CALIBRATED, FAILED, PENDING = "measured", "not calibrated", "failed", "pending"
DONE = (MEASURED, FAILED, NOT_CALIBRATED)  # what a resumed sweep does not run again
SWEEP_FILE = "sweep.json"


class SweepStopped(RuntimeError):
    """The sweep stopped before its last point (over its time limit); resumable."""


@dataclass
class PointRecord:
    """One point in sweep.json."""

    id: str
    values: dict
    status: str = PENDING
    directory: str = ""
    order: list[str] = field(default_factory=list)
    seconds: float | None = None
    error: str | None = None


def run_order(points: list[SweepPoint], spec: SweepSpec) -> list[SweepPoint]:
    """The order the points run in: the first parameter's values from the outside in (first,
    last, second, second-to-last, ...), so that a drift over the sweep's time does not line up
    with the parameter; with a second parameter, its values serpentine within each (reversed
    on every other row), so that the grid is walked without long jumps."""
    outer = len(spec.parameters[0].values)
    inner = len(points) // outer
    rows = [points[r * inner:(r + 1) * inner] for r in range(outer)]
    walk = [rows[i // 2] if i % 2 == 0 else rows[outer - 1 - i // 2] for i in range(outer)]
    out = []
    for n, row in enumerate(walk):
        out += row if n % 2 == 0 else row[::-1]
    return out


def rotated(architectures: tuple[str, ...], n: int) -> tuple[str, ...]:
    """The architectures starting at the n-th (mod their count)."""
    k = n % len(architectures)
    return architectures[k:] + architectures[:k]


def point_orders(points: list[SweepPoint], spec: SweepSpec,
                 architectures: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Each point's architecture order: rotated by the point's place in the run order, so that
    consecutive points start with different architectures (and a resumed sweep keeps them)."""
    return {p.id: rotated(tuple(architectures), place)
            for place, p in enumerate(run_order(points, spec))}


class SweepRunner:
    """One run (or the rest of a resumed run) of a scenario's sweep for one region spec."""

    def __init__(self, scenario: Scenario, region: str, results_root: Path = Path("results"),
                 backend: str | None = None, say=lambda msg, transient=False: None,
                 progress=None, max_minutes: float | None = None,
                 resume: Path | None = None) -> None:
        if scenario.sweep is None:
            raise ScenarioError(f"{scenario.source or scenario.name}: no sweep: section "
                                f"(docs/sweeps.md)")
        if scenario.faults:
            raise ScenarioError(f"{scenario.source or scenario.name}: a sweep runs no faults")
        self.scenario = scenario
        self.spec = scenario.sweep
        self.region = region
        self.backend_name = backend
        self.say = say
        self.progress = progress or (lambda what, done, total: None)
        self.max_minutes = max_minutes if max_minutes is not None else self.spec.max_minutes
        self.points = self.spec.points()
        # Every point's runner is made now: a region or cluster that does not exist fails here.
        self.point_scenarios = {p.id: scenario_at(scenario, p) for p in self.points}
        for s in self.point_scenarios.values():
            ScenarioRunner(s, region, results_root)
        self.runs: list[dict] = []  # every invocation: when, how long, which points it ran
        self.estimate: dict | None = None  # after a run's first point: the time the rest takes
        if resume is not None:
            self.directory = Path(resume)
            self.records = self._load(self.directory)
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.directory = (results_root /
                              f"{scenario.name}-sweep-{region.replace(',', '+')}-{stamp}")
            self.records = {p.id: PointRecord(p.id, dict(p.values)) for p in self.points}

    # ------------------------------------------------------------ sweep.json

    def _load(self, directory: Path) -> dict[str, PointRecord]:
        path = directory / SWEEP_FILE
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise ScenarioError(f"--resume {directory}: no {SWEEP_FILE} (not a sweep's "
                                f"folder)") from None
        except ValueError as exc:
            raise ScenarioError(f"--resume {directory}: {SWEEP_FILE}: {exc}") from None
        mine = [{"name": p.name, "values": plain(p.values)} for p in self.spec.parameters]
        if doc.get("parameters") != mine or doc.get("region") != self.region:
            raise ScenarioError(f"--resume {directory}: that sweep's parameters or region are "
                                f"not this one's ({doc.get('region')}: "
                                f"{doc.get('parameters')})")
        self.runs = list(doc.get("runs") or [])
        self.estimate = doc.get("estimate")
        records = {}
        for r in doc.get("points", []):
            records[r["id"]] = PointRecord(**{k: r.get(k) for k in PointRecord.__dataclass_fields__
                                              if k in r})
        for p in self.points:
            records.setdefault(p.id, PointRecord(p.id, dict(p.values)))
            if records[p.id].status not in DONE:  # a point cut short runs again, from scratch
                records[p.id].status = PENDING
        return records

    def _write(self) -> None:
        doc = {"scenario": self.scenario.name, "source": self.scenario.source,
               "region": self.region, "baseline": self.scenario.baseline,
               "architectures": list(self.scenario.architectures),
               "parameters": [{"name": p.name, "values": plain(p.values)}
                              for p in self.spec.parameters],
               "max_minutes": self.max_minutes,
               "points": [plain(vars(self.records[p.id])) for p in self.points],
               "estimate": self.estimate, "runs": self.runs}
        tmp = self.directory / f".{SWEEP_FILE}.tmp"
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(self.directory / SWEEP_FILE)
        write_architectures(self.directory, self.scenario)

    # ------------------------------------------------------------ the run

    def run(self) -> dict[str, PointRecord]:
        """Run every pending point; SweepStopped when the first point measured in this run
        says the rest would pass the time limit (the folder is resumable)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "points").mkdir(exist_ok=True)
        self._write()
        todo = [p for p in run_order(self.points, self.spec)
                if self.records[p.id].status not in DONE]
        done_before = len(self.points) - len(todo)
        if done_before:
            self.say(f"resuming: {done_before} of {len(self.points)} points already done")
        groups: dict[tuple, list[SweepPoint]] = {}
        for p in todo:
            groups.setdefault(self.point_scenarios[p.id].clusters, []).append(p)
        timed: list[float] = []
        started = time.monotonic()
        this_run = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": None,
                    "points": []}  # the points it ran (or began)
        self.runs.append(this_run)
        try:
            self._run_groups(groups, timed)
        finally:  # also after Ctrl-C or a stop: what was measured stays readable
            this_run["seconds"] = round(time.monotonic() - started, 1)
            self._write()
            write_tables(self.directory, self.spec, self.records)
        return self.records

    def _run_groups(self, groups: dict, timed: list[float]) -> None:
        from topology.impairment.factory import make_backend

        for clusters, points in groups.items():
            first = self._runner(points[0])
            backend = make_backend(self.backend_name)
            self.say(f"world: {', '.join(first.spec.regions)} (clusters "
                     f"{', '.join(clusters)}); impairment backend: {backend.name}")
            with World(first.spec, backend) as world:
                self.say(f"world built in {world.build_seconds:.1f} s")
                for p in points:
                    seconds = self._run_point(world, p)
                    if seconds is not None:
                        timed.append(seconds)
                    self.progress("points", sum(r.status in DONE
                                                for r in self.records.values()),
                                  len(self.points))
                    left = sum(1 for r in self.records.values() if r.status not in DONE)
                    if len(timed) == 1 and left:
                        self._check_time(timed[0], left)

    def _runner(self, point: SweepPoint, order: tuple[str, ...] | None = None) -> ScenarioRunner:
        return ScenarioRunner(self.point_scenarios[point.id], self.region,
                              directory=self.directory / "points" / point.id, order=order,
                              say=lambda msg, transient=False: self.say(
                                  f"[{point.id} {point.label()}] {msg}", transient),
                              progress=self.progress)

    def _run_point(self, world: World, point: SweepPoint) -> float | None:
        """Run one point in ``world``; its time when it measured, else None. Its architectures
        are rotated by its place in the sweep's run order (the same when resumed)."""
        order = point_orders(self.points, self.spec, self.scenario.architectures)[point.id]
        runner = self._runner(point, order)
        record = self.records[point.id]
        record.order, record.directory = list(order), f"points/{point.id}"
        self.runs[-1]["points"].append(point.id)
        target = self.directory / record.directory
        if target.exists():  # a point cut short before: its folder goes, the point runs again
            shutil.rmtree(target)
        changed = world.reimpair(runner.spec)
        self.say(f"[{point.id} {point.label()}] {len(changed)} link directions re-impaired; "
                 f"order {', '.join(order)}")
        t0 = time.monotonic()
        try:
            result = runner.run_in(world)
        except CalibrationFailed as exc:
            record.status, record.error = NOT_CALIBRATED, str(exc)
            self.say(f"[{point.id} {point.label()}] not calibrated: {exc}; nothing measured")
            record.seconds = round(time.monotonic() - t0, 1)
            self._write()
            return None
        record.status = MEASURED if not result.failed_architectures else FAILED
        if result.failed_architectures:
            record.error = (f"{', '.join(result.failed_architectures)} below min_success_pct "
                            f"({self.scenario.min_success_pct:g}%)")
        record.seconds = round(time.monotonic() - t0, 1)
        self._write()
        return record.seconds

    def _check_time(self, per_point: float, left: int) -> None:
        estimate_min = per_point * left / 60
        self.say(f"{per_point:.0f} s a point: the {left} points left take about "
                 f"{estimate_min:.0f} min")
        self.estimate = {"seconds_per_point": round(per_point, 1), "points_left": left,
                         "minutes_left": round(estimate_min, 1)}
        self._write()
        if self.max_minutes is not None and estimate_min > self.max_minutes:
            raise SweepStopped(
                f"the {left} points left would take about {estimate_min:.0f} min, over the "
                f"limit of {self.max_minutes:g} min; resume with --resume {self.directory} "
                f"--max-minutes {int(estimate_min) + 5}")


# A point's tables that the sweep's folder repeats, every measured point's rows in one file.
TABLES = ("sessions.csv", "samples.csv", "attempts.csv", "gaps.csv", "steering.csv",
          "ports.csv")


def write_tables(directory: Path, spec: SweepSpec, records: dict[str, PointRecord]) -> int:
    """The sweep's own copies of the points' tables (TABLES): every measured point's rows
    with ``point`` and one column per parameter in front. Returns the sessions written."""
    names = [p.name for p in spec.parameters]
    sessions = 0
    for table in TABLES:
        rows, fields = [], None
        for point in spec.points():
            record = records[point.id]
            path = directory / record.directory / table if record.directory else None
            if record.status not in (MEASURED, FAILED) or path is None or not path.is_file():
                continue
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                fields = fields or reader.fieldnames
                for row in reader:
                    rows.append({"point": point.id,
                                 **{n: _cell(v) for n, v in point.values}, **row})
        with open(directory / table, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["point", *names, *(fields or [])],
                               extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        if table == "sessions.csv":
            sessions = len(rows)
    return sessions


def _cell(value):
    """A parameter value as a CSV cell (a list of clusters joined by '+')."""
    return "+".join(value) if isinstance(value, (list, tuple)) else value
