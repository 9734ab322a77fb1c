"""Which sessions were measured while the testbed itself lagged.

Every process of a run reports the wall-clock seconds in which it could not keep up
(services/lag.py: ``loop_lag`` events, in the architecture's timeline: a tenth of a second's
20 ms ticks 5 ms late or more, or one 100 ms late; the impairment engine: a tenth of a second's
releases 2 ms late or more, or one 100 ms late). A session is *saturated* when any
process on its path lagged during its set-up, or for a fifth of its call or more (``flag``):
its figures are the host's, not the architecture's. The path of a session is its architecture's
(``Architecture.path``, scenarios/architectures/): its client, its region's signaling front, the
impairment engine, and the architecture's own services (e.g. the ingress relay of the client's
region, its cluster's relay, transceiver and agent).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from scenarios import architectures
from scenarios.architectures.base import COMMON_PATH, ENGINE, PROJECT_CLUSTER_PATH, Architecture


@dataclass
class LagWindows:
    """Lagged wall-clock windows per source (a service log's name, or ENGINE)."""

    windows: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)

    def add(self, source: str, start: float, length: float, max_ms: float) -> None:
        self.windows.setdefault(source, []).append((start, start + length, max_ms))

    @classmethod
    def from_run(cls, timeline: Path, engine_lagged: dict | None = None) -> "LagWindows":
        """``loop_lag`` records of a timeline.jsonl, plus the engine's lagged seconds."""
        out = cls()
        if timeline.exists():
            for line in timeline.read_text().splitlines():
                record = json.loads(line)
                if record.get("event") == "loop_lag":
                    out.add(record["source"], float(record["window_start"]),
                            float(record.get("window_s", 1.0)), float(record["max_ms"]))
        for second, max_ms in (engine_lagged or {}).items():
            out.add(ENGINE, float(second), 1.0, float(max_ms))
        return out

    def covered(self, sources: list[str], start: float, end: float) -> float:
        """Seconds of [start, end] inside a lagged window of any of ``sources``."""
        spans = sorted((max(a, start), min(b, end)) for source in sources
                       for a, b, _ in self.windows.get(source, ()) if a < end and b > start)
        total, reach = 0.0, start
        for a, b in spans:
            if b > reach:
                total += b - max(a, reach)
                reach = b
        return total

    def lagging(self, sources: list[str], start: float, end: float) -> dict[str, float]:
        """Source -> worst lag (ms) among ``sources`` in windows overlapping [start, end]."""
        out: dict[str, float] = {}
        for source in sources:
            for a, b, max_ms in self.windows.get(source, ()):
                if a < end and b > start:
                    out[source] = max(out.get(source, 0.0), max_ms)
        return out


def session_path(client_region: str, cluster: str | None,
                 architecture: str | Architecture) -> list[str]:
    """The log sources (service names of the edge launcher) a session's packets and requests
    cross: the architecture's path (a registered name, or the architecture itself); for a
    name the registry does not know (a deployment target), the client, front, engine and the
    cluster's transceiver and agent."""
    if isinstance(architecture, str):
        try:
            architecture = architectures.get(architecture)
        except KeyError:
            architecture = Architecture(architecture, architecture, "#000000",
                                        path=COMMON_PATH + PROJECT_CLUSTER_PATH)
    return architecture.session_path(client_region, cluster)


CALL_SHARE = 0.2  # lagged share of a call that taints its media figures (jitter, RTT, loss)


def flag(session: dict, lag: LagWindows, started: float | None, ended: float | None,
         setup_s: float | None = None, path=None) -> None:
    """Set ``saturated`` and ``saturated_by`` ("source max_ms; ...") on a session row.

    Saturated: a process on the session's path lagged during its set-up (start to DTLS
    connected, ``setup_s`` seconds: what setup, first-ICE RTT and first audio measure; the
    whole session when it never connected), or during at least CALL_SHARE of its call (what
    the media figures average over). Lag elsewhere in a long call does not taint the session.
    ``path(client, cluster)``: the sources on its path (default: ``session_path`` of the
    row's architecture).
    """
    if started is None:
        session.update(saturated=None, saturated_by="")
        return
    end = ended if ended is not None else started
    setup_end = min(end, started + setup_s) if setup_s is not None else end
    path = (path(session["client_region"], session.get("cluster_region")) if path
            else session_path(session["client_region"], session.get("cluster_region"),
                              session["architecture"]))
    cluster = session.get("cluster_region")
    if cluster:  # a cluster's other transceivers (transceiver-CLUSTER-2, ...)
        path += [s for s in lag.windows if s.startswith(f"transceiver-{cluster}-")]
    hits = lag.lagging(path, started, setup_end)
    if end > setup_end:
        covered = lag.covered(path, setup_end, end)
        if covered >= CALL_SHARE * (end - setup_end):
            for source, ms in lag.lagging(path, setup_end, end).items():
                hits[source] = max(hits.get(source, 0.0), ms)
    session["saturated"] = bool(hits)
    session["saturated_by"] = "; ".join(f"{s} {ms:g} ms" for s, ms in sorted(hits.items()))
