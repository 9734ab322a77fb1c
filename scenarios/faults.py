"""Faults during live calls: break a service or a link of one architecture's edge at the
scenario's times, mend it, and record what happened (``faults.json``, docs/faults.md).

One thread per fault, all started with the clients (``FaultInjector.start``): each sleeps
until its time, breaks, sleeps, mends, and writes its record. ``stop`` ends them (a fault not
reached yet is recorded as not run) and mends a link still broken (the world outlives the
architecture); a service still down stays down until the edge stops. Every relay kill proves its relay died whole: the process list
before the kill, the processes of that list still alive when the relay starts again
(orphans), and the processes holding the relay's ports after the restart.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scenarios.edge import Edge
from scenarios.faultspec import (CLUSTER_OUTAGE, LINK_DOWN, LOSS_BURST, REDIS_DOWN, RELAY_KILL,
                                 TRANSCEIVER_CRASH, FaultSpec)
from services.procfs import alive
from services.relay.counters import scrape
from services.relay.lifeline import port_holders
from topology.impairment.model import link_down, with_extra_loss
from topology.netns import in_namespace


COUNTERS_AFTER_S = 2.0  # relay kills: the new relay's per-worker counters this long after ready


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
    clients_started_unix: float | None = None  # at_s counts from here
    detail: dict = field(default_factory=dict)


class FaultInjector:
    """The faults of a scenario against one architecture's running edge and world."""

    def __init__(self, faults: tuple[FaultSpec, ...], edge: Edge, world,
                 say=lambda msg, transient=False: None) -> None:
        self.edge = edge
        self.world = world
        self.arch = edge.plan.architecture
        self.say = say
        self.records = [self._record(f) for f in faults]
        self._faults = faults
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # fault name -> (what undoes it, whether stop must run that), while it is in force
        self._broken: dict[str, tuple[Callable[[], None], bool]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ which faults apply

    def _record(self, f: FaultSpec) -> FaultRecord:
        r = FaultRecord(f.name, f.kind, str(f.target), self.arch, f.at_s)
        plan, t = self.edge.plan, f.target
        if f.kind in (RELAY_KILL, REDIS_DOWN) and not plan.relayed:
            r.applicable, r.note = False, f"{self.arch} has no relay"
        elif t.tier == "ingress" and not plan.ingresses:
            r.applicable, r.note = False, f"{self.arch} has no ingress relays"
        elif t.tier in ("backbone", "public", "last_mile"):
            try:
                self.world.link_directions(t.tier, t.region, t.other)
            except ValueError as exc:
                r.applicable, r.note = False, str(exc)
        if f.kind == RELAY_KILL:
            r.redis = f.redis and plan.redis
        return r

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the clocks now (the clients have just been started)."""
        t0 = time.time()
        for spec, record in zip(self._faults, self.records):
            record.clients_started_unix = round(t0, 6)
            if record.applicable:
                t = threading.Thread(target=self._run, args=(spec, record, t0), daemon=True,
                                     name=f"fault-{spec.name}")
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
        for spec, record in zip(self._faults, self.records):
            if (record.kind == RELAY_KILL and record.ready_unix is not None
                    and self.edge.services[_relay_name(spec)].process.alive()):
                record.detail["worker_counters_at_end"] = self._worker_counters(spec)
            if record.applicable and record.at_unix is None:
                record.note = record.note or "not reached: the calls ended first"
            elif record.applicable and record.end_unix is None and not record.note:
                record.note = "lasted to the end of the calls"
        return self.records

    def _worker_counters(self, f: FaultSpec) -> dict:
        """The restarted relay's forwarding counters per worker (what its workers carried
        since the restart; a killed relay's processes count nowhere here)."""
        name = _relay_name(f)
        keep = ("packets_to_server", "packets_to_client", "flows_created", "flows_recovered")
        try:
            workers = in_namespace(self.edge.services[name].host.netns, scrape,
                                   self.edge.metrics_url(), per_worker=True)
        except OSError as exc:
            return {"error": str(exc)}
        return {w: {k: c.get(k, 0) for k in keep} for w, c in workers.items()}

    def _run(self, spec: FaultSpec, record: FaultRecord, t0: float) -> None:
        if self._stop.wait(max(0.0, t0 + spec.at_s - time.time())):
            return
        try:
            self._apply(spec, record)
        except Exception as exc:  # noqa: BLE001 - a fault that could not be applied is a finding
            record.note = f"could not apply: {type(exc).__name__}: {exc}"
            self.say(f"[{self.arch}] fault {spec.name}: {record.note}")

    # ------------------------------------------------------------ the kinds

    def _apply(self, f: FaultSpec, r: FaultRecord) -> None:
        self.say(f"[{self.arch}] fault {f.name}: {f.kind} {f.target}")
        t = f.target
        if f.kind == RELAY_KILL:
            self._relay_kill(f, r, _relay_name(f))
        elif f.kind == REDIS_DOWN:
            self._down_then_up(f, r, [f"redis-{t.region}"], f.duration_s)
        elif f.kind == TRANSCEIVER_CRASH:
            cluster = self.edge.plan.cluster(t.region)
            self._down_then_up(f, r, [cluster.transceiver_name(t.transceiver or 1)],
                               f.restart_after_s)
        elif f.kind == CLUSTER_OUTAGE:
            cluster = self.edge.plan.cluster(t.region)
            names = [cluster.transceiver_name(i) for i in cluster.transceiver_ids]
            names += [n for n in (f"relay-{t.region}", f"redis-{t.region}", f"agent-{t.region}")
                      if n in self.edge.services]
            self._down_then_up(f, r, names, f.duration_s)
        elif f.kind in (LINK_DOWN, LOSS_BURST):
            self._link(f, r)

    def _hold(self, f: FaultSpec, mend: Callable[[], None], after: float | None,
              at_stop: bool = False) -> bool:
        """Keep fault ``f`` in force for ``after`` seconds (None: to the end), then ``mend``
        it; True when it was mended here. ``at_stop``: ``stop`` mends it if it is still in
        force then (a link: the world outlives the architecture)."""
        with self._lock:
            self._broken[f.name] = (mend, at_stop)
        if after is None or self._stop.wait(after):
            return False
        with self._lock:
            if self._broken.pop(f.name, None) is None:  # ``stop`` took it meanwhile
                return False
        mend()
        return True

    def _down_then_up(self, f: FaultSpec, r: FaultRecord, names: list[str],
                      after: float | None) -> None:
        """SIGKILL each service's main process; after ``after`` seconds (None: never) start
        them again, last killed first (the cluster's Redis and agent before its relay and
        transceivers)."""
        pids = {}
        r.at_unix = time.time()
        for name in names:
            pids[name] = self.edge.kill(name)
        r.detail["killed"] = pids

        def mend() -> None:
            r.end_unix = time.time()
            for name in reversed(names):
                self.edge.start_service(name)
            r.ready_unix = time.time()
            r.detail["started"] = {n: self.edge.processes(n) for n in names}

        self._hold(f, mend, after)

    def _relay_kill(self, f: FaultSpec, r: FaultRecord, name: str) -> None:
        edge = self.edge
        service = edge.services[name]
        p = edge.plan.ports
        before = edge.processes(name)
        r.detail["processes_before"] = before
        r.at_unix = time.time()
        edge.kill(name)
        if not r.redis and edge.plan.redis:
            # "without Redis": the restarted relay finds no flow in its cache
            redis_name = (f"redis-{f.target.region}" if f.target.tier == "cluster"
                          else f"redis-ingress-{f.target.region}")
            in_namespace(edge.services[redis_name].host.netns, _flush_redis, p.redis)
            r.detail["redis_flushed"] = True

        def mend() -> None:
            r.end_unix = time.time()
            orphans = [pid for pid in before if alive(pid)]
            r.detail["orphans_at_restart"] = orphans
            edge.start_service(name)
            r.ready_unix = time.time()
            after = edge.processes(name)
            r.detail["processes_after"] = after
            ports = [(a, p.relay) for a in _relay_addresses(edge, name)]
            holders = in_namespace(service.host.netns, port_holders, ports)
            r.detail["port_holders_after"] = sorted({h.pid for h in holders})
            strangers = sorted({h.pid for h in holders} - set(after))
            r.detail["port_holders_not_new"] = strangers
            if orphans or strangers:
                r.note = (f"ORPHANS: {orphans} of the killed relay were alive at the restart; "
                          f"{strangers} held its port afterwards")

        # then what the new relay's workers carried in their first seconds (a later fault
        # may kill the relay before the end of the calls)
        if self._hold(f, mend, f.restart_after_s or 0.0) and not self._stop.wait(
                COUNTERS_AFTER_S):
            r.detail["worker_counters_after_restart"] = self._worker_counters(f)

    def _link(self, f: FaultSpec, r: FaultRecord) -> None:
        t = f.target
        if f.kind == LINK_DOWN:
            self.world.set_link(t.tier, t.region, t.other, link_down)
        else:
            self.world.set_link(t.tier, t.region, t.other,
                                lambda imp: with_extra_loss(imp, f.loss_pct))
        r.at_unix = time.time()

        def mend() -> None:
            self.world.restore_link(t.tier, t.region, t.other)
            r.end_unix = r.ready_unix = time.time()

        self._hold(f, mend, f.duration_s, at_stop=True)


def _relay_name(f: FaultSpec) -> str:
    t = f.target
    return f"relay-{t.region}" if t.tier == "cluster" else f"ingress-{t.region}"


def _relay_addresses(edge: Edge, name: str) -> list[str]:
    plan = edge.plan
    if name.startswith("ingress-"):
        return [i.listen for i in plan.ingresses if f"ingress-{i.region}" == name]
    cluster = plan.cluster(name.removeprefix("relay-"))
    return [cluster.internal, cluster.public]


def _flush_redis(port: int) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        client.flushdb()
    finally:
        client.close()

