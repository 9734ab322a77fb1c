"""The scenario runner: build the world, calibrate, run every architecture, write the results.

For each architecture, in the same world and with the same clients:

- ``port-per-session``: the transceiver binds a UDP port per session on its cluster host's
  public address and advertises it; clients cross the public internet to it.
- ``cluster-relay``: one public port at the cluster's relay; clients cross the public internet
  to it, the relay hands datagrams to the transceiver's shared socket.
- ``global-relay``: the answer advertises the anycast relay VIP, so clients reach the ingress
  relay of their own region, which carries the media over the backbone to the cluster relay.

The regional signaling front (anycast, in every client region) sends each call to the nearest
cluster with room, over the backbone. Results go to ``results/<scenario>-<region>-<time>/``
(docs/scenarios.md lists the files).
"""
from __future__ import annotations

import csv
import json
import statistics
import subprocess
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scenarios.processes import ServiceError, ServiceProcess, http_ok, redis_cmd, tcp_open, voiceedge_cmd
from scenarios.spec import BASELINE, Scenario
from services.relay.counters import scrape
from topology.calibrate import CalibrationReport, calibrate
from topology.netns import in_namespace
from topology.plan import world_spec
from topology.regions import RegionsCatalog
from topology.world import RELAY_VIP, SIGNALING_VIP, World

RELAY_PORT, INTERNAL_PORT, MEDIA_PORT = 3478, 3479, 3480
CONTROL_PORT, AGENT_PORT, REDIS_PORT, METRICS_PORT, SIGNALING_PORT = 8900, 8800, 6379, 9478, 8080
SESSION_FIELDS = (
    "architecture", "client_region", "cluster_region", "session", "ok", "error", "stage",
    "signaling_ms", "offer_ms", "first_ice_rtt_ms", "ice_connected_ms", "setup_ms",
    "first_audio_ms", "rtt_ms", "jitter_ms", "loss_pct", "packets_received", "packets_lost",
    "loss_bursts", "echo_verified", "datachannel_verified", "floor_signaling_rtt_ms",
    "floor_media_rtt_ms", "floor_setup_ms")
SAMPLE_FIELDS = ("architecture", "client_region", "session", "t_ms", "packets_received",
                 "packets_lost", "jitter_ms", "rtt_ms")


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
    public_udp_ports: int
    seconds: float


@dataclass
class RunResult:
    directory: Path
    scenario: Scenario
    client_regions: list[str]
    clusters: list[str]
    backend: str
    calibration: CalibrationReport
    architectures: list[ArchitectureRun] = field(default_factory=list)
    timings: dict = field(default_factory=dict)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read())


class ScenarioRunner:
    """One run of a scenario for the clients of one region spec."""

    def __init__(self, scenario: Scenario, region: str, results_root: Path = Path("results"),
                 backend: str | None = None, say=lambda msg: None) -> None:
        self.scenario = scenario
        self.say = say
        catalog = RegionsCatalog.load()
        if scenario.profiles:
            catalog = catalog.with_overrides(scenario.profiles)
        self.catalog = catalog
        self.client_regions = [r.name for r in catalog.resolve(region)]
        self.clusters = [r.name for r in catalog.resolve(",".join(scenario.clusters))]
        regions = list(dict.fromkeys(self.client_regions + self.clusters))
        self.spec = world_spec(catalog, regions, self.clusters, scenario.last_mile)
        self.backend_name = backend
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.directory = results_root / f"{scenario.name}-{region.replace(',', '+')}-{stamp}"

    # ------------------------------------------------------------ the run

    def run(self) -> RunResult:
        from topology.impairment.backend import make_backend

        self.directory.mkdir(parents=True, exist_ok=False)
        (self.directory / "logs").mkdir()
        started = time.monotonic()
        backend = make_backend(self.backend_name)
        self.say(f"world: {', '.join(self.spec.regions)} (clusters {', '.join(self.clusters)});"
                 f" impairment backend: {backend.name}")
        world = World(self.spec, backend)
        with world:
            self.say(f"world built in {world.build_seconds:.1f} s; calibrating "
                     f"{len(world.links) + 1} paths")
            report = calibrate(world, count=self.scenario.calibration_count,
                               rate=self.scenario.calibration_rate)
            (self.directory / "calibration.json").write_text(
                json.dumps(report.to_dict(), indent=2))
            result = RunResult(self.directory, self.scenario, self.client_regions,
                               self.clusters, backend.name, report)
            self._write_config(result)
            if not report.ok:
                raise CalibrationFailed(report)
            self.say(f"calibration passed ({len(report.paths)} paths)")
            for arch in self.scenario.architectures:
                result.architectures.append(self._run_architecture(world, arch))
            result.timings["engine"] = {k: v for k, v in backend.stats().items()
                                        if not isinstance(v, (dict, list))}
        result.timings.update(build_s=round(world.build_seconds, 2),
                              teardown_s=round(world.teardown_seconds, 2),
                              total_s=round(time.monotonic() - started, 1))
        self._write_results(result)
        return result

    def _write_config(self, result: RunResult) -> None:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, cwd=Path(__file__).parent).stdout.strip()
        except OSError:
            commit = ""
        impairments = {f"{k[0]} {k[1]}->{k[2]}": asdict(v) for k, v in self.spec.impairments.items()}
        (self.directory / "config.json").write_text(json.dumps({
            "scenario": asdict(self.scenario), "client_regions": self.client_regions,
            "clusters": self.clusters, "world_regions": list(self.spec.regions),
            "backend": result.backend, "commit": commit, "impairments": impairments,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2, default=str))

    # ------------------------------------------------------------ one architecture

    def _run_architecture(self, world: World, arch: str) -> ArchitectureRun:
        sc = self.scenario
        logs = self.directory / "logs" / arch
        logs.mkdir(parents=True)
        services: list[tuple[ServiceProcess, str]] = []
        started = time.monotonic()
        self.say(f"[{arch}] starting services")
        try:
            self._start_services(world, arch, logs, services)
            clients = []
            for region in self.client_regions:
                host = f"client{world.index[region]}"
                proc = ServiceProcess(f"client-{region}", voiceedge_cmd(
                    "client", "--url", f"http://{SIGNALING_VIP}:{SIGNALING_PORT}/v1/calls",
                    "-n", str(sc.sessions_per_region), "--rate", str(sc.start_rate),
                    "--duration", str(sc.call_duration_s), "--results",
                    str(logs / f"sessions-{region}.jsonl"), "--samples",
                    str(logs / f"samples-{region}.jsonl"), "-q"),
                    logs / f"client-{region}.log", netns=world.node(host).ns_path).start()
                clients.append(proc)
                services.append((proc, host))  # stopped with the services, also on Ctrl-C
            watcher = _TransceiverWatch(world, self.clusters, arch)
            watcher.start()
            total = sc.sessions_per_region * len(self.client_regions)
            deadline = time.monotonic() + total / sc.start_rate + sc.call_duration_s + 90
            while any(c.alive() for c in clients):
                if time.monotonic() > deadline:
                    raise ServiceError(f"[{arch}] clients did not finish in time")
                done, failed = _count_results(logs)
                self.say(f"[{arch}] sessions {done}/{total} done, {failed} failed, "
                         f"{time.monotonic() - started:.0f} s", transient=True)
                time.sleep(1.0)
            watcher.stop()
            relays = self._relay_counters(world, arch, services)
        finally:
            for proc, _ in reversed(services):
                proc.stop()
        sessions, samples = self._collect(world, arch, logs)
        ok = sum(1 for s in sessions if s["ok"])
        self.say(f"[{arch}] {ok}/{len(sessions)} sessions ok in {time.monotonic() - started:.0f} s")
        ports = watcher.peak_udp_sockets if arch == BASELINE else (
            len(self.clusters) if arch == "cluster-relay" else len(self.client_regions))
        return ArchitectureRun(arch, sessions, samples, relays, watcher.peak_sessions, ports,
                               round(time.monotonic() - started, 1))

    def _start_services(self, world: World, arch: str, logs: Path,
                        services: list[tuple[ServiceProcess, str]]) -> None:
        def start(name: str, host: str, cmd: list[str], ready) -> None:
            ns = world.node(host).ns_path
            proc = ServiceProcess(name, cmd, logs / f"{name}.log", netns=ns).start()
            services.append((proc, host))
            in_namespace(ns, proc.wait_ready, ready)

        relayed = arch != BASELINE
        for cluster in self.clusters:
            i = world.index[cluster]
            host, pub, bb = f"cluster{i}", world.lan(i, 4, 2), world.lan(i, 5, 2)
            start(f"agent-{cluster}", host, voiceedge_cmd(
                "agent", "--listen", "127.0.0.1", "--port", str(AGENT_PORT)),
                lambda: tcp_open("127.0.0.1", AGENT_PORT))
            transceiver = ["transceiver", "--cluster", str(i), "--id", "1", "--control",
                           f"{bb}:{CONTROL_PORT}", "--agent", f"ws://127.0.0.1:{AGENT_PORT}",
                           "--max-sessions", "500"]
            if relayed:
                routes = logs / f"routes-{cluster}.toml"
                routes.write_text(f'cluster_id = {i}\n[routes]\n1 = "{bb}:{MEDIA_PORT}"\n')
                start(f"redis-{cluster}", host, redis_cmd("127.0.0.1", REDIS_PORT, logs),
                      lambda: tcp_open("127.0.0.1", REDIS_PORT))
                start(f"relay-{cluster}", host, voiceedge_cmd(
                    "relay", "--tier", "cluster", "--routes", str(routes), "--listen", pub,
                    "--port", str(RELAY_PORT), "--internal", f"{bb}:{INTERNAL_PORT}",
                    "--hop-bind", bb, "--redis", f"redis://127.0.0.1:{REDIS_PORT}/0",
                    "--relay-id", f"cluster-{cluster}", "--metrics", f"127.0.0.1:{METRICS_PORT}",
                    "--cpus", "none"), lambda: http_ok(f"http://127.0.0.1:{METRICS_PORT}/metrics"))
                transceiver += ["--media", f"{bb}:{MEDIA_PORT}"]
            else:
                transceiver += ["--mode", "port-per-session", "--media", f"{pub}:0"]
            start(f"transceiver-{cluster}", host, voiceedge_cmd(*transceiver),
                  lambda: http_ok(f"http://{bb}:{CONTROL_PORT}/status"))
        for region in self.client_regions:
            i = world.index[region]
            host = f"edge{i}"
            if arch == "global-relay":
                routes = logs / f"routes-ingress-{region}.toml"
                routes.write_text("[routes]\n" + "".join(
                    f'{world.index[c]} = "{world.lan(world.index[c], 5, 2)}:{INTERNAL_PORT}"\n'
                    for c in self.clusters))
                start(f"ingress-{region}", host, voiceedge_cmd(
                    "relay", "--tier", "ingress", "--routes", str(routes), "--listen", RELAY_VIP,
                    "--port", str(RELAY_PORT), "--hop-bind", world.lan(i, 3, 2), "--relay-id",
                    f"ingress-{region}", "--metrics", f"127.0.0.1:{METRICS_PORT}", "--cpus",
                    "none"), lambda: http_ok(f"http://127.0.0.1:{METRICS_PORT}/metrics"))
            clusters = []
            for cluster in self.clusters:
                j = world.index[cluster]
                advertise = {"global-relay": f"{RELAY_VIP}:{RELAY_PORT}",
                             "cluster-relay": f"{world.lan(j, 4, 2)}:{RELAY_PORT}"}.get(arch)
                rtt = 0.0 if cluster == region else self.catalog.backbone_rtt_ms(region, cluster)
                clusters.append({"name": cluster, "advertise": advertise, "rtt_ms": rtt,
                                 "transceivers": [f"http://{world.lan(j, 5, 2)}:{CONTROL_PORT}"]})
            front = logs / f"front-{region}.json"
            front.write_text(json.dumps(clusters, indent=2))
            start(f"front-{region}", host, voiceedge_cmd(
                "signaling", "--listen", f"{SIGNALING_VIP}:{SIGNALING_PORT}", "--clusters",
                str(front)), lambda: http_ok(f"http://{SIGNALING_VIP}:{SIGNALING_PORT}/healthz"))

    def _relay_counters(self, world: World, arch: str, services) -> dict[str, dict]:
        out = {}
        time.sleep(0.6)  # relays publish their counters twice a second
        for proc, host in services:
            if proc.name.startswith(("relay-", "ingress-")):
                out[proc.name] = in_namespace(world.node(host).ns_path, scrape,
                                              f"http://127.0.0.1:{METRICS_PORT}/metrics")
        return out

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
        signaling = last_mile + backbone
        media = last_mile + (backbone if arch == "global-relay" else public)
        # Setup cannot beat the offer/answer round trip plus two media round trips: the
        # client's nominating check (one RTT) overlaps the first DTLS flight, because the
        # answerer is the DTLS client and starts as soon as it is nominated, half an RTT before
        # the client sees its check answered; the DTLS handshake then needs one more RTT.
        # (DESIGN.md's "signaling + ICE + 2 DTLS RTTs" counts that overlap twice: measured
        # setups here beat it.)
        return {"floor_signaling_rtt_ms": round(signaling, 2),
                "floor_media_rtt_ms": round(media, 2),
                "floor_setup_ms": round(signaling + 2 * media, 2)}

    def _collect(self, world: World, arch: str, logs: Path) -> tuple[list[dict], list[dict]]:
        sessions, samples = [], []
        for region in self.client_regions:
            path = logs / f"sessions-{region}.jsonl"
            rows = [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []
            for r in rows:
                url = r.get("session_url") or ""
                cluster = url.rsplit("/", 1)[-1].split("~")[0] if "~" in url else None
                row = {k: r.get(k) for k in SESSION_FIELDS if k in r}
                row.update(architecture=arch, client_region=region, cluster_region=cluster,
                           session=r.get("index"), loss_bursts=json.dumps(r.get("loss_bursts") or []))
                if cluster:
                    row.update(self.floors(region, cluster, arch))
                sessions.append(row)
            spath = logs / f"samples-{region}.jsonl"
            if spath.exists():
                for line in spath.read_text().splitlines():
                    s = json.loads(line)
                    samples.append({"architecture": arch, "client_region": region,
                                    "session": s.get("session"), **{
                                        k: s.get(k) for k in SAMPLE_FIELDS[3:]}})
        return sessions, samples

    def _write_results(self, result: RunResult) -> None:
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
        with open(d / "ports.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["architecture", "concurrent_sessions", "public_udp_ports"])
            for a in result.architectures:
                w.writerow([a.architecture, a.peak_sessions, a.public_udp_ports])
        (d / "relays.json").write_text(json.dumps(
            {a.architecture: a.relays for a in result.architectures}, indent=2))
        summary = summarise(result)
        (d / "summary.json").write_text(json.dumps(summary, indent=2))


class _TransceiverWatch:
    """Polls the clusters' transceivers during a run: peak sessions and UDP sockets."""

    def __init__(self, world: World, clusters: list[str], arch: str) -> None:
        self._targets = [(world.node(f"cluster{world.index[c]}").ns_path,
                          f"http://{world.lan(world.index[c], 5, 2)}:{CONTROL_PORT}/status")
                         for c in clusters]
        self.peak_sessions = 0
        self.peak_udp_sockets = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for ns, url in self._targets:
            t = threading.Thread(target=in_namespace, args=(ns, self._poll, url), daemon=True)
            t.start()
            self._threads.append(t)

    def _poll(self, url: str) -> None:
        peak_s = peak_u = 0
        while not self._stop.wait(0.5):
            try:
                status = _get_json(url)
            except OSError:
                continue
            peak_s, peak_u = max(peak_s, status["sessions"]), max(peak_u, status["udp_sockets"])
        with self._lock:
            self.peak_sessions += peak_s
            self.peak_udp_sockets += peak_u

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)


def _count_results(logs: Path) -> tuple[int, int]:
    done = failed = 0
    for path in logs.glob("sessions-*.jsonl"):
        for line in path.read_text().splitlines():
            done += 1
            failed += not json.loads(line).get("ok")
    return done, failed


def _pct(values: list[float], q: int) -> float | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 2)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 2)


METRICS = ("setup_ms", "first_ice_rtt_ms", "signaling_ms", "first_audio_ms", "rtt_ms",
           "jitter_ms", "loss_pct")


def summarise(result: RunResult) -> dict:
    """Per architecture: count, success, p50/p95 of each metric, overhead above the floor,
    and the difference from the baseline's p50."""
    out: dict = {"directory": str(result.directory), "backend": result.backend,
                 "client_regions": result.client_regions, "clusters": result.clusters,
                 "calibration_ok": result.calibration.ok, "timings": result.timings,
                 "architectures": {}}
    for a in result.architectures:
        ok = [s for s in a.sessions if s["ok"]]
        entry = {"sessions": len(a.sessions), "ok": len(ok),
                 "success_pct": round(100 * len(ok) / len(a.sessions), 1) if a.sessions else 0,
                 "public_udp_ports": a.public_udp_ports, "peak_sessions": a.peak_sessions,
                 "seconds": a.seconds}
        for m in METRICS:
            vals = [s.get(m) for s in ok]
            entry[m] = {"p50": _pct(vals, 50), "p95": _pct(vals, 95)}
        overhead = [s["setup_ms"] - s["floor_setup_ms"] for s in ok
                    if s.get("setup_ms") is not None and s.get("floor_setup_ms") is not None]
        ice_excess = [s["first_ice_rtt_ms"] - s["floor_media_rtt_ms"] for s in ok
                      if s.get("first_ice_rtt_ms") is not None and s.get("floor_media_rtt_ms")
                      is not None]
        entry["setup_over_floor_ms"] = {"p50": _pct(overhead, 50), "p95": _pct(overhead, 95)}
        entry["first_ice_rtt_over_floor_ms"] = {"p50": _pct(ice_excess, 50),
                                                "p95": _pct(ice_excess, 95)}
        entry["floor_setup_ms_p50"] = _pct([s.get("floor_setup_ms") for s in ok], 50)
        out["architectures"][a.architecture] = entry
    base = out["architectures"].get(BASELINE)
    if base:
        for name, entry in out["architectures"].items():
            entry["vs_baseline_p50"] = {
                m: (round(entry[m]["p50"] - base[m]["p50"], 2)
                    if entry[m]["p50"] is not None and base[m]["p50"] is not None else None)
                for m in METRICS}
    return out
