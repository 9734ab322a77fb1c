"""What a kind of fault is: its own fields in a scenario file, whether it exists in an
architecture, how it is applied and undone during the calls, and what it says about its
effect in faults.json. One module per kind in this package, one registry (``KINDS`` in
``__init__``); docs/faults.md, "Adding a fault kind"."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, ClassVar

from analysis.faulteffect import Effect

if TYPE_CHECKING:
    from scenarios.edge import EdgePlan
    from scenarios.faults import FaultRecord, FaultRun
    from scenarios.faultspec import FaultSpec

LINK_TIERS = ("backbone", "public", "last_mile")  # the target forms that name a link


@dataclass(frozen=True)
class Options:
    """A kind's own fields of a fault, beyond ``name``, ``at_s``, ``kind`` and ``target``:
    subclasses are data classes whose fields are the scenario file's keys."""

    @classmethod
    def keys(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def parse(cls, raw: dict, where: str, kind: str) -> "Options":
        """The options from a fault's mapping (its keys already checked against ``keys``);
        ValueError naming ``where`` for a bad value."""
        return cls()

    @property
    def ends_after_s(self) -> float | None:
        """Seconds from the fault to its end (None: it lasts to the end of the run)."""
        return None

    @property
    def client_regions(self) -> tuple[str, ...]:
        """Client regions these options name (beyond the target): the run must have them."""
        return ()


@dataclass(frozen=True)
class Lasting(Options):
    """``duration_s``: how long the fault lasts; ``optional`` kinds last to the end of the run
    without one."""

    duration_s: float | None = None
    optional: ClassVar[bool] = False

    @classmethod
    def parse(cls, raw: dict, where: str, kind: str) -> "Lasting":
        duration = number(raw, "duration_s", where, 0.1, 3600.0)
        if duration is None and not cls.optional:
            raise ValueError(f"{where}: {kind} needs duration_s")
        return cls(duration)

    @property
    def ends_after_s(self) -> float | None:
        return self.duration_s


@dataclass(frozen=True)
class Restarting(Options):
    """``restart_after_s``: the killed service starts again this long after the kill (None:
    it stays down, unless the kind has a ``default``)."""

    restart_after_s: float | None = None
    default: ClassVar[float | None] = None

    @classmethod
    def parse(cls, raw: dict, where: str, kind: str) -> "Restarting":
        restart = number(raw, "restart_after_s", where, 0.0, 600.0)
        return cls(cls.default if restart is None else restart)

    @property
    def ends_after_s(self) -> float | None:
        return self.restart_after_s


class FaultKind:
    """One kind of fault. A subclass names it, the targets it takes and its ``Options``, and
    implements ``apply``; the rest has defaults that fit most kinds."""

    name: ClassVar[str]
    targets: ClassVar[tuple[str, ...]]        # target tiers: cluster, ingress, LINK_TIERS
    options: ClassVar[type[Options]] = Options
    names_transceiver: ClassVar[bool] = False  # its cluster target may name a transceiver
    measures: ClassVar[tuple[str, ...]] = ()   # optional faults.csv columns its row fills
    steers: ClassVar[bool] = False             # it moves calls between clusters

    def not_applicable(self, spec: FaultSpec, plan: EdgePlan) -> str | None:
        """Why this fault does not exist in the plan's architecture (None: it does)."""
        return None

    def prepare(self, spec: FaultSpec, record: FaultRecord, plan: EdgePlan) -> None:
        """Fill the record's kind-specific fields before the calls (e.g. ``redis``)."""

    def apply(self, run: FaultRun) -> None:
        """Break, keep it broken, mend (``run.hold``), filling ``run.record``: ``at_unix``
        when it broke, ``end_unix`` when it ended, ``ready_unix`` when the service was ready
        again. Runs in the fault's own thread; an exception is recorded as the note."""
        raise NotImplementedError

    def finish(self, run: FaultRun) -> None:
        """At the injector's stop, after everything still broken was mended: a last look
        (e.g. the restarted relay's counters)."""

    def access_links(self, spec: FaultSpec) -> tuple[tuple[str, str], ...]:
        """Second access links (from region, to region) the world must build for this fault
        (``WorldSpec.handovers``)."""
        return ()

    def effect(self, spec: FaultSpec) -> Effect:
        """What faults.json says about this fault's effect (analysis/faulteffect.py)."""
        return Effect(hits=(str(spec.target),), measures=self.measures, steers=self.steers)


def number(raw: dict, key: str, where: str, lo: float, hi: float,
           required: bool = False) -> float | None:
    """``raw[key]`` as a float in [lo, hi] (None when absent and not required)."""
    value = raw.get(key)
    if value is None:
        if required:
            raise ValueError(f"{where}: {key} is required")
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{where}: {key}: {lo:g}..{hi:g} ({value!r})")
    return float(value)
