"""A scenario's sweep: the parameters it varies and the points they make.

    sweep:
      parameters:
        public_internet.rtt_scale: [1.0, 1.2, 1.4, 1.8]
        public_internet.loss_pct: [0, 1, 3]        # a second one makes a grid
      max_minutes: 60                              # stop after the first point if longer

A parameter is one of:

- ``PROFILE.KEY``: a parameter of a profile of the regions catalogue (``public_internet``,
  ``backbone``, ``last_mile_broadband``, ...; keys ``rtt_scale``, ``loss_pct``, ``jitter_ms``,
  ...), as a scenario's ``profiles`` would override it. Only the impairments change.
- ``last_mile``: the last-mile profile's name. Only the impairments change.
- ``clusters``: lists of cluster regions. Each value is another world.
- ``sessions_per_region``: aiortc sessions per client region. The world does not change.
- ``live_per_region``: the load, as calls live at once per client region. A point starts
  calls at ``live / call_duration_s`` per second in each client region, and runs at least
  ``3 x live`` of them (the scenario's ``sessions_per_region`` if more), so the load holds
  for about two call lengths. The world does not change (scenarios/sweep-load.yaml).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

from scenarios.clients import parse_mix
from services.clienttypes import AIORTC

LAST_MILE, CLUSTERS, SESSIONS = "last_mile", "clusters", "sessions_per_region"
LIVE = "live_per_region"
LIVE_CALLS = 3          # a load point's calls per client region, in call lengths of starts
MAX_PARAMETERS = 2
MAX_POINTS = 64


@dataclass(frozen=True)
class SweepParameter:
    name: str
    values: tuple

    @property
    def profile(self) -> tuple[str, str] | None:
        """(profile, key) of a profile parameter, else None."""
        if "." not in self.name:
            return None
        profile, key = self.name.split(".", 1)
        return profile, key

    @property
    def changes_topology(self) -> bool:
        return self.name == CLUSTERS

    @property
    def numeric(self) -> bool:
        """Whether its values can be a plot's axis (numbers, in the order given)."""
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)

    def label(self, value: Any) -> str:
        return ",".join(value) if isinstance(value, (list, tuple)) else f"{value:g}" \
            if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class SweepPoint:
    """One combination of the parameters' values."""

    index: int
    values: tuple[tuple[str, Any], ...]   # (parameter name, value), in the spec's order

    @property
    def id(self) -> str:
        return f"p{self.index:02d}"

    def value(self, name: str) -> Any:
        return dict(self.values)[name]

    def label(self) -> str:
        return ", ".join(f"{name.split('.')[-1]}={SweepParameter(name, ()).label(v)}"
                         for name, v in self.values)


@dataclass(frozen=True)
class SweepSpec:
    parameters: tuple[SweepParameter, ...]
    max_minutes: float | None = None

    def points(self) -> list[SweepPoint]:
        """Every combination, the first parameter outermost."""
        names = [p.name for p in self.parameters]
        combos = itertools.product(*(p.values for p in self.parameters))
        return [SweepPoint(i, tuple(zip(names, combo))) for i, combo in enumerate(combos)]

    @classmethod
    def parse(cls, doc: Any, where: str, catalog=None) -> "SweepSpec":
        """The ``sweep:`` mapping of a scenario file; ValueError (one line, prefixed with
        ``where``) for anything wrong. ``catalog``: the regions catalogue that profile
        parameters and last-mile names are checked against (loaded when None)."""
        from topology.regions import PROFILE_KEYS, CatalogError, RegionsCatalog

        if not isinstance(doc, dict) or set(doc) - {"parameters", "max_minutes"}:
            raise ValueError(f"{where}: sweep: a mapping with parameters (and max_minutes)")
        params = doc.get("parameters")
        if not isinstance(params, dict) or not 1 <= len(params) <= MAX_PARAMETERS:
            raise ValueError(f"{where}: sweep: parameters: one or two parameters, each a list "
                             f"of values")
        catalog = catalog or RegionsCatalog.load()
        parsed = []
        for name, values in params.items():
            at = f"{where}: sweep: {name}"
            if not isinstance(values, list) or len(values) < 2:
                raise ValueError(f"{at}: a list of at least two values")
            if len({repr(v) for v in values}) != len(values):
                raise ValueError(f"{at}: values repeat")
            param = SweepParameter(str(name), tuple(tuple(v) if isinstance(v, list) else v
                                                    for v in values))
            if param.profile is not None:
                profile, key = param.profile
                if profile not in catalog.profiles:
                    raise ValueError(f"{at}: unknown profile {profile!r}; profiles: "
                                     f"{', '.join(catalog.profiles)}")
                if key not in PROFILE_KEYS:
                    raise ValueError(f"{at}: unknown parameter {key!r}; parameters: "
                                     f"{', '.join(PROFILE_KEYS)}")
                for v in param.values:
                    try:
                        catalog.with_overrides({profile: {key: v}})
                    except CatalogError as exc:
                        raise ValueError(f"{at}: {v!r}: {exc}") from None
            elif name == LAST_MILE:
                bad = [v for v in param.values if v not in catalog.profiles]
                if bad:
                    raise ValueError(f"{at}: not profiles: {', '.join(map(str, bad))}")
            elif name == CLUSTERS:
                for v in param.values:
                    if not isinstance(v, tuple) or not v or not all(isinstance(c, str) for c in v):
                        raise ValueError(f"{at}: each value a non-empty list of regions")
                    try:
                        catalog.resolve(",".join(v))
                    except CatalogError as exc:
                        raise ValueError(f"{at}: {exc}") from None
            elif name == SESSIONS:
                if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 200
                           for v in param.values):
                    raise ValueError(f"{at}: session counts 1..200")
            elif name == LIVE:
                if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                           and 0.5 <= v <= 60 for v in param.values):
                    raise ValueError(f"{at}: live calls per client region 0.5..60")
            else:
                raise ValueError(f"{at}: not a parameter: PROFILE.KEY, {LAST_MILE}, "
                                 f"{CLUSTERS}, {SESSIONS} or {LIVE}")
            parsed.append(param)
        limit = doc.get("max_minutes")
        if limit is not None and (not isinstance(limit, (int, float)) or isinstance(limit, bool)
                                  or limit <= 0):
            raise ValueError(f"{where}: sweep: max_minutes: a positive number of minutes")
        spec = cls(tuple(parsed), None if limit is None else float(limit))
        if len(spec.points()) > MAX_POINTS:
            raise ValueError(f"{where}: sweep: {len(spec.points())} points; at most {MAX_POINTS}")
        return spec


def scenario_at(scenario, point: SweepPoint):
    """The scenario as it runs at ``point``: its parameters' values in place, no sweep."""
    profiles = {k: dict(v) for k, v in (scenario.profiles or {}).items()}
    changes: dict = {"sweep": None}
    for name, value in point.values:
        param = SweepParameter(name, ())
        if param.profile is not None:
            profile, key = param.profile
            profiles.setdefault(profile, {})[key] = value
        elif name == LAST_MILE:
            changes["last_mile"] = value
        elif name == CLUSTERS:
            changes["clusters"] = tuple(value)
        elif name == SESSIONS:
            changes["clients"] = parse_mix({**scenario.clients, AIORTC: value})
            changes["full_clients_per_region"] = min(scenario.full_clients_per_region, value)
            if scenario.many_regions is not None:  # the point's count rules
                changes["many_regions"] = replace(scenario.many_regions, sessions_per_region=None)
        elif name == LIVE:
            calls = max(scenario.clients.get(AIORTC, 0), math.ceil(LIVE_CALLS * value))
            changes["clients"] = parse_mix({**scenario.clients, AIORTC: min(calls, 200)})
            changes["start_rate"] = value / scenario.call_duration_s
            changes["live_at_once"] = None   # the point's per-region load replaces it
    return replace(scenario, profiles=profiles, **changes)
