"""Load a scenario results folder (scenarios/runner.py writes it) into pandas frames."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

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
FILES = ("config.json", "calibration.json", "sessions.csv", "samples.csv", "ports.csv",
         "relays.json", "summary.json")
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

    @property
    def architectures(self) -> list[str]:
        """Architectures in the order the scenario ran them."""
        seen = list(dict.fromkeys(self.sessions["architecture"]))
        planned = [a for a in self.config.get("scenario", {}).get("architectures", []) if a in seen]
        return planned + [a for a in seen if a not in planned]

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


def _as_bool(series: pd.Series) -> pd.Series:
    return series.map(lambda v: str(v).strip().lower() in ("true", "1", "yes"))


def _sessions(path: Path) -> pd.DataFrame:
    frame = _read_csv(path, SESSION_COLUMNS)
    for col in _NUMERIC:
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    for col in _TEXT:
        frame[col] = frame[col].astype("string")
    frame["ok"] = _as_bool(frame["ok"])
    bursts = []
    for i, cell in enumerate(frame["loss_bursts"]):
        try:
            bursts.append(parse_bursts(cell))
        except ValueError as exc:
            raise ResultsError(f"{path}, data row {i + 1}: {exc}") from None
    frame["loss_bursts"] = pd.Series(bursts, index=frame.index, dtype=object)
    return frame


def _samples(path: Path) -> pd.DataFrame:
    frame = _read_csv(path, SAMPLE_COLUMNS)
    for col in SAMPLE_COLUMNS[3:]:
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def load_results(path: str | Path) -> Results:
    """Read a results folder; ResultsError names what is missing or unreadable."""
    path = Path(path)
    if not path.is_dir():
        raise ResultsError(f"{path} is not a directory")
    missing = [f for f in FILES if not (path / f).is_file()]
    if "sessions.csv" in missing and "config.json" in missing:
        raise ResultsError(f"{path} is not a results folder (no sessions.csv or config.json)")
    if missing:
        hint = (" (calibration failed or the run stopped early?)"
                if "sessions.csv" in missing and "calibration.json" not in missing else "")
        raise ResultsError(f"{path} is an incomplete results folder: missing "
                           f"{', '.join(missing)}{hint}")
    ports = _read_csv(path / "ports.csv", PORT_COLUMNS)
    for col in PORT_COLUMNS[1:]:
        ports[col] = pd.to_numeric(ports[col], errors="coerce")
    return Results(path=path, sessions=_sessions(path / "sessions.csv"),
                   samples=_samples(path / "samples.csv"), ports=ports,
                   relays=_read_json(path / "relays.json"), config=_read_json(path / "config.json"),
                   calibration=_read_json(path / "calibration.json"),
                   summary=_read_json(path / "summary.json"))
