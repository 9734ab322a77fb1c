"""Load a scenario results folder (scenarios/runner.py writes it) into pandas frames.

A folder of an interrupted or failed run loads too, as long as it has config.json and
sessions.csv: ``Results.missing_files`` and ``Results.missing_architectures`` say what it lacks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import archinfo
from voiceedge.errors import UserError

# The columns the analysis reads; a run writes more (scenarios/runner.py SESSION_FIELDS).
SESSION_COLUMNS = (
    "architecture", "client_region", "cluster_region", "session", "ok", "error", "stage",
    "signaling_ms", "offer_ms", "first_ice_rtt_ms", "ice_connected_ms", "setup_ms",
    "first_audio_ms", "rtt_ms", "jitter_ms", "loss_pct", "packets_received", "packets_lost",
    "loss_bursts", "floor_signaling_rtt_ms", "floor_media_rtt_ms", "floor_setup_ms")
SAMPLE_COLUMNS = ("architecture", "client_region", "session", "t_ms", "packets_received",
                  "packets_lost", "jitter_ms", "rtt_ms")
PORT_COLUMNS = ("architecture", "concurrent_sessions", "public_udp_ports")
# steering.csv (optional: older runs have none): the fronts' decisions, one row per call
# (event call_created) or change of a front's preferred cluster (steering_changed).
STEERING_COLUMNS = ("architecture", "client_region", "event", "cluster", "nearest", "reason")
# Runs with faults (faults.json, docs/faults.md) also write every call attempt of a session and
# every gap of 60 ms or more in its RTP; sessions.csv then carries the wall-clock columns below.
ATTEMPT_COLUMNS = ("architecture", "client_region", "session", "attempt", "reason",
                   "started_unix", "connected_unix", "cluster_region", "transceiver", "error")
GAP_COLUMNS = ("architecture", "client_region", "session", "direction", "start_unix", "ms",
               "attempt")
SESSION_TIMES = ("started_unix", "ended_unix", "connected_unix", "first_rx_unix", "last_rx_unix",
                 "reconnections")
# The files a finished run has; config.json and sessions.csv are the ones a report needs.
FILES = ("config.json", "calibration.json", "sessions.csv", "samples.csv", "ports.csv",
         "relays.json")
REQUIRED = ("config.json", "sessions.csv")
_NUMERIC = tuple(c for c in SESSION_COLUMNS if c.endswith(("_ms", "_pct"))) + (
    "packets_received", "packets_lost")
_TEXT = ("architecture", "client_region", "cluster_region", "error", "stage")


class ResultsError(UserError):
    """A folder that is not a complete results folder; the message is one line."""


@dataclass
class Results:
    """One scenario run: per-session and per-sample frames plus the run's JSON files."""

    path: Path
    sessions: pd.DataFrame
    samples: pd.DataFrame
    ports: pd.DataFrame
    relays: dict
    config: dict
    calibration: dict
    summary: dict
    calibration_at_load: dict = field(default_factory=dict)  # architecture -> its probes
    host_cpu: dict = field(default_factory=dict)  # architecture -> host_cpu.json's window
    missing_files: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)  # timings.json: run and per-architecture times
    steering: pd.DataFrame = field(default_factory=lambda: _empty(STEERING_COLUMNS))
    faults: list[dict] = field(default_factory=list)  # faults.json's records (empty: no faults)
    attempts: pd.DataFrame = field(default_factory=lambda: _empty(ATTEMPT_COLUMNS))
    gaps: pd.DataFrame = field(default_factory=lambda: _empty(GAP_COLUMNS))
    archfacts: archinfo.ArchFacts | None = None  # architectures.json (None: from config.json)

    @property
    def archinfo(self) -> archinfo.ArchFacts:
        """What the run says about its architectures (analysis/archinfo.py)."""
        return self.archfacts or archinfo.legacy(self.config)

    def colour(self, arch: str) -> str:
        """The architecture's colour in every figure."""
        return self.archinfo.colour(arch, self.architectures)

    @property
    def planned_architectures(self) -> list[str]:
        """The architectures the scenario meant to run, in its order."""
        c = self.config
        return list(c.get("architectures") or c.get("scenario", {}).get("architectures") or [])

    @property
    def architectures(self) -> list[str]:
        """Architectures with sessions in this folder, in the order the scenario ran them."""
        seen = list(dict.fromkeys(self.sessions["architecture"].dropna()))
        planned = [a for a in self.planned_architectures if a in seen]
        return planned + [a for a in seen if a not in planned]

    @property
    def missing_architectures(self) -> list[str]:
        """Planned architectures without a single session here (the run stopped or failed)."""
        seen = set(self.sessions["architecture"].dropna())
        return [a for a in self.planned_architectures if a not in seen]

    @property
    def target(self) -> str | None:
        """The deployment's URL when the clients ran against one (``voiceedge scenario
        --target``) instead of an emulated world; None for an emulated run."""
        return (self.config.get("target") or {}).get("url")

    @property
    def baseline(self) -> str:
        """The architecture the others are compared with (architectures.json's, or
        config.json's ``baseline``)."""
        return self.archinfo.baseline

    @property
    def complete(self) -> bool:
        return not self.missing_files and not self.missing_architectures

    def missing_text(self) -> str:
        """What an incomplete folder lacks ('no sessions for ...; missing file(s) ...');
        '' for a complete one."""
        parts = []
        if self.missing_architectures:
            parts.append("no sessions for planned architecture(s) "
                         + ", ".join(self.missing_architectures))
        if self.missing_files:
            parts.append("missing file(s) " + ", ".join(self.missing_files))
        return "; ".join(parts)

    @property
    def client_regions(self) -> list[str]:
        """Client regions in the order of the run's region spec."""
        seen = list(dict.fromkeys(self.sessions["client_region"]))
        planned = [r for r in self.config.get("client_regions", []) if r in seen]
        return planned + [r for r in seen if r not in planned]

    @property
    def name(self) -> str:
        return self.path.name


def parse_bursts(cell) -> list[int]:
    """Loss-burst lengths of one session from its ``loss_bursts`` cell (a JSON list)."""
    if isinstance(cell, list):
        values = cell
    elif cell is None or (isinstance(cell, float) and pd.isna(cell)) or str(cell).strip() == "":
        return []
    else:
        try:
            values = json.loads(cell)
        except (TypeError, ValueError):
            raise ValueError(f"loss_bursts {cell!r} is not a JSON list") from None
    if not isinstance(values, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ValueError(f"loss_bursts {cell!r} is not a list of positive integers")
    return list(values)


def _read_csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path, keep_default_na=True)
    except pd.errors.EmptyDataError:
        raise ResultsError(f"{path} is empty (not even a header)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path} is not a readable CSV: {str(exc).splitlines()[0]}") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ResultsError(f"{path} lacks column(s) {', '.join(missing)}")
    return frame


def _read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise ResultsError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ResultsError(f"{path} is not a JSON object")
    return doc


def as_bool(series: pd.Series) -> pd.Series:
    """A CSV column of True/False (or 1/0, yes/no) as booleans."""
    return series.map(lambda v: str(v).strip().lower() in ("true", "1", "yes"))


def _sessions(path: Path) -> pd.DataFrame:
    return _sessions_frame(_read_csv(path, SESSION_COLUMNS), path)


def _sessions_frame(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    for col in _NUMERIC:
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    for col in _TEXT:
        frame[col] = frame[col].astype("string")
    frame["ok"] = as_bool(frame["ok"]).astype(bool)
    for col in SESSION_TIMES:  # runs with faults; older runs lack them
        if col in frame:
            frame[col] = pd.to_numeric(frame[col], errors="coerce")
    # Measured while a process on the session's path lagged (older runs: never flagged).
    frame["saturated"] = (as_bool(frame["saturated"]).fillna(False).astype(bool)
                          if "saturated" in frame else False)
    bursts = []
    for i, cell in enumerate(frame["loss_bursts"]):
        try:
            bursts.append(parse_bursts(cell))
        except ValueError as exc:
            raise ResultsError(f"{path}, data row {i + 1}: {exc}") from None
    frame["loss_bursts"] = pd.Series(bursts, index=frame.index, dtype=object)
    return frame


def _samples(path: Path) -> pd.DataFrame:
    return _numeric_samples(_read_csv(path, SAMPLE_COLUMNS))


def _numeric_samples(frame: pd.DataFrame) -> pd.DataFrame:
    for col in SAMPLE_COLUMNS[3:]:
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def _empty(columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def _optional_csv(path: Path, columns: tuple[str, ...], numeric: tuple[str, ...]) -> pd.DataFrame:
    frame = _read_csv(path, columns) if path.is_file() else _empty(columns)
    for col in numeric:
        if col in frame:
            frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def _faults(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    records = _read_json(path).get("faults")
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ResultsError(f"{path}: 'faults' is not a list of objects")
    return records


def load_results(path: str | Path, require_sessions: bool = True) -> Results:
    """Read a results folder; ResultsError names what is missing or unreadable.

    config.json and sessions.csv are required (sessions.csv not with ``require_sessions=False``:
    a run that has not finished an architecture yet); the other files may be absent, which
    ``Results.missing_files`` records.
    """
    path = Path(path)
    if not path.is_dir():
        raise ResultsError(f"{path} is not a directory")
    missing = [f for f in FILES if not (path / f).is_file()]
    if "sessions.csv" in missing and "config.json" in missing:
        raise ResultsError(f"{path} is not a results folder (no sessions.csv or config.json)")
    required = [f for f in REQUIRED if f in missing
                and (require_sessions or f != "sessions.csv")]
    if required:
        hint = (" (calibration failed, or the run stopped before an architecture finished?)"
                if "sessions.csv" in required and "calibration.json" not in missing else "")
        raise ResultsError(f"{path} is an incomplete results folder: missing "
                           f"{', '.join(required)}{hint}")

    def optional_json(name: str) -> dict:
        return _read_json(path / name) if (path / name).is_file() else {}

    if "ports.csv" in missing:
        ports = _empty(PORT_COLUMNS)
    else:
        ports = _read_csv(path / "ports.csv", PORT_COLUMNS)
    for col in PORT_COLUMNS[1:]:
        ports[col] = pd.to_numeric(ports[col], errors="coerce")
    if "sessions.csv" in missing:
        sessions = _sessions_frame(_empty(SESSION_COLUMNS), path / "sessions.csv")
    else:
        sessions = _sessions(path / "sessions.csv")
    samples = (_numeric_samples(_empty(SAMPLE_COLUMNS)) if "samples.csv" in missing
               else _samples(path / "samples.csv"))
    steering = _optional_csv(path / "steering.csv", STEERING_COLUMNS, ("unix",))
    config = _read_json(path / "config.json")
    if config.get("target"):  # a deployment target: no world, so nothing to calibrate
        missing = [f for f in missing if f != "calibration.json"]
    faults = _faults(path / "faults.json")
    if faults:  # a run with faults is measured by its attempts and gaps
        missing += [f for f in ("attempts.csv", "gaps.csv") if not (path / f).is_file()]
    attempts = _optional_csv(path / "attempts.csv", ATTEMPT_COLUMNS,
                             ("session", "attempt", "started_unix", "connected_unix"))
    gaps = _optional_csv(path / "gaps.csv", GAP_COLUMNS,
                         ("session", "start_unix", "ms", "attempt"))
    return Results(path=path, sessions=sessions, samples=samples, ports=ports, steering=steering,
                   faults=faults, attempts=attempts, gaps=gaps,
                   relays=optional_json("relays.json"), config=config,
                   calibration=optional_json("calibration.json"),
                   summary=optional_json("summary.json"), missing_files=missing,
                   timings=optional_json("timings.json"),
                   calibration_at_load=optional_json("calibration_at_load.json"),
                   host_cpu=optional_json("host_cpu.json"),
                   archfacts=archinfo.read(path, config))
