"""Faults a scenario lists: what breaks, where, when, and for how long (docs/faults.md).

What is common to every fault (its name, time, kind and target) is parsed here; the rest is
its kind's (scenarios/faultkinds/: one module per kind, ``KINDS`` the registry)."""
from __future__ import annotations

from dataclasses import dataclass

from scenarios.faultkinds import KINDS, FaultKind, Options
from scenarios.faultkinds.base import number

COMMON_FIELDS = ("name", "at_s", "kind", "target")  # every kind's; the rest are its Options


@dataclass(frozen=True)
class Target:
    """``cluster/na-east``, ``cluster/na-east/2`` (transceiver 2), ``ingress/apac-se``,
    ``backbone/apac-se/na-east``, ``public/apac-se/na-east`` or ``last_mile/apac-se``."""

    tier: str                     # cluster, ingress, backbone, public, last_mile
    region: str
    other: str | None = None      # the link's other end (backbone, public)
    transceiver: int | None = None

    @classmethod
    def parse(cls, text: str) -> "Target":
        parts = text.split("/") if isinstance(text, str) else []
        if len(parts) >= 2 and all(parts):
            tier = parts[0]
            if tier == "cluster" and len(parts) in (2, 3):
                if len(parts) == 3:
                    if not parts[2].isdigit() or not 1 <= int(parts[2]) <= 10:
                        raise ValueError(f"target {text!r}: the transceiver id is 1..10")
                    return cls(tier, parts[1], transceiver=int(parts[2]))
                return cls(tier, parts[1])
            if tier in ("ingress", "last_mile") and len(parts) == 2:
                return cls(tier, parts[1])
            if tier in ("backbone", "public") and len(parts) == 3 and parts[1] != parts[2]:
                return cls(tier, parts[1], other=parts[2])
        raise ValueError(f"target {text!r}: one of cluster/REGION[/ID], ingress/REGION, "
                         "backbone/A/B, public/A/B, last_mile/REGION")

    @property
    def regions(self) -> tuple[str, ...]:
        return (self.region,) if self.other is None else (self.region, self.other)

    def __str__(self) -> str:
        tail = f"/{self.other}" if self.other else (
            f"/{self.transceiver}" if self.transceiver else "")
        return f"{self.tier}/{self.region}{tail}"


@dataclass(frozen=True)
class FaultSpec:
    """One fault, ``at_s`` seconds after an architecture's first call was due (the clock its
    clients are given):
    a ``kind`` of ``KINDS``, its target, and that kind's own ``options`` (e.g. a relay
    kill's ``restart_after_s`` and ``redis``, a loss burst's ``duration_s`` and ``loss_pct``;
    docs/faults.md)."""

    name: str
    at_s: float
    kind: str
    target: Target
    options: Options = Options()

    @property
    def fault_kind(self) -> FaultKind:
        return KINDS[self.kind]

    @classmethod
    def parse(cls, raw, index: int) -> "FaultSpec":
        if not isinstance(raw, dict):
            raise ValueError(f"fault {index + 1}: a mapping with at_s, kind and target")
        known = set(COMMON_FIELDS).union(*(k.options.keys() for k in KINDS.values()))
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"fault {index + 1}: unknown field(s) {', '.join(sorted(unknown))}")
        name = raw.get("name", f"f{index + 1}")
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"fault {index + 1}: name: letters, digits, - and _ ({name!r})")
        where = f"fault {name}"
        kind = raw.get("kind")
        if kind not in KINDS:
            raise ValueError(f"{where}: kind: one of {', '.join(KINDS)} ({kind!r})")
        fault_kind = KINDS[kind]
        at_s = number(raw, "at_s", where, 0.0, 3600.0, required=True)
        target = Target.parse(raw.get("target"))
        if target.tier not in fault_kind.targets:
            raise ValueError(f"{where}: {kind} targets {' or '.join(fault_kind.targets)}, "
                             f"not {target}")
        if target.transceiver is not None and not fault_kind.names_transceiver:
            naming = [k.name for k in KINDS.values() if k.names_transceiver]
            raise ValueError(f"{where}: only {' or '.join(naming)} names a transceiver")
        extra = set(raw) - set(COMMON_FIELDS) - fault_kind.options.keys()
        if extra:
            raise ValueError(f"{where}: {kind} takes no {', '.join(sorted(extra))}")
        return cls(name, at_s, kind, target, fault_kind.options.parse(raw, where, kind))

    def check_world(self, clusters: tuple[str, ...], transceivers: int) -> None:
        """Raise ValueError for a cluster target the scenario does not run."""
        t = self.target
        if t.tier == "cluster" and t.region not in clusters:
            raise ValueError(f"{t}: {t.region} is not one of the clusters "
                             f"({', '.join(clusters)})")
        if t.transceiver is not None and t.transceiver > transceivers:
            raise ValueError(f"{t}: the clusters run transceivers 1..{transceivers}")

    def check_regions(self, world_regions, client_regions) -> None:
        """Raise ValueError for a target outside this run's world (an ingress exists only
        in a client region)."""
        t = self.target
        where = client_regions if t.tier == "ingress" else world_regions
        stray = [r for r in t.regions if r not in where]
        if stray:
            raise ValueError(f"{t}: {stray[0]} is not a "
                             f"{'client ' if t.tier == 'ingress' else ''}region of this run "
                             f"({', '.join(where)})")
        stray = [r for r in self.options.client_regions if r not in client_regions]
        if stray:
            raise ValueError(f"{self.kind} to {stray[0]}: not a client region of this run "
                             f"({', '.join(client_regions)})")

    @property
    def ends_after_s(self) -> float | None:
        """Seconds from the fault to its end (the restart or the end of its duration)."""
        return self.options.ends_after_s
