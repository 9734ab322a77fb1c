"""Faults during live calls: break a service or a link of one architecture's edge at the
scenario's times, mend it, and record what happened (``faults.json``, docs/faults.md).

One thread per fault, all started with the clients (``FaultInjector.start``): each sleeps
until its time, then its kind (scenarios/faultkinds/) breaks, holds and mends it through a
``FaultRun`` and fills its record. ``stop`` ends them (a fault not reached yet is recorded as
not run) and mends a link still broken (the world outlives the architecture); a service still
down stays down until the edge stops.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scenarios.edge import Edge
from scenarios.faultkinds import LINK_TIERS
from scenarios.faultspec import FaultSpec


@dataclass
class FaultRecord:
    """One fault in one architecture: the faults.json record (docs/faults.md)."""

    fault: str
    kind: str
    target: str
    architecture: str
    planned_at_s: float
    applicable: bool = True
    note: str = ""
    at_unix: float | None = None      # the fault happened (kill sent, link cut)
    end_unix: float | None = None     # it ended (restart begun, Redis started, link restored)
    ready_unix: float | None = None   # the restarted service answered ready
    redis: bool | None = None
    clock_unix: float | None = None   # at_s counts from here: when the first call was due
    detail: dict = field(default_factory=dict)
    effect: dict = field(default_factory=dict)  # its kind's Effect (analysis/faulteffect.py)


class FaultRun:
    """One fault against one architecture's edge and world: what its kind's ``apply`` and
    ``finish`` work with."""

    def __init__(self, spec: FaultSpec, record: FaultRecord, injector: "FaultInjector"
                 ) -> None:
        self.spec = spec
        self.record = record
        self._injector = injector

    @property
    def edge(self) -> Edge:
        return self._injector.edge

    @property
    def world(self):
        return self._injector.world

    def signal_clients(self, region: str, sig: int) -> int:
        """Send ``sig`` to the project's aiortc client process of ``region`` (``client-R``,
        scenarios/clients/); how many were running to get it."""
        told = 0
        for proc in list(self._injector.clients):
            if proc.name == f"client-{region}" and proc.alive():
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    continue
                told += 1
        return told

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds``; True when the injector was stopped meanwhile (stop there)."""
        return self._injector._stop.wait(seconds)

    def hold(self, mend: Callable[[], None], after: float | None,
             at_stop: bool = False) -> bool:
        """Keep the fault in force for ``after`` seconds (None: to the end), then ``mend``
        it; True when it was mended here. ``at_stop``: ``stop`` mends it if it is still in
        force then (a link: the world outlives the architecture)."""
        inj, name = self._injector, self.spec.name
        with inj._lock:
            inj._broken[name] = (mend, at_stop)
        if after is None or self.wait(after):
            return False
        with inj._lock:
            if inj._broken.pop(name, None) is None:  # ``stop`` took it meanwhile
                return False
        mend()
        return True

    def down_then_up(self, names: list[str], after: float | None) -> None:
        """SIGKILL each service's main process; after ``after`` seconds (None: never) start
        them again, last killed first (the cluster's Redis and agent before its relay and
        transceivers)."""
        edge, r = self.edge, self.record
        pids = {}
        r.at_unix = time.time()
        for name in names:
            pids[name] = edge.kill(name)
        r.detail["killed"] = pids

        def mend() -> None:
            r.end_unix = time.time()
            for name in reversed(names):
                edge.start_service(name)
            r.ready_unix = time.time()
            r.detail["started"] = {n: edge.processes(n) for n in names}

        self.hold(mend, after)


class FaultInjector:
    """The faults of a scenario against one architecture's running edge and world."""

    def __init__(self, faults: tuple[FaultSpec, ...], edge: Edge, world,
                 say=lambda msg, transient=False: None, clients=()) -> None:
        """``clients``: the run's client processes (a list the runner fills as it starts
        them), for kinds that ask the callers to act (``ice_restart``)."""
        self.edge = edge
        self.world = world
        self.clients = clients
        self.arch = edge.plan.architecture
        self.say = say
        self.runs = [FaultRun(f, self._record(f), self) for f in faults]
        self.records = [run.record for run in self.runs]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # fault name -> (what undoes it, whether stop must run that), while it is in force
        self._broken: dict[str, tuple[Callable[[], None], bool]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ which faults apply

    def _record(self, f: FaultSpec) -> FaultRecord:
        r = FaultRecord(f.name, f.kind, str(f.target), self.arch, f.at_s)
        kind, plan, t = f.fault_kind, self.edge.plan, f.target
        why = kind.not_applicable(f, plan)
        if why:
            r.applicable, r.note = False, why
        elif t.tier == "ingress" and not plan.ingresses:
            r.applicable, r.note = False, f"{self.arch} has no ingress relays"
        elif t.tier in LINK_TIERS:
            try:
                self.world.link_directions(t.tier, t.region, t.other)
            except ValueError as exc:
                r.applicable, r.note = False, str(exc)
        kind.prepare(f, r, plan)
        r.effect = kind.effect(f).to_dict()
        return r

    # ------------------------------------------------------------ lifecycle

    def start(self, t0: float | None = None) -> None:
        """Start the clocks at ``t0`` (Unix s: when the clients' first call is due), or now."""
        t0 = time.time() if t0 is None else t0
        for run in self.runs:
            run.record.clock_unix = round(t0, 6)
            if run.record.applicable:
                t = threading.Thread(target=self._run, args=(run, t0), daemon=True,
                                     name=f"fault-{run.spec.name}")
                t.start()
                self._threads.append(t)

    def stop(self) -> list[FaultRecord]:
        """End the fault threads, mend what is still broken, return the records."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        with self._lock:
            pending = [(n, mend) for n, (mend, at_stop) in self._broken.items() if at_stop]
            self._broken.clear()
        for name, mend in pending:
            record = next(r for r in self.records if r.fault == name)
            try:
                mend()
            except Exception as exc:  # noqa: BLE001 - recorded; the edge stops anyway
                record.note = (record.note + "; " if record.note else "") + \
                    f"mending at the end failed: {exc}"
        for run in self.runs:
            record = run.record
            if record.applicable:
                run.spec.fault_kind.finish(run)
            if record.applicable and record.at_unix is None:
                record.note = record.note or "not reached: the calls ended first"
            elif record.applicable and record.end_unix is None and not record.note:
                record.note = "lasted to the end of the calls"
        return self.records

    def _run(self, run: FaultRun, t0: float) -> None:
        spec, record = run.spec, run.record
        if self._stop.wait(max(0.0, t0 + spec.at_s - time.time())):
            return
        try:
            self.say(f"[{self.arch}] fault {spec.name}: {spec.kind} {spec.target}")
            spec.fault_kind.apply(run)
        except Exception as exc:  # noqa: BLE001 - a fault that could not be applied is a finding
            record.note = f"could not apply: {type(exc).__name__}: {exc}"
            self.say(f"[{self.arch}] fault {spec.name}: {record.note}")
