"""What a results folder says about its architectures: the one reader of ``architectures.json``.

The runner writes the file into every results folder (and sweep folder): the baseline, and per
architecture its label, colour, role, the log sources on a session's path, the link its media
crosses between regions, whether its public UDP ports are shared or grow with the sessions,
whether it is TURN or an external edge, what its clients verify (docs/scenarios.md, "Files").
The analysis reads architectures only from here, never from the code that defines them.

A folder without the file (written before it existed) gives its architectures' names and
baseline from config.json and nothing else: default facts, spare colours. A folder that
recorded no baseline has its first architecture as the baseline (the runner runs it first).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

FILE = "architectures.json"
PUBLIC, BACKBONE = "public", "backbone"
SHARED, PER_SESSION = "shared", "per-session"
# Colours for architectures a folder does not describe (Okabe-Ito, as the registered ones).
SPARE_COLOURS = ("#D55E00", "#E69F00", "#56B4E9", "#000000")
@dataclass(frozen=True)
class ArchInfo:
    """One architecture as the run described it."""

    name: str
    label: str
    colour: str | None = None           # None: not described (a spare colour is used)
    role: str = "compared"
    path: tuple[str, ...] = ()
    media_link: str = PUBLIC
    ports: str = SHARED
    fixed_ports_per_client_region: int = 0
    turn: bool = False
    external: bool = False
    ingress: bool = False               # services on the client region's edge host (a VIP)
    verifies: tuple[str, ...] = ()

    @property
    def per_session_ports(self) -> bool:
        return self.ports == PER_SESSION

    @classmethod
    def of(cls, name: str, doc: dict) -> "ArchInfo":
        return cls(name=name, label=str(doc.get("label") or name),
                   colour=doc.get("colour") or None, role=str(doc.get("role") or "compared"),
                   path=tuple(doc.get("path") or ()),
                   media_link=str(doc.get("media_link") or PUBLIC),
                   ports=str(doc.get("ports") or SHARED),
                   fixed_ports_per_client_region=int(doc.get("fixed_ports_per_client_region")
                                                     or 0),
                   turn=bool(doc.get("turn")), external=bool(doc.get("external")),
                   ingress=bool(doc.get("ingress")),
                   verifies=tuple(doc.get("verifies") or ()))


@dataclass(frozen=True)
class ArchFacts:
    """Every architecture of a folder, and which one is the baseline."""

    baseline: str
    architectures: dict[str, ArchInfo] = field(default_factory=dict)

    def __getitem__(self, name: str) -> ArchInfo:
        return self.architectures.get(name) or ArchInfo(name, name)

    def colour(self, name: str, order: list[str]) -> str:
        """The architecture's colour, or a spare one by its place among the undescribed
        architectures of ``order`` (the run's)."""
        own = self[name].colour
        if own:
            return own
        spare = [a for a in order if not self[a].colour]
        return SPARE_COLOURS[spare.index(name) % len(SPARE_COLOURS)] if name in spare else "k"


def read(folder: str | Path, config: dict | None = None) -> ArchFacts:
    """The facts of ``folder`` (a results or sweep folder); ``config``: its config.json (or
    sweep.json) for folders without architectures.json (read from the folder when None)."""
    folder = Path(folder)
    try:
        doc = json.loads((folder / FILE).read_text())
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("architectures"), dict):
        archs = {name: ArchInfo.of(name, a if isinstance(a, dict) else {})
                 for name, a in doc["architectures"].items()}
        return ArchFacts(_baseline(doc.get("baseline"), list(archs), archs), archs)
    return legacy(config if config is not None else _config(folder))


def legacy(config: dict) -> ArchFacts:
    """The facts of a folder written before architectures.json: its config.json's names and
    baseline, nothing more."""
    config = config if isinstance(config, dict) else {}
    names = list(config.get("architectures") or
                 (config.get("scenario") or {}).get("architectures") or [])
    baseline = _baseline(config.get("baseline"), names)
    return ArchFacts(baseline, {name: ArchInfo(name, name, role="baseline" if name == baseline
                                               else "compared") for name in names})


def _baseline(recorded, names: list[str], archs: dict[str, ArchInfo] | None = None) -> str:
    """The baseline the folder recorded; else the architecture described as the baseline;
    else the first one it lists (the runner ran the baseline first)."""
    if recorded:
        return str(recorded)
    described = [n for n, a in (archs or {}).items() if a.role == "baseline"]
    return described[0] if described else (names[0] if names else "")


def _config(folder: Path) -> dict:
    for name in ("config.json", "sweep.json"):
        try:
            doc = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            return doc
    return {}
