"""Faults a scenario lists: what breaks, where, when, and for how long (docs/faults.md)."""
from __future__ import annotations

from dataclasses import dataclass

RELAY_KILL, REDIS_DOWN, TRANSCEIVER_CRASH = "relay_kill", "redis_down", "transceiver_crash"
CLUSTER_OUTAGE, LINK_DOWN, LOSS_BURST = "cluster_outage", "link_down", "loss_burst"
KINDS = (RELAY_KILL, REDIS_DOWN, TRANSCEIVER_CRASH, CLUSTER_OUTAGE, LINK_DOWN, LOSS_BURST)
LINK_KINDS = ("backbone", "public", "last_mile")

# kind -> the target forms it accepts (the first word of "word/region[/...]")
_TARGETS = {RELAY_KILL: ("cluster", "ingress"), REDIS_DOWN: ("cluster",),
            TRANSCEIVER_CRASH: ("cluster",), CLUSTER_OUTAGE: ("cluster",),
            LINK_DOWN: LINK_KINDS, LOSS_BURST: LINK_KINDS}
_FIELDS = {"name", "at_s", "kind", "target", "restart_after_s", "duration_s", "redis",
           "loss_pct"}


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
    """One fault, ``at_s`` seconds after an architecture's first client session started.

    ``restart_after_s``: relay_kill and transceiver_crash start the service again this long
    after the kill (None for a transceiver: it stays down). ``duration_s``: how long
    redis_down, cluster_outage, link_down and loss_burst last (None for an outage: to the end
    of the run). ``redis``: relay_kill only; false runs that architecture's relays without
    Redis. ``loss_pct``: loss_burst's extra loss."""

    name: str
    at_s: float
    kind: str
    target: Target
    restart_after_s: float | None = None
    duration_s: float | None = None
    redis: bool = True
    loss_pct: float | None = None

    @classmethod
    def parse(cls, raw, index: int) -> "FaultSpec":
        if not isinstance(raw, dict):
            raise ValueError(f"fault {index + 1}: a mapping with at_s, kind and target")
        unknown = set(raw) - _FIELDS
        if unknown:
            raise ValueError(f"fault {index + 1}: unknown field(s) {', '.join(sorted(unknown))}")
        name = raw.get("name", f"f{index + 1}")
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"fault {index + 1}: name: letters, digits, - and _ ({name!r})")
        where = f"fault {name}"
        kind = raw.get("kind")
        if kind not in KINDS:
            raise ValueError(f"{where}: kind: one of {', '.join(KINDS)} ({kind!r})")
        at_s = _number(raw, "at_s", where, 0.0, 3600.0, required=True)
        target = Target.parse(raw.get("target"))
        if target.tier not in _TARGETS[kind]:
            raise ValueError(f"{where}: {kind} targets {' or '.join(_TARGETS[kind])}, "
                             f"not {target}")
        if target.transceiver is not None and kind != TRANSCEIVER_CRASH:
            raise ValueError(f"{where}: only transceiver_crash names a transceiver")
        allowed = {RELAY_KILL: {"restart_after_s", "redis"},
                   TRANSCEIVER_CRASH: {"restart_after_s"},
                   REDIS_DOWN: {"duration_s"}, CLUSTER_OUTAGE: {"duration_s"},
                   LINK_DOWN: {"duration_s"}, LOSS_BURST: {"duration_s", "loss_pct"}}[kind]
        extra = set(raw) - {"name", "at_s", "kind", "target"} - allowed
        if extra:
            raise ValueError(f"{where}: {kind} takes no {', '.join(sorted(extra))}")
        restart = _number(raw, "restart_after_s", where, 0.0, 600.0)
        if kind == RELAY_KILL and restart is None:
            restart = 0.5
        duration = _number(raw, "duration_s", where, 0.1, 3600.0)
        if kind in (REDIS_DOWN, LINK_DOWN, LOSS_BURST) and duration is None:
            raise ValueError(f"{where}: {kind} needs duration_s")
        loss = _number(raw, "loss_pct", where, 0.1, 100.0, required=kind == LOSS_BURST)
        redis = raw.get("redis", True)
        if not isinstance(redis, bool):
            raise ValueError(f"{where}: redis is true or false")
        return cls(name, at_s, kind, target, restart, duration, redis, loss)

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

    @property
    def ends_after_s(self) -> float | None:
        """Seconds from the fault to its end (the restart or the end of its duration)."""
        return self.restart_after_s if self.kind in (RELAY_KILL, TRANSCEIVER_CRASH) \
            else self.duration_s


def _number(raw: dict, key: str, where: str, lo: float, hi: float,
            required: bool = False) -> float | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise ValueError(f"{where}: {key} is required")
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{where}: {key}: {lo:g}..{hi:g} ({value!r})")
    return float(value)
