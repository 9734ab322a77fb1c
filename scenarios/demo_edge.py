"""``voiceedge demo edge``: the whole edge on one host, with real clients through it.

Everything runs in a lab network namespace (topology/netns.py), started by the edge launcher
(scenarios/edge.py) like every other run: Redis, the cluster relay (its public address is the
answers' only candidate), one transceiver, the echo agent and signaling, as separate
processes; then N concurrent aiortc client sessions in this process, a few of them full
clients, the others light (docs/client.md). ``--mode port-per-session`` runs the baseline
instead: no relay, no Redis, a UDP port per session advertised directly.

CPU per session-second (transceiver, and this process, i.e. the clients): user + sys time
over a window, divided by the session-seconds of call in it. The window is the middle of the
calls when every session is in its call at once ("all sessions in call"); otherwise the whole
run of the clients ("whole run"), which also counts the sessions' setup and teardown.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from analysis.stats import percentile
from scenarios.edge import ClusterPlan, Edge, EdgePlan, FrontPlan, FrontRoute, Host
from scenarios.timeline import merge_timeline
from services.client.config import KINDS, ClientConfig
from services.client.credential import bearer, read_credential
from services.client.runner import run_sessions
from services.lag import LoopLagMonitor
from services.procfs import precise_cpu_seconds, processes
from services.logs import JsonFormatter
from services.eventloops import EVENT_LOOPS, UVLOOP
from services.mediapaths import MEDIA_PATHS, OPENSSL, PYTHON, SRTP_IMPLEMENTATIONS
from services.transceiver.ice import MODES, SHARED
from topology.netns import in_namespace, lab_namespace
from voiceedge.errors import UserError
from voiceedge.reaper import temp_dir


@dataclass(frozen=True)
class DemoConfig:
    sessions: int = 20
    mode: str = SHARED
    duration_s: float = 5.0
    start_rate: float = 20.0
    concurrency: int | None = None  # 1: sessions one at a time
    full_clients: int = 2           # sessions with the full client; the others are light
    workdir: Path | None = None
    media_path: str = PYTHON        # the transceiver's: python or native
    light_path: str = PYTHON        # the light clients': aiortc or the native pump
    srtp: str = OPENSSL             # the transceiver's native path's SRTP (mediapaths.py)
    agent_codec: str = "any"        # the frames the native path offers the agent
    event_loop: str = UVLOOP        # the transceiver's (services/eventloops.py)


@dataclass
class DemoResult:
    mode: str
    media_path: str
    light_path: str
    sessions: int
    ok: int
    failed: int
    failures: dict[str, int]
    setup_ms_p50: float | None
    setup_ms_p95: float | None
    first_ice_rtt_ms_p50: float | None
    first_ice_rtt_ms_p95: float | None
    signaling_ms_p50: float | None
    first_audio_ms_p50: float | None
    echo_verified: int
    datachannel_verified: int
    transceiver_udp_sockets: int | None
    public_udp_ports: int | None     # measured (/proc) at the peak of concurrent sessions
    transceiver_cpu_ms_per_session_second: float | None
    clients_cpu_ms_per_session_second: float | None
    cpu_window: str                  # "all sessions in call" or "whole run" (module docstring)
    clients: dict = field(default_factory=dict)  # per kind: sessions, ok, echo_verified
    # every service (its child processes included) over the same window: transceiver, relay,
    # front, agent, redis
    services_cpu_ms_per_session_second: dict = field(default_factory=dict)
    srtp: str | None = None          # the transceiver's native path's SRTP (None: python path)
    event_loop: str | None = None    # the transceiver's, as its /status says
    relay: dict = field(default_factory=dict)
    logs: str = ""


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read())


def _tree_cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (ns precision) of each named process and its live descendants (a relay's
    workers are its children); the tree from one pass over /proc."""
    parent = {pid: int(fields[1]) for pid, fields in processes()}
    out = {}
    for name, root in pids.items():
        total = 0.0
        for pid in parent:
            p = pid
            while p > 1 and p != root:
                p = parent.get(p, 0)
            if p == root:
                try:
                    total += precise_cpu_seconds(pid)
                except OSError:  # gone meanwhile
                    pass
        out[name] = total
    return out


@dataclass(frozen=True)
class CpuMark:
    """CPU seconds at one moment: every service by name, with its child processes, and
    ``clients``, this process alone (the services are its children, counted by name)."""

    at: float
    seconds: dict[str, float]

    @classmethod
    def take(cls, services: dict[str, int]) -> "CpuMark":
        seconds = _tree_cpu_seconds(services)
        seconds["clients"] = precise_cpu_seconds(os.getpid())
        return cls(time.monotonic(), seconds)


def cpu_ms_per_session_second(start: CpuMark, end: CpuMark,
                              session_seconds: float) -> dict[str, float]:
    """Each process's CPU ms per session-second of call between two marks ({} for none)."""
    if session_seconds <= 0:
        return {}
    return {name: round((end.seconds[name] - cpu) * 1000 / session_seconds, 2)
            for name, cpu in start.seconds.items() if name in end.seconds}


def demo_plan(mode: str, netns: str, public: str, internal: str,
              media_path: str = PYTHON, srtp: str = OPENSSL,
              agent_codec: str = "any", event_loop: str = UVLOOP) -> EdgePlan:
    """The demo's edge: one cluster and its front in one namespace."""
    host = Host("lab", netns)
    cluster = ClusterPlan("demo", 1, host, public=public, internal=internal)
    front = FrontPlan("demo", host, "127.0.0.1", (FrontRoute("demo", 0.0),))
    return EdgePlan("cluster-relay" if mode == SHARED else "port-per-session", (cluster,), (front,),
                    max_sessions=500,
                    transceiver_args=("--media-path", media_path, "--srtp", srtp,
                                      "--agent-codec", agent_codec,
                                      "--event-loop", event_loop))


def run_demo(config: DemoConfig, say=lambda msg: None, progress=None) -> DemoResult:
    """``progress(done, total)`` is called as sessions end."""
    if config.mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    if config.sessions < 1:
        raise ValueError("sessions must be at least 1")
    workdir = config.workdir or temp_dir("voiceedge-demo-")
    workdir.mkdir(parents=True, exist_ok=True)
    with lab_namespace("vedemo") as ns:
        plan = demo_plan(config.mode, ns.name, *ns.addresses, media_path=config.media_path,
                         srtp=config.srtp, agent_codec=config.agent_codec,
                         event_loop=config.event_loop)
        plan = dataclasses.replace(plan, api_keys=True)   # its front as deployed
        return in_namespace(ns.name, asyncio.run, _demo(config, plan, workdir, say, progress))


async def _demo(cfg: DemoConfig, plan: EdgePlan, workdir: Path, say, progress) -> DemoResult:
    loop = asyncio.get_running_loop()
    edge = Edge(plan, workdir)
    cluster, front = plan.clusters[0], plan.fronts[0]
    control = f"{edge.control_url(cluster)}/status"
    done = 0

    def ended(_result) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, cfg.sessions)

    try:
        say(f"starting services ({cfg.mode}) in {workdir}")
        await loop.run_in_executor(None, edge.start)
        say(f"{cfg.sessions} client sessions ({min(cfg.full_clients, cfg.sessions)} full), "
            f"{cfg.duration_s:g} s calls")
        token = edge.token_file("demo-clients")
        client = ClientConfig(url=edge.signaling_url(front), duration_s=cfg.duration_s,
                              start_rate=cfg.start_rate, concurrency=cfg.concurrency,
                              full_sessions=cfg.full_clients, light_path=cfg.light_path,
                              headers=bearer(read_credential(token)) if token else {})
        pids = {name.rsplit("-", 1)[0]: s.process.pid for name, s in edge.services.items()}
        first = CpuMark.take(pids)
        watch = asyncio.create_task(_watch_transceiver(
            control, edge, cfg, lambda: done, first.at + cfg.duration_s, pids))
        if cfg.concurrency is not None and cfg.concurrency < cfg.sessions:
            watch.cancel()  # sessions never all live at once: no steady window
        with clients_log(workdir) as log:
            async with LoopLagMonitor(log):  # the clients say when they measure themselves
                results = await run_sessions(client, cfg.sessions,
                                             results_path=workdir / "sessions.jsonl",
                                             samples_path=workdir / "samples.jsonl",
                                             on_result=ended)
        last = CpuMark.take(pids)
        try:
            status, steady, ports = await watch
        except asyncio.CancelledError:
            status, steady = await loop.run_in_executor(None, _get_json, control), None
            ports = None
        relay = {}
        if plan.relayed:
            relay = {k: v for k, v in (await loop.run_in_executor(
                None, edge.relay_counters)).get(f"relay-{cluster.name}", {}).items() if v}
    finally:
        await loop.run_in_executor(None, edge.stop)
        merge_timeline(workdir)

    ok = [r for r in results if r.ok]
    failures: dict[str, int] = {}
    for r in results:
        if not r.ok:
            failures[r.error or "unknown"] = failures.get(r.error or "unknown", 0) + 1

    def pct(name: str, q: float) -> float | None:
        value = percentile([getattr(r, name) for r in ok], q)
        return None if value is None else round(value, 1)

    if steady is not None:
        window = "all sessions in call"
        seconds = (steady[1].at - steady[0].at) * cfg.sessions
        cpu = cpu_ms_per_session_second(*steady, seconds)
    else:
        window = "whole run"
        seconds = sum((r.call_ms or 0) for r in results) / 1000
        cpu = cpu_ms_per_session_second(first, last, seconds)
    clients_cpu = cpu.pop("clients", None)
    clients = {kind: {"sessions": sum(1 for r in results if r.client == kind),
                      "native": sum(1 for r in results if r.client == kind
                                    and r.media_path == "native"),
                      "ok": sum(1 for r in ok if r.client == kind),
                      "echo_verified": sum(1 for r in ok if r.client == kind and r.echo_verified)}
               for kind in KINDS}

    return DemoResult(
        mode=cfg.mode, media_path=cfg.media_path, light_path=cfg.light_path,
        srtp=cfg.srtp if cfg.media_path != PYTHON else None,
        event_loop=status.get("event_loop") if status else None,
        sessions=cfg.sessions, ok=len(ok),
        failed=len(results) - len(ok),
        failures=failures,
        setup_ms_p50=pct("setup_ms", 50), setup_ms_p95=pct("setup_ms", 95),
        first_ice_rtt_ms_p50=pct("first_ice_rtt_ms", 50),
        first_ice_rtt_ms_p95=pct("first_ice_rtt_ms", 95),
        signaling_ms_p50=pct("signaling_ms", 50), first_audio_ms_p50=pct("first_audio_ms", 50),
        echo_verified=sum(1 for r in ok if r.echo_verified),
        datachannel_verified=sum(1 for r in ok if r.datachannel_verified),
        transceiver_udp_sockets=status.get("udp_sockets") if status else None,
        public_udp_ports=ports, transceiver_cpu_ms_per_session_second=cpu.get("transceiver"),
        clients_cpu_ms_per_session_second=clients_cpu, cpu_window=window, clients=clients,
        services_cpu_ms_per_session_second=cpu,
        relay=relay, logs=str(workdir))


@contextlib.contextmanager
def clients_log(workdir: Path):
    """A logger writing the clients' JSON lines (service "clients") to clients-demo.log."""
    log = logging.getLogger("voiceedge.demo.clients")
    handler = logging.FileHandler(workdir / "clients-demo.log")
    handler.setFormatter(JsonFormatter("clients"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield log
    finally:
        log.removeHandler(handler)
        handler.close()


async def _watch_transceiver(url: str, edge: Edge, cfg: DemoConfig, ended,
                             first_call_end: float, services: dict[str, int]
                             ) -> tuple[dict, tuple[CpuMark, CpuMark] | None, int | None]:
    """Wait until every session is live, then read the socket counts and take CPU marks
    around the middle of the calls, ending before ``first_call_end`` (monotonic; no call ends
    earlier): (status, marks or None, ports). No marks when that leaves less than a second, a
    session ends (``ended()`` > 0) before the last one is connected, or one ends in the window."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + cfg.sessions / cfg.start_rate + 15
    status: dict = {}
    while time.monotonic() < deadline and not ended():
        status = await loop.run_in_executor(None, _get_json, url)
        connected = sum(1 for s in status["session_details"] if s["state"] == "connected")
        if connected >= cfg.sessions:
            break
        await asyncio.sleep(0.1)
    else:
        return status, None, None
    ports = await loop.run_in_executor(None, edge.public_udp_ports)
    window = min(cfg.duration_s - 2.0, first_call_end - 1.0 - time.monotonic())
    if window < 1.0:
        return status, None, ports
    start = CpuMark.take(services)
    await asyncio.sleep(window)
    end = CpuMark.take(services)
    status = await loop.run_in_executor(None, _get_json, url)
    if status["sessions"] < cfg.sessions or ended():
        return status, None, ports
    return status, (start, end), ports


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="one-host demonstrations")
    demo_sub = p.add_subparsers(dest="demo", metavar="DEMO", required=True)
    e = demo_sub.add_parser("edge", help="the edge on one host with N client sessions",
                            description=__doc__.split("\n\n")[0])
    d = DemoConfig()
    e.add_argument("--sessions", type=int, default=d.sessions, help=f"(default {d.sessions})")
    e.add_argument("--mode", choices=MODES, default=d.mode,
                   help="shared: relay + one socket; port-per-session: the baseline")
    e.add_argument("--duration", type=float, default=d.duration_s, help="call seconds")
    e.add_argument("--rate", type=float, default=d.start_rate, help="sessions started per second")
    e.add_argument("--concurrency", type=int, metavar="N",
                   help="at most N sessions at once (1: one at a time; default: all)")
    e.add_argument("--full-clients", type=int, default=d.full_clients, metavar="N",
                   help="sessions with the full client (decodes, checks the echo's level); "
                        f"the others are light (default {d.full_clients})")
    e.add_argument("--media-path", choices=MEDIA_PATHS, default=d.media_path,
                   help="the transceiver's media path (shared mode): python, the reference, "
                        "or native, the C media plane (default python)")
    e.add_argument("--light-path", choices=MEDIA_PATHS, default=d.light_path,
                   help="the light clients' media path: python (aiortc) or native (one pump "
                        "for all of them; default python)")
    e.add_argument("--srtp", choices=SRTP_IMPLEMENTATIONS, default=d.srtp,
                   help="the transceiver's SRTP on the native path: openssl (its own AES-GCM; "
                        "default) or libsrtp (the reference)")
    e.add_argument("--event-loop", choices=EVENT_LOOPS, default=d.event_loop,
                   help="the transceiver's event loop: uvloop (default) or asyncio (the "
                        "reference)")
    e.add_argument("--agent-codec", choices=("opus", "pcm16", "any"), default=d.agent_codec,
                   help="the frames the native path offers the agent: opus, pcm16 (the plane "
                        "decodes and encodes), or any (the agent chooses: the echo agent takes "
                        "opus; default)")
    e.add_argument("--workdir", type=Path, help="where logs and JSON lines go (default: a temp dir)")
    e.add_argument("--json", action="store_true", help="print only JSON")
    e.set_defaults(func=_main)


def _main(args) -> int:
    if args.sessions < 1 or args.duration <= 0 or args.rate <= 0 or (
            args.concurrency is not None and args.concurrency < 1):
        raise UserError("--sessions, --duration, --rate and --concurrency must be positive")
    if args.full_clients < 0:
        raise UserError("--full-clients must be at least 0")
    from rich.console import Console

    from scenarios.processes import ServiceError
    from scenarios.progress import ProgressBars
    from topology.netns import NetnsError

    cfg = DemoConfig(sessions=args.sessions, mode=args.mode, duration_s=args.duration,
                     start_rate=args.rate, concurrency=args.concurrency,
                     full_clients=args.full_clients, workdir=args.workdir,
                     media_path=args.media_path, light_path=args.light_path, srtp=args.srtp,
                     agent_codec=args.agent_codec, event_loop=args.event_loop)
    bars = ProgressBars(Console(stderr=True), enabled=not args.json)
    with bars:
        try:
            result = run_demo(cfg, lambda msg: bars.print(f"[dim]… {msg}[/dim]"),
                              lambda done, total: bars.update("sessions", done, total))
        except (ServiceError, NetnsError, ValueError) as exc:  # no root, a busy port, ...
            raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        _print(result)
    return 0 if result.failed == 0 else 1


def _print(r: DemoResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"demo edge: {r.sessions} sessions, {r.mode}", show_header=False)
    table.add_column(justify="left")
    table.add_column(justify="right")
    fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    rows = [
        ("sessions ok / failed", f"{r.ok} / {r.failed}"),
        ("setup_ms p50 / p95", f"{fmt(r.setup_ms_p50)} / {fmt(r.setup_ms_p95)}"),
        ("first_ice_rtt_ms p50 / p95",
         f"{fmt(r.first_ice_rtt_ms_p50)} / {fmt(r.first_ice_rtt_ms_p95)}"),
        ("signaling_ms p50", fmt(r.signaling_ms_p50)),
        ("first_audio_ms p50", fmt(r.first_audio_ms_p50)),
        ("audio echo verified", f"{r.echo_verified} / {r.ok}"),
        *((f"  {kind} clients: echo verified / ok / sessions",
           f"{c['echo_verified']} / {c['ok']} / {c['sessions']}") for kind, c in r.clients.items()),
        ("data-channel echo verified", f"{r.datachannel_verified} / {r.ok}"),
        ("UDP sockets held by the transceiver", fmt(r.transceiver_udp_sockets)),
        ("public UDP ports (measured, all sessions live)", fmt(r.public_udp_ports)),
        (f"transceiver CPU ms per session-second ({r.cpu_window})",
         fmt(r.transceiver_cpu_ms_per_session_second)),
        (f"clients' CPU ms per session-second ({r.cpu_window})",
         fmt(r.clients_cpu_ms_per_session_second)),
    ]
    if r.relay:
        rows.append(("relay flows / datagrams forwarded",
                     f"{r.relay.get('flows_created', 0)} / "
                     f"{r.relay.get('packets_to_server', 0) + r.relay.get('packets_to_client', 0)}"))
    for name, count in r.failures.items():
        rows.append((f"failed: {name}", str(count)))
    rows.append(("logs and JSON lines", r.logs))
    for row in rows:
        table.add_row(*row)
    Console(width=max(Console().width, 100)).print(table)
