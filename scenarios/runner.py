"""The scenario runner: build the world, calibrate, run every architecture, write the results.

For each architecture of the scenario (scenarios/architectures/: one module each, or the
scenario's own external ones), in the same world and with the same clients: its edge on the
world's hosts, the clients of every client region, then its results. What the analysis needs
to know about each architecture goes to ``architectures.json``.

The regional signaling front (anycast, in every client region) sends each call to the cluster
it measures nearest that is healthy and under its load threshold, over the backbone; its
decisions go to ``steering.csv``. Results go to ``results/<scenario>-<region>-<time>/``
(docs/scenarios.md lists the files).
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from scenarios.architectures.base import BACKBONE
from scenarios.edge import (ClusterPlan, Edge, EdgePlan, FrontPlan, FrontRoute, Host,
                            IngressPlan, TurnPlan, count_ports)
from scenarios.faults import FaultInjector, FaultRecord
from scenarios.hostcpu import HostCpu, HostCpuWatch, process_groups
from scenarios.idleprobe import SERVICE as IDLE_PROBE
from scenarios.haltpoll import HaltPolling
from scenarios.hostlock import HostLock
from scenarios.priorities import SOFTIRQ, Raised, softirq_threads
from scenarios.processes import ServiceError, ServiceProcess, voiceedge_cmd
from scenarios.clients import REGISTRY, ClientCommand, RegionClients, results_suffixes
from scenarios.clients import commands as client_commands
from scenarios.spec import Scenario, ScenarioError
from scenarios.saturation import LagWindows, flag
from scenarios.timeline import TIMELINE, merge_timeline
from topology.calibrate import CalibrationReport, calibrate, prepare_verdicts, session_links
from topology.capture import WorldCapture, capture_hosts
from topology.loadcal import EngineWindow, LoadCalibration, calibrate_under_load, engine_stats
from topology.netns import in_namespace
from topology.plan import world_spec
from topology.regions import RegionsCatalog
from topology.world import World
from services.clienttypes import AIORTC
from voiceedge.results import RX_LOG_SUFFIX

SESSION_FIELDS = (
    "architecture", "client_region", "cluster_region", "session", "client", "ok", "error",
    "stage",
    "signaling_ms", "offer_ms", "first_ice_rtt_ms", "ice_connected_ms", "setup_ms",
    "first_audio_ms", "rtt_ms", "consent_rtt_ms", "jitter_ms", "loss_pct", "packets_received",
    "packets_lost", "loss_bursts", "echo_verified", "datachannel_verified",
    "floor_signaling_rtt_ms", "floor_media_rtt_ms", "floor_setup_ms", "saturated",
    "saturated_by", "started_unix", "ended_unix", "connected_unix", "reconnections",
    "renominations", "renominated", "moved", "ice_restarts",
    "transceiver", "first_rx_unix", "last_rx_unix", "client_type", "offer_style", "gathered_ms",
    "ice_checking_ms", "turn_transactions", "ice_pair", "verifies", "verified",
    "datachannel_echo")
# Every call a client made for a session: the first (attempt 0) and each reconnection.
# turns.csv: one row per caller line of a conversation (services/client/conversation.py Turn)
TURN_FIELDS = ("architecture", "client_region", "session", "client_type", "turn", "barge_in",
               "speech_start_unix", "speech_end_unix", "cut_reply_end_unix", "reply_arrived_unix",
               "reply_heard_unix",
               "reply_end_unix", "agent_voice_end_unix", "agent_detected_unix",
               "agent_first_frame_unix", "agent_status", "agent_late_frames",
               "agent_barge_detected_unix", "playout_concealed_ms", "playout_stretched_ms", "audio")
ATTEMPT_FIELDS = ("architecture", "client_region", "session", "attempt", "reason",
                  "started_unix", "connected_unix", "cluster_region", "transceiver", "error")
# RTP arrival gaps of 60 ms or more: "down" at the client, "up" at the transceiver.
GAP_FIELDS = ("architecture", "client_region", "session", "direction", "start_unix", "ms",
              "attempt")
SAMPLE_FIELDS = ("architecture", "client_region", "session", "t_ms", "packets_received",
                 "packets_lost", "jitter_ms", "rtt_ms")
# One row per call a front placed (event call_created) and per change of a front's preferred
# cluster (steering_changed: cluster is the new one, reason why), from the fronts' logs.
STEERING_FIELDS = ("architecture", "client_region", "front", "event", "unix", "call",
                   "cluster", "nearest", "reason")
# Every client process of an architecture starts up (imports, the native pump, a warm-up
# offer: 0.6 s of CPU each here) before any of them calls: up, each waits for the file
# CALLS_START, which the runner writes once all have logged CLIENT_UP_EVENT, with a time
# CALLS_LEAD_S ahead. (Ten processes starting beside the first calls of the others lagged
# them 100-280 ms in REGION=all.) A process up early is still lagged by the others' start-up
# (0.5-0.6 s in REGION=all), so with more than one, the first calls are due just after the
# next whole second: the lag is then in a second of its own, not in one a call was live in
# (the lag watch's windows are whole seconds).
CALLS_LEAD_S = 0.05
POLL_S = 0.5                      # the runner's progress and watches while calls run
EXIT_CHECK_S = 0.05               # how soon it notices the last client process ended
RELAY_PUBLISH_S = 0.6             # relays publish their counters twice a second
CALLS_START = "calls-start"      # in an architecture's logs: when its clients' first calls are due
CLIENT_UP_EVENT = "client_warm_up"
CLIENT_UP_TIMEOUT_S = 120.0
# The edge's public UDP bindings are read at every new peak of live sessions and otherwise this
# often (a pass over /proc: read twice a second it took 15-20% of a core in REGION=all).
BINDINGS_EVERY_S = 2.0
ARCHITECTURES_FILE = "architectures.json"  # analysis/archinfo.py reads it
PORT_FIELDS = ("architecture", "concurrent_sessions", "public_udp_ports", "public_udp_ports_max",
               "bindings")


@dataclass(frozen=True)
class CaptureOptions:
    """Packet captures of every architecture (docs/captures.md)."""

    cap_mb: float = 64.0   # per capture point
    snaplen: int = 256     # bytes kept of each frame


class CalibrationFailed(RuntimeError):
    """The world is not the configured one: no numbers are reported from it."""

    def __init__(self, report: CalibrationReport) -> None:
        bad = ", ".join(f"{p.kind} {p.src}->{p.dst}" for p in report.failures[:6])
        super().__init__(f"calibration failed on {len(report.failures)} path(s): {bad}")
        self.report = report


@dataclass
class ArchitectureRun:
    architecture: str
    sessions: list[dict]
    samples: list[dict]
    relays: dict[str, dict]
    peak_sessions: int
    public_udp_ports: int       # measured at the peak of concurrent sessions
    public_udp_ports_max: int   # the most seen at any sample
    bindings: list[str]         # "service address:port" at the peak
    seconds: float
    load_calibration: LoadCalibration | None = None  # the calls' paths probed during the calls
    steering: list[dict] = field(default_factory=list)  # steering.csv rows
    attempts: list[dict] = field(default_factory=list)  # attempts.csv rows
    gaps: list[dict] = field(default_factory=list)      # gaps.csv rows
    faults: list[FaultRecord] = field(default_factory=list)
    host_cpu: HostCpu | None = None  # where the host's CPU went while the calls ran
    turns: list[dict] = field(default_factory=list)     # turns.csv rows (conversations)

    @property
    def success_pct(self) -> float:
        ok = sum(1 for s in self.sessions if s["ok"])
        return 100.0 * ok / len(self.sessions) if self.sessions else 0.0


@dataclass
class RunResult:
    directory: Path
    scenario: Scenario
    client_regions: list[str]
    clusters: list[str]
    backend: str
    calibration: CalibrationReport | None  # None: a deployment target (scenarios/target.py)
    architectures: list[ArchitectureRun] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)

    @property
    def failed_architectures(self) -> list[str]:
        """Architectures whose success rate is below the scenario's ``min_success_pct``."""
        return [a.architecture for a in self.architectures
                if a.success_pct < self.scenario.min_success_pct]


def git_commit() -> str:
    """The checkout's short commit ('' outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return ""


def _get_json(url: str, headers: dict[str, str] | None = None) -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                timeout=2) as r:
        return json.loads(r.read())


class ScenarioRunner:
    """One run of a scenario for the clients of one region spec."""

    def __init__(self, scenario: Scenario, region: str, results_root: Path = Path("results"),
                 backend: str | None = None, say=lambda msg, transient=False: None,
                 progress=None, capture: CaptureOptions | None = None,
                 keep_world=None, directory: Path | None = None,
                 order: tuple[str, ...] | None = None) -> None:
        """``say(msg, transient)`` reports progress in words; ``progress(what, done, total)``
        drives a progress bar (calibration paths, sessions). ``capture``: write pcaps of
        every architecture and analyse them. ``keep_world(world, edge)``: called once the
        results are written, with the world and the last architecture's services still up;
        they are torn down when it returns. ``directory``: the results folder (default
        ``results_root/<scenario>-<region>-<time>``); ``order``: the order the architectures
        run in (default the scenario's; a sweep rotates it from point to point)."""
        self.say = say
        self.progress = progress or (lambda what, done, total: None)
        catalog = RegionsCatalog.load()
        if scenario.profiles:
            catalog = catalog.with_overrides(scenario.profiles)
        self.catalog = catalog
        self.client_regions = [r.name for r in catalog.resolve(region)]
        # the scenario as run: a live_at_once load becomes these regions' start rate (an input)
        self.scenario = scenario = scenario.for_client_regions(len(self.client_regions))
        self.clusters = [r.name for r in catalog.resolve(",".join(scenario.clusters))]
        regions = list(dict.fromkeys(self.client_regions + self.clusters))
        for f in scenario.faults:
            try:
                f.check_regions(regions, self.client_regions)
            except ValueError as exc:
                raise ScenarioError(f"{scenario.source or scenario.name}: fault {f.name}: "
                                    f"{exc}") from None
        self.spec = world_spec(catalog, regions, self.clusters, scenario.last_mile)
        if scenario.nat is not None:   # the clients of every client region behind one
            self.spec = dataclasses.replace(
                self.spec, nats={r: scenario.nat for r in self.client_regions})
        try:   # second access links the faults move clients onto (a handover)
            handovers = tuple(dict.fromkeys(
                link for f in scenario.faults for link in f.fault_kind.access_links(f)))
            if handovers:
                self.spec = dataclasses.replace(self.spec, handovers=handovers)
        except ValueError as exc:
            raise ScenarioError(f"{scenario.source or scenario.name}: {exc}") from None
        self.backend_name = backend
        self.capture = capture
        self.keep_world = keep_world
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.directory = directory or (
            results_root / f"{scenario.name}-{region.replace(',', '+')}-{stamp}")
        self.order = tuple(order or scenario.architectures)
        # the SCHED_FIFO priorities the run gives (ordinary where it may not)
        self.priorities, self.priorities_refused = scenario.realtime.usable()
        self.halt_polling = ""   # what the run had (haltpoll.py), once it runs
        self._host = HostLock()  # one run of a world at a time on this host (hostlock.py)
        if sorted(self.order) != sorted(scenario.architectures):
            raise ValueError(f"order {self.order} is not the scenario's architectures")

    # ------------------------------------------------------------ the run

    def run(self) -> RunResult:
        """Build, calibrate, run each architecture; results are written after each one, so an
        interrupted or failed run leaves a folder ``voiceedge report`` can read."""
        from topology.impairment.factory import make_backend

        started = time.monotonic()
        with self._host:
            backend = make_backend(self.backend_name)
            self.say(f"world: {', '.join(self.spec.regions)} (clusters "
                     f"{', '.join(self.clusters)}); impairment backend: {backend.name}")
            if self.priorities_refused:
                self.say(f"services and clients run ordinary: {self.priorities_refused}")
            world = World(self.spec, backend)
            with world:
                self.say(f"world built in {world.build_seconds:.1f} s")
                result = self.run_in(world)
        result.timings.update(build_s=round(world.build_seconds, 2),
                              teardown_s=round(world.teardown_seconds, 2),
                              total_s=round(time.monotonic() - started, 1))
        write_results(result)
        return result

    def run_in(self, world: World) -> RunResult:
        """Calibrate ``world`` (built from this runner's spec, or re-impaired to it) and run
        each architecture in it; CalibrationFailed when the world is off. The world stays up."""
        with (self._host,
              Raised(softirq_threads(), 0 if self.priorities.ordinary else SOFTIRQ),
              HaltPolling(self.scenario.halt_poll_us) as polling):
            self.halt_polling = polling.state
            return self._run_in(world)

    def _run_in(self, world: World) -> RunResult:
        self.directory.mkdir(parents=True, exist_ok=False)
        (self.directory / "logs").mkdir()
        backend = world.backend
        self.say(f"calibrating {len(world.links) + 1} paths")
        before, t0 = engine_stats(world), time.monotonic()
        report = calibrate(world, count=self.scenario.calibration_count,
                           rate=self.scenario.calibration_rate,
                           progress=lambda done, total: self.progress(
                               "calibration", done, total))
        engine = EngineWindow.between(before, engine_stats(world), time.monotonic() - t0)
        (self.directory / "calibration.json").write_text(
            json.dumps(report.to_dict() | {"engine": asdict(engine)}, indent=2))
        result = RunResult(self.directory, self.scenario, self.client_regions,
                           self.clusters, backend.name, report)
        self._write_config(result)
        if not report.ok:
            raise CalibrationFailed(report)
        self.say(f"calibration passed ({len(report.paths)} paths)")
        kept = None
        try:
            for n, arch in enumerate(self.order, start=1):
                last = n == len(self.order)
                run, kept = self._run_architecture(
                    world, arch, keep_edge=last and self.keep_world is not None)
                result.architectures.append(run)
                write_results(result)
            stats = backend.stats()
            result.timings["engine"] = {k: v for k, v in stats.items()
                                        if not isinstance(v, (dict, list))}
            # every impaired interface's counters over the run (seen, delayed, dropped_loss)
            (self.directory / "impairment.json").write_text(json.dumps(
                {k: v for k, v in stats.items() if k != "lateness_hist"}, indent=2))
            if self.capture is not None:
                self._analyse_captures(result)
            if kept is not None:
                self.keep_world(world, kept)
        finally:
            if kept is not None:
                kept.stop()
        return result

    def _write_config(self, result: RunResult) -> None:
        commit = git_commit()
        impairments = {f"{k[0]} {k[1]}->{k[2]}": asdict(v) for k, v in self.spec.impairments.items()}
        (self.directory / "config.json").write_text(json.dumps({
            "scenario": self.scenario.to_dict(), "client_regions": self.client_regions,
            "clusters": self.clusters, "world_regions": list(self.spec.regions),
            "architectures": list(self.scenario.architectures), "order": list(self.order),
            "baseline": self.scenario.baseline,
            "realtime": asdict(self.priorities), "halt_polling": self.halt_polling,
            "backend": result.backend, "commit": commit,
            "impairments": impairments,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2, default=str))
        write_architectures(self.directory, self.scenario)

    # ------------------------------------------------------------ one architecture

    def edge_plan(self, world: World, name: str) -> EdgePlan:
        """The edge of architecture ``name`` on the world's hosts, at the addresses of its
        address plan: clusters and fronts always, a client region's edge host services
        (ingress, TURN) where the architecture has them."""
        arch = self.scenario.architecture(name)

        def host(name: str) -> Host:
            return Host(name, world.node(name).ns_path)

        clusters = []
        for name in self.clusters:
            h = f"cluster{world.index[name]}"
            clusters.append(ClusterPlan(name, world.index[name], host(h),
                                        public=world.addresses[h]["public"],
                                        internal=world.addresses[h]["backbone"],
                                        transceivers=self.scenario.transceivers_per_cluster))
        fronts, ingresses, turns, vip = [], [], [], None
        for region in self.client_regions:
            h = f"edge{world.index[region]}"
            addresses = world.addresses[h]
            vip = addresses["relay_vip"]
            routes = tuple(FrontRoute(c, 0.0 if c == region
                                      else self.catalog.backbone_rtt_ms(region, c))
                           for c in self.clusters)
            fronts.append(FrontPlan(region, host(h), addresses["signaling_vip"], routes))
            if arch.ingress:
                ingresses.append(IngressPlan(region, host(h), addresses["relay_vip"],
                                             addresses["backbone"]))
            if arch.turn:  # on the edge host's public side, as a TURN provider's would be
                turns.append(TurnPlan(region, host(h), addresses["public"]))
        media = ("--media-path", self.scenario.media_path) if not arch.external else ()
        talk = self.scenario.conversation
        return EdgePlan(arch, tuple(clusters), tuple(fronts), tuple(ingresses), tuple(turns),
                        relay_vip=vip, transceiver_args=media,
                        agent_args=talk.agent_args() if talk is not None else (),
                        api_keys=True)   # the fronts as deployed: every client has a token

    def _analyse_captures(self, result: RunResult) -> None:
        from analysis.pcap.hops import analyse

        self.say("analysing the captures")
        wire = analyse(self.directory)
        result.timings["capture_analysis_s"] = round(sum(a.cost["analysis_s"] for a in wire), 2)
        for a in wire:
            off = ", ".join(f"{h.direction} {h.hop}" for h in a.off)
            self.say(f"[{a.architecture}] on the wire: {len(a.hops)} hops, "
                     f"{'all as configured' if not off else 'OFF: ' + off}")

    def _run_architecture(self, world: World, arch: str,
                          keep_edge: bool = False) -> tuple[ArchitectureRun, Edge | None]:
        """One architecture's run; with ``keep_edge`` its services are left running and
        returned (the caller stops them)."""
        sc = self.scenario
        logs = self.directory / "logs" / arch
        logs.mkdir(parents=True)
        started = time.monotonic()
        self.say(f"[{arch}] starting services")
        plan = self.edge_plan(world, arch)
        clients: list[ServiceProcess] = []
        load_calibration = None
        injector: FaultInjector | None = None
        faults: list[FaultRecord] = []
        idle_probe: ServiceProcess | None = None
        edge = Edge(plan, logs, realtime=self.priorities.services)
        captures = None
        finished = False
        try:
            if self.capture is not None:
                captures = WorldCapture(
                    world, capture_hosts(world, self.client_regions, self.clusters),
                    self.directory / "pcap" / arch, snaplen=self.capture.snaplen,
                    cap_bytes=int(self.capture.cap_mb * 2**20),
                    say=lambda msg: self.say(f"[{arch}] {msg}"))
                captures.start()
                self.say(f"[{arch}] capturing at {len(captures.points)} hosts")
            # The clients that wait for the start file warm up while the services start.
            regions = self._regions(world, edge, logs, captures)
            waiting = self._launch_waiting_clients(arch, regions, logs, clients)
            edge.start()
            watch = _PeakWatch(edge)
            # No calibration at load while faults break paths on purpose (docs/faults.md).
            # Made before the clients start: it prepares its verdicts then, not beside them.
            at_load = (_AtLoad(self, world, arch, watch)
                       if sc.calibration_at_load and not sc.faults else None)
            cpu = HostCpuWatch(lambda: cpu_groups(world, edge, clients),
                               lambda: all(c.alive() for c in clients))
            idle_probe = ServiceProcess(IDLE_PROBE, [sys.executable, "-m", "scenarios.idleprobe"],
                                        logs / f"{IDLE_PROBE}.log",
                                        realtime=self.priorities.clients).start()
            calls_at = self._start_clients(arch, regions, logs, clients, waiting)
            if sc.faults:
                injector = FaultInjector(sc.faults, edge, world, self.say, clients)
                injector.start(calls_at)
            watch.start()
            results = ResultCount(logs)
            # The plan only bounds the progress bar and the deadline (a fault run's calls may
            # each call again: 10 s set-up and 1 s wait per attempt, the client's own bounds);
            # what ran is counted from the clients' results, live sessions from the edge. It
            # counts the fronts that got clients, not the configured regions.
            planned = sc.total_per_region * len(plan.fronts)
            deadline = (time.monotonic() + planned / sc.start_rate + sc.call_duration_s + 90
                        + 11 * sc.reconnect_attempts * bool(sc.faults))
            while any(c.alive() for c in clients):
                if time.monotonic() > deadline:
                    raise ServiceError(f"[{arch}] clients did not finish in time")
                done, failed = results.poll()
                self.progress(arch, done, planned)
                self.say(f"[{arch}] {done} of {planned} planned sessions done, {failed} failed, "
                         f"{watch.live} live, "
                         f"{time.monotonic() - started:.0f} s", transient=True)
                watch.sample()
                if cpu.is_open:
                    cpu.sample()
                elif time.time() >= calls_at:
                    cpu.open()
                if captures is not None:
                    captures.poll()
                if at_load is not None:
                    at_load.poll(done)
                _while_any_runs(clients, POLL_S)
            ended = time.monotonic()
            if at_load is not None:
                load_calibration = at_load.finish()
            if injector is not None:
                faults = _note_late_clients(injector.stop(), logs)
                injector = None
            watch.stop()
            # relays publish their counters twice a second: one more after the last datagram
            time.sleep(max(0.0, ended + RELAY_PUBLISH_S - time.monotonic()))
            relays = edge.relay_counters()
            finished = True
        finally:
            for proc in clients:  # stopped with the services, also on Ctrl-C
                proc.stop()
            if idle_probe is not None:
                idle_probe.stop()
            if injector is not None:  # an error or Ctrl-C: mend links before the next run
                faults = injector.stop()
            if captures is not None:
                captures.stop()
            if not (keep_edge and finished):
                edge.stop()
            merge_timeline(logs)
        try:
            sessions, samples, attempts, gaps, lag = self._collect(world, arch, logs)
        except BaseException:
            if keep_edge:
                edge.stop()
            raise
        host_cpu = cpu.result()
        if host_cpu is not None:
            first, last = host_cpu.whole_seconds()
            host_cpu.idle_probe = {"priority": self.priorities.clients, "seconds": last - first,
                                   "lagged_seconds": round(lag.covered([IDLE_PROBE], first, last))}
        ok = sum(1 for s in sessions if s["ok"])
        self.progress(arch, len(sessions), len(sessions))
        self.say(f"[{arch}] {ok}/{len(sessions)} sessions ok in {time.monotonic() - started:.0f} s")
        return ArchitectureRun(arch, sessions, samples, relays, watch.peak_sessions,
                               watch.ports_at_peak, watch.ports_max,
                               [f"{b.service}@{b.host} {b.address}:{b.port}"
                                for b in watch.bindings_at_peak],
                               round(time.monotonic() - started, 1), load_calibration,
                               steering_rows(arch, logs / TIMELINE), attempts, gaps,
                               faults, host_cpu,
                               turn_rows(arch, self.client_regions, logs, self.directory)
                               ), edge if keep_edge else None

    def _regions(self, world: World, edge: Edge, logs: Path, captures: WorldCapture | None
                 ) -> list[tuple[str, RegionClients]]:
        """(the client host's namespace, what its clients need) for every client region."""
        regions = []
        for n, front in enumerate(edge.plan.fronts):
            host = f"client{world.index[front.region]}"
            where = RegionClients(
                edge.signaling_url(front), front.region, logs, n, len(edge.plan.fronts),
                retry_setup=bool(self.scenario.faults),
                credential_file=edge.token_file(f"clients-{front.region}"),
                rx_log=(captures.directory / f"{host}{RX_LOG_SUFFIX}"
                        if captures is not None else None))
            regions.append((world.node(host).ns_path, where))
        return regions

    def _start_client(self, command: ClientCommand, netns: str, logs: Path,
                      clients: list[ServiceProcess]) -> ServiceProcess:
        proc = ServiceProcess(command.name, voiceedge_cmd(*command.argv),
                              command.log_path(logs), netns=netns,
                              realtime=self.priorities.clients * command.realtime).start()
        clients.append(proc)
        return proc

    def _launch_waiting_clients(self, arch: str, regions: list[tuple[str, RegionClients]],
                                logs: Path, clients: list[ServiceProcess]
                                ) -> list[ServiceProcess]:
        """The client processes that call only once ``CALLS_START`` is written (every type
        without a ready event), launched before the edge's services: their start-up and
        warm-up overlap the services' (they neither call nor send before the file)."""
        verifies, extra_args = self.client_options(arch)
        start_file = logs / CALLS_START
        return [self._start_client(c, netns, logs, clients)
                for netns, where in regions
                for c in client_commands(self.scenario, replace(where, start_file=start_file),
                                         verifies, extra_args)
                if c.ready_event is None]

    def _start_clients(self, arch: str, regions: list[tuple[str, RegionClients]], logs: Path,
                       clients: list[ServiceProcess], waiting: list[ServiceProcess]) -> float:
        """The client types with a ready event (the browsers), launched once the edge is up
        and ready before any call starts (their start-up is seconds of CPU and must not lie
        under the calls); then the ``waiting`` ones (``_launch_waiting_clients``) once they
        are up, released together by ``CALLS_START``. Appended to ``clients`` as they start
        (the caller stops them). Returns when the first calls are due (Unix time): a run's
        faults and its host CPU window count from it."""
        verifies, extra_args = self.client_options(arch)
        warming = [(self._start_client(c, netns, logs, clients), c)
                   for netns, where in regions
                   for c in client_commands(self.scenario, where, verifies, extra_args)
                   if c.ready_event is not None]
        for proc, c in warming:
            proc.wait_ready(lambda p=proc, e=c.ready_event: _logged(p.log_path, e),
                            timeout=c.ready_timeout_s)
        for proc in waiting:
            proc.wait_ready(lambda p=proc: _logged(p.log_path, CLIENT_UP_EVENT),
                            timeout=CLIENT_UP_TIMEOUT_S)
        now = time.time()
        calls_at = (math.floor(now) + 1 if len(waiting) > 1 else now) + CALLS_LEAD_S
        start_file = logs / CALLS_START
        written = start_file.with_suffix(".tmp")
        written.write_text(f"{calls_at:.6f}")
        written.rename(start_file)  # whole, as the clients read it
        return calls_at

    def client_options(self, arch: str) -> tuple[tuple[str, ...], list[str]]:
        """(what ``arch``'s clients verify, their extra options: under TURN, relay-only
        through the TURN server the front hands out) for every client type's command."""
        architecture = self.scenario.architecture(arch)
        return architecture.verifies, architecture.client_args()

    # ------------------------------------------------------------ results

    def floors(self, client: str, cluster: str, arch: str) -> dict[str, float]:
        """The network floor the configured topology implies for one session."""
        imp = self.spec.impairments

        def one_way(kind: str, a: str, b: str) -> float:
            item = imp.get((kind, a, b))
            return item.delay_ms if item else 0.0

        last_mile = (one_way("last_mile_up", client, client)
                     + one_way("last_mile_down", client, client))
        backbone = (one_way("backbone", client, cluster) + one_way("backbone", cluster, client)
                    if client != cluster else 0.0)
        public = (one_way("public", client, cluster) + one_way("public", cluster, client)
                  if client != cluster else 0.0)
        # The client opens a new connection to its region's front for each call (as a browser
        # would): the TCP handshake costs one round trip over the last mile before the POST.
        signaling = 2 * last_mile + backbone
        media = last_mile + (backbone if self.scenario.architecture(arch).media_link == BACKBONE
                             else public)
        # Setup cannot beat the offer/answer round trip plus two media round trips: the
        # client's nominating check (one RTT) overlaps the first DTLS flight, because the
        # answerer is the DTLS client and starts as soon as it is nominated, half an RTT before
        # the client sees its check answered; the DTLS handshake then needs one more RTT.
        # (A floor of "signaling + ICE RTT + 2 DTLS RTTs" would count that overlap twice:
        # measured setups here beat it.)
        return {"floor_signaling_rtt_ms": round(signaling, 2),
                "floor_media_rtt_ms": round(media, 2),
                "floor_setup_ms": round(signaling + 2 * media, 2)}

    def _collect(self, world: World, arch: str, logs: Path):
        """(sessions, samples, attempts, gaps) rows of one architecture from its logs, and the
        lagged windows of its processes."""
        engine = world.backend.stats().get("lagged_seconds")  # userspace engine only
        lag = LagWindows.from_run(logs / TIMELINE, engine)
        server = ServerSide.read(logs / TIMELINE)
        out: tuple[list, list, list, list] = ([], [], [], [])
        path = self.scenario.architecture(arch).session_path
        for region in self.client_regions:
            rows = client_rows(arch, region, logs, lag, server,
                               lambda cluster, r=region: self.floors(r, cluster, arch), path)
            for total, part in zip(out, rows):
                total += part
        return (*out, lag)


class _AtLoad:
    """Calibration at load for one architecture, in a thread, started once the first call has
    ended: the ramp-up is over, and from then on calls end about as fast as they start."""

    def __init__(self, runner: "ScenarioRunner", world: World, arch: str,
                 watch: "_PeakWatch") -> None:
        sc = runner.scenario
        links = session_links(world, runner.client_regions, runner.clusters)
        count = min(100, sc.calibration_count)
        prepare_verdicts(links, count)   # the runner makes this before the clients start

        def start() -> LoadCalibration:   # the probes in a process of their own
            return calibrate_under_load(world, arch, links, live=lambda: watch.live,
                                        count=count, rate=sc.calibration_rate)

        self._start = start
        self._say = runner.say
        self._arch = arch
        self._thread: threading.Thread | None = None
        self._result: LoadCalibration | None = None
        self._error: BaseException | None = None
        self._watch = watch

    def poll(self, calls_ended: int) -> None:
        if self._thread is None and calls_ended >= 1:
            self._say(f"[{self._arch}] calibrating again at load "
                      f"({self._watch.live} live sessions)")
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._start()
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self._error = exc

    def finish(self) -> LoadCalibration | None:
        """Wait for the probes (started now if the calls ended first) and return them."""
        if self._thread is None:
            self.poll(calls_ended=1)
        self._thread.join(timeout=120)
        if self._error is not None:
            raise self._error
        result = self._result
        if result is not None:
            verdict = "held" if result.ok else (
                f"FAILED on {len(result.report.failures)} of {len(result.report.paths)} paths")
            self._say(f"[{self._arch}] calibration at load {verdict} "
                      f"({result.live_sessions_mean:g} live sessions on average)")
        return result


class _PeakWatch:
    """Live sessions (every transceiver's /status, polled from inside its host) and the public
    UDP ports the edge holds (from /proc), sampled together: the ports at the peak of
    concurrent sessions are the figure a firewall would have to open."""

    def __init__(self, edge: Edge) -> None:
        self._edge = edge
        self._targets = edge.live_session_sources()
        self._live: dict[str, int] = {}
        self.peak_sessions = 0
        self.ports_at_peak = 0
        self.ports_max = 0
        self.bindings_at_peak: list = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._next_bindings = 0.0

    def start(self) -> None:
        for ns, url, read, headers in self._targets:
            t = threading.Thread(target=in_namespace, args=(ns, self._poll, url, read, headers),
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def _poll(self, url: str, read, headers: dict[str, str]) -> None:
        while not self._stop.wait(0.25):
            try:
                self._live[url] = read(_get_json(url, headers))
            except (OSError, ValueError, KeyError, TypeError):
                continue

    @property
    def live(self) -> int:
        """Live sessions on every transceiver, as last polled."""
        return sum(self._live.values())

    def sample(self, now: float | None = None) -> None:
        """Live sessions now (as polled); the edge's bindings (a pass over /proc, the costliest
        thing the runner does while calls run) at each new peak of live sessions, otherwise
        every BINDINGS_EVERY_S (``ports_max``)."""
        live = self.live
        now = time.monotonic() if now is None else now
        new_peak = live > self.peak_sessions or (live == self.peak_sessions
                                                 and not self.bindings_at_peak)
        if not new_peak and now < self._next_bindings:
            return
        self._next_bindings = now + BINDINGS_EVERY_S
        bindings = self._edge.public_bindings()
        ports = count_ports(bindings)
        self.ports_max = max(self.ports_max, ports)
        if live > self.peak_sessions or (live == self.peak_sessions and not self.bindings_at_peak):
            self.peak_sessions, self.ports_at_peak, self.bindings_at_peak = live, ports, bindings

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)


def _while_any_runs(clients: list[ServiceProcess], timeout_s: float) -> None:
    """Wait ``timeout_s``, or less if the last client process ends first (the run goes on at
    once, not at the next poll)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and any(c.alive() for c in clients):
        time.sleep(EXIT_CHECK_S)


def cpu_groups(world: World, edge: Edge, clients: list[ServiceProcess]) -> dict[str, list[int]]:
    """The pids of what runs an architecture's calls, by what they are: the impairment engine,
    the clients (a browser's helpers too), the edge's services by role (their workers too),
    and the runner with whatever else it started (the emulated hosts' shells, calibration's
    probes)."""
    roots = [("engine", getattr(world.backend, "engine_pid", None))]
    roots += [("clients", c.pid) for c in clients if c.alive()]
    roots += [(s.role, s.process.pid) for s in edge.services.values() if s.process.alive()]
    return process_groups(roots + [("runner", os.getpid())])


def steering_rows(arch: str, timeline: Path) -> list[dict]:
    """steering.csv rows of one architecture from its merged timeline (the fronts' logs)."""
    rows = []
    if not timeline.exists():
        return rows
    for line in timeline.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        source = str(r.get("source", ""))
        if not source.startswith("front-") or r.get("event") not in ("call_created",
                                                                      "steering_changed"):
            continue
        region = r.get("region") or source.removeprefix("front-")
        row = {"architecture": arch, "client_region": region, "front": source,
               "event": r["event"], "unix": _unix(r.get("ts"))}
        if r["event"] == "call_created":
            row.update(call=r.get("call"), cluster=r.get("cluster"), nearest=r.get("nearest"),
                       reason=r.get("reason"))
        else:
            row.update(cluster=r.get("to"), reason=r.get("why"))
        rows.append(row)
    return rows


def _unix(ts: str | None) -> float | None:
    """A log line's ``ts`` (ISO-8601 UTC) as Unix seconds."""
    if not ts:
        return None
    try:
        return round(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp(), 6)
    except ValueError:
        return None


def _cluster_of(url: str | None) -> str | None:
    """The cluster a call id names (/v1/calls/CLUSTER~BACKEND~SESSION)."""
    url = url or ""
    return url.rsplit("/", 1)[-1].split("~")[0] if "~" in url else None


def _session_id(url: str | None) -> str | None:
    """The transceiver's session id in a call URL (``CLUSTER~BACKEND~SESSION``, then the
    owner's tag when the front has API keys)."""
    parts = (url or "").rsplit("/", 1)[-1].split("~")
    return parts[2] if len(parts) >= 3 else None


@dataclass
class ServerSide:
    """What the transceivers logged per session id (their lines survive a crash): the
    client->server RTP arrival gaps (``rx_gap``, logged as each ends) and the moves of the
    session's media to a new client address (``session_moved``: [unix, previous, client])."""

    gaps: dict[str, list] = field(default_factory=dict)
    moves: dict[str, list] = field(default_factory=dict)

    @classmethod
    def read(cls, timeline: Path) -> "ServerSide":
        out = cls()
        if not timeline.exists():
            return out
        for line in timeline.read_text().splitlines():
            moved = '"session_moved"' in line
            if not moved and '"rx_gap"' not in line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if not (str(r.get("source", "")).startswith("transceiver-") and r.get("session")):
                continue
            session = str(r["session"])
            if moved:
                out.moves.setdefault(session, []).append(
                    [_unix(r.get("ts")), r.get("previous"), r.get("client")])
            else:
                out.gaps.setdefault(session, []).append((r.get("start_unix"), r.get("ms")))
        return out


def _note_late_clients(faults: list[FaultRecord], logs: Path) -> list[FaultRecord]:
    """Say on every fault when a client's first call came after the time it was given (its
    ``calls_late`` log event): its calls then ran that much behind the faults' clock."""
    late = []
    for path in logs.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if '"event": "calls_late"' in line:
                try:
                    late.append(float(json.loads(line)["late_s"]))
                except (ValueError, KeyError, TypeError):
                    continue
    if late:
        why = (f"a client's first call came {max(late):.2f} s after it was due: its calls ran "
               "that much behind the faults' clock")
        for r in faults:
            r.note = f"{r.note}; {why}" if r.note else why
    return faults


def _logged(path: Path, event: str) -> bool:
    """Whether a service's JSON log (services/logs.py: json.dumps' separators) has a line of
    ``event``."""
    return f'"event": "{event}"' in path.read_text(errors="replace")


class ResultCount:
    """Sessions done and failed so far in an architecture's results files (sessions-*.jsonl),
    polled while its clients run: each poll reads only what was appended since the last (the
    runner polls twice a second)."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._read: dict[Path, int] = {}
        self.done = self.failed = 0

    def poll(self) -> tuple[int, int]:
        for path in sorted(self._logs.glob("sessions-*.jsonl")):
            start = self._read.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(start)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1   # a line still being written waits for the next poll
            self._read[path] = start + end
            for line in chunk[:end].splitlines():
                try:
                    ok = json.loads(line).get("ok")
                except ValueError:
                    continue
                self.done += 1
                self.failed += not ok
        return self.done, self.failed


def _checks(names: list | None) -> str | None:
    """A session's checks (services/client/verify.py) as one sessions.csv cell."""
    return None if names is None else ",".join(names)


def write_architectures(directory: Path, scenario: Scenario) -> None:
    """``architectures.json``: what the analysis needs to know about each architecture of the
    run (docs/scenarios.md lists its fields); the analysis never imports the registry."""
    (directory / ARCHITECTURES_FILE).write_text(json.dumps({
        "baseline": scenario.baseline,
        "architectures": {name: scenario.architecture(name).facts()
                          for name in scenario.architectures}}, indent=2))


def write_results(result: RunResult) -> None:
    """Every file of the finished architectures, then the derived statistics."""
    from analysis.summary import finalize

    d = result.directory
    with open(d / "sessions.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SESSION_FIELDS, extrasaction="ignore")
        w.writeheader()
        for a in result.architectures:
            w.writerows(a.sessions)
    with open(d / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SAMPLE_FIELDS, extrasaction="ignore")
        w.writeheader()
        for a in result.architectures:
            w.writerows(a.samples)
    for name, fields, rows in (("steering.csv", STEERING_FIELDS, "steering"),
                               ("attempts.csv", ATTEMPT_FIELDS, "attempts"),
                               ("gaps.csv", GAP_FIELDS, "gaps")):
        with open(d / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            for a in result.architectures:
                w.writerows(getattr(a, rows))
    if result.scenario.faults:
        (d / "faults.json").write_text(json.dumps({"faults": [
            asdict(r) for a in result.architectures for r in a.faults]}, indent=2))
    with open(d / "ports.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PORT_FIELDS)
        for a in result.architectures:
            w.writerow([a.architecture, a.peak_sessions, a.public_udp_ports,
                        a.public_udp_ports_max, "; ".join(a.bindings)])
    turns = [t for a in result.architectures for t in a.turns]
    if turns:
        with open(d / "turns.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=TURN_FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(turns)
    (d / "relays.json").write_text(json.dumps(
        {a.architecture: a.relays for a in result.architectures}, indent=2))
    at_load = {a.architecture: a.load_calibration.to_dict()
               for a in result.architectures if a.load_calibration is not None}
    if at_load:
        (d / "calibration_at_load.json").write_text(json.dumps(at_load, indent=2))
    host_cpu = {a.architecture: a.host_cpu.to_dict()
                for a in result.architectures if a.host_cpu is not None}
    if host_cpu:
        (d / "host_cpu.json").write_text(json.dumps(host_cpu, indent=2))
    result.timings["architectures"] = {a.architecture: a.seconds for a in result.architectures}
    (d / "timings.json").write_text(json.dumps(result.timings, indent=2))
    result.summary = finalize(d)


def turn_rows(arch: str, regions, logs: Path, directory: Path) -> list[dict]:
    """turns.csv rows: every turn of the conversation sessions of ``regions`` (none without
    a conversation), of every client type, the reply's audio as a path under the results
    folder ``directory``."""
    rows = []
    for region in regions:
        for kind in REGISTRY.values():
            path, _ = kind.results_files(logs, region)
            if not path.exists():
                continue
            audio_dir = logs / kind.audio_dir(region)
            for line in path.read_text().splitlines():
                r = json.loads(line)
                for t in r.get("turns") or []:
                    audio = t.get("audio")
                    if audio:
                        audio = str((audio_dir / audio).relative_to(directory))
                    rows.append({"architecture": arch, "client_region": region,
                                 "session": r.get("index"), "client_type": kind.name, **t,
                                 "audio": audio})
    return rows


def client_rows(arch: str, region: str, logs: Path, lag: LagWindows, server: ServerSide,
                floors=None, on_path=None) -> tuple[list, list, list, list]:
    """(sessions, samples, attempts, gaps) rows of one client region's sessions (both client
    types) from ``logs`` and what the transceivers logged of them (``server``: up gaps,
    moves); ``floors(cluster)`` gives a session's network floor columns (none
    where no topology is configured: a deployment target); ``on_path(client, cluster)`` the
    log sources on a session's path (saturation.py's default when None)."""
    sessions, samples, attempts, gaps = [], [], [], []
    rows = []
    for suffix in results_suffixes():
        path = logs / f"sessions-{region}{suffix}.jsonl"
        if path.exists():
            rows += [json.loads(l) for l in path.read_text().splitlines()]
    for r in rows:
        first = (r.get("attempts") or [{}])[0]  # the session's figures are its first call's
        cluster = _cluster_of(first.get("location") or r.get("session_url"))
        row = {k: r.get(k) for k in SESSION_FIELDS if k in r}
        row.update(architecture=arch, client_region=region, cluster_region=cluster,
                   session=r.get("index"), loss_bursts=json.dumps(r.get("loss_bursts") or []),
                   client_type=r.get("client_type") or AIORTC,
                   verifies=_checks(r.get("verifies")), verified=_checks(r.get("verified")),
                   turn_transactions=json.dumps(r.get("turn_transactions") or []),
                   connected_unix=first.get("connected_unix"),
                   reconnections=r.get("reconnections", 0),
                   renominations=r.get("renominations", 0),
                   renominated=json.dumps(r.get("renominated") or []),
                   ice_restarts=json.dumps(r.get("ice_restarts") or []))
        row["moved"] = json.dumps([m for a in r.get("attempts") or []
                                   for m in server.moves.get(_session_id(a.get("location")), ())])
        if cluster and floors is not None:
            row.update(floors(cluster))
        setup = r.get("setup_ms")
        flag(row, lag, r.get("started_unix"), r.get("ended_unix"),
             None if setup is None else setup / 1000.0, path=on_path)
        sessions.append(row)
        key = {"architecture": arch, "client_region": region, "session": r.get("index")}
        for a in r.get("attempts") or []:
            attempts.append({**key, **{k: a.get(k) for k in ATTEMPT_FIELDS[3:]},
                             "cluster_region": a.get("cluster") or _cluster_of(
                                 a.get("location"))})
            for start, ms in server.gaps.get(_session_id(a.get("location")), ()):
                gaps.append({**key, "direction": "up", "start_unix": start, "ms": ms,
                             "attempt": a.get("attempt")})
        for start, ms, attempt in r.get("rx_gaps") or []:
            gaps.append({**key, "direction": "down", "start_unix": start, "ms": ms,
                         "attempt": attempt})
    for spath in (logs / f"samples-{region}{suffix}.jsonl" for suffix in results_suffixes()):
        if not spath.exists():
            continue
        for line in spath.read_text().splitlines():
            s = json.loads(line)
            samples.append({"architecture": arch, "client_region": region,
                            "session": s.get("session"), **{
                                k: s.get(k) for k in SAMPLE_FIELDS[3:]}})
    return sessions, samples, attempts, gaps
