"""``voiceedge bench hostile`` (fuzzing): hostile datagrams against a live edge, with calls on it.

Each column is a fresh one-host edge (scenarios/demo_edge.py's plan in a lab namespace: Redis,
the cluster relay, a transceiver, the agent, signaling): ``before`` runs the relay with
``--no-pending-flows`` (a routable first packet opens an established flow), ``after`` the
relay as it ships. Both get the same cases (bench/hostile/cases.py, one seed). Per column:

1. a few real calls (services/client) connect; the first call's server ufrag is read from the
   transceiver's status (the same ufrag its SDP answer carried) for the replay cases;
2. a quiet window: the calls alone, CPU and relay counters marked at both ends;
3. the attack, as long as the quiet window: a sender process (in the namespace) sends the
   cases at ``rate`` from many sockets, kind i from 127.(100+i).x.y, to the relay's public
   port, and counts whatever comes back to them;
4. tcpdump on the namespace's ``lo`` (topology/capture.py) keeps every datagram from the
   relay to the transceiver (each carries a hop header naming the client, so the kind) and
   anything sent to the attack ranges.

Reported per column: cases sent by kind; datagrams and bytes that came back (sender sockets
and wire); datagrams forwarded past the relay by kind, STUN and not; the relay's counters over
the attack; crashes (a service gone, ``worker_crashed`` or a traceback in a service log); the
relay's and the transceiver's CPU per 1,000 hostile datagrams (attack minus quiet, scaled to
the attack's length); the live calls' loss, RTT and media gaps quiet vs attack. ``violations``
lists every broken rule: anything came back, more bytes back than sent for a kind, non-STUN
forwarded from an attack address under the hardened relay, a crash, a live call that failed.
"""
from __future__ import annotations

import asyncio
import json
import pickle
import resource
import select
import socket
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench.capacity import lag_of
from bench.hostile.cases import KINDS, CaseStream, build_templates, generator_rate
from analysis.pcap.reader import read_udp
from topology.capture import Capture
from services.wire import hop as hopwire
from services.wire.stun import HEADER_LENGTH, MAGIC_COOKIE
from voiceedge import reaper
from voiceedge.reaper import temp_dir

BEFORE, AFTER = "before", "after"
COLUMN_ARGS = {BEFORE: ("--no-pending-flows",), AFTER: ()}
ATTACK_NET = "127.96.0.0/11"   # covers 127.100.x.y .. 127.(100+len(KINDS)-1).x.y
FIRST_OCTET = 100
REPO = Path(__file__).resolve().parents[2]
CPU_SERVICES = ("relay", "transceiver")


@dataclass(frozen=True)
class FuzzConfig:
    """The full benchmark by default; ``quick()`` is the seconds-long subset of make test."""

    cases: int = 1_000_000           # per column (the same cases in each)
    rate: float = 10_000.0           # hostile datagrams per second
    addresses_per_kind: int = 16     # over 4 /24s of the kind's range
    ports_per_address: int = 8
    many_ports: int = 512            # forged_many_ports: one address, this many ports
    templates_per_kind: int = 256
    live_calls: int = 4
    full_clients: int = 1
    settle_s: float = 2.0            # after the calls connect, before the quiet window
    columns: tuple[str, ...] = (BEFORE, AFTER)
    seed: int = 1
    grace_s: float = 1.0             # after the last case: late datagrams still count (>= 0.6:
                                     # the relay publishes its counters every 0.5 s)
    workdir: Path | None = None

    @classmethod
    def quick(cls) -> "FuzzConfig":
        return cls(cases=16_000, rate=8_000.0, addresses_per_kind=4, ports_per_address=4,
                   many_ports=128, templates_per_kind=24, live_calls=1, settle_s=0.5,
                   columns=(AFTER,), grace_s=0.7)

    @property
    def attack_s(self) -> float:
        return self.cases / self.rate

    def __post_init__(self) -> None:
        if self.cases < 1 or self.rate <= 0 or self.live_calls < 1:
            raise ValueError("cases, rate and live_calls must be positive")
        if not 1 <= self.addresses_per_kind <= 4 * 250 or self.ports_per_address < 1:
            raise ValueError("addresses_per_kind must be 1..1000, ports_per_address positive")
        if any(c not in COLUMN_ARGS for c in self.columns):
            raise ValueError(f"columns are {', '.join(COLUMN_ARGS)}")


# ---------------------------------------------------------------- where cases come from

def kind_of_address(ip: bytes) -> int | None:
    """The kind index of an attack source address (4 bytes), None for any other address."""
    if ip[0] == 127 and FIRST_OCTET <= ip[1] < FIRST_OCTET + len(KINDS):
        return ip[1] - FIRST_OCTET
    return None


def sources(config: FuzzConfig) -> dict[str, list[tuple[str, int]]]:
    """Kind -> its source addresses, each with how many sockets (ports) send from it."""
    out = {}
    for k, kind in enumerate(KINDS):
        base = f"127.{FIRST_OCTET + k}"
        if kind == "forged_many_ports":
            out[kind] = [(f"{base}.0.1", config.many_ports)]
        else:
            out[kind] = [(f"{base}.{j % 4}.{j // 4 + 1}", config.ports_per_address)
                         for j in range(config.addresses_per_kind)]
    return out


# ---------------------------------------------------------------- the sender process

def sender_main() -> None:
    """Entry point of the sender process (started inside the lab namespace).

    Reads its spec (one JSON line) on stdin, opens its sockets, prints ``{"ready": n}``, waits
    for one JSON line (``{"live_ufrag": ...}``), sends, prints ``{"progress": n}`` now and
    then and ``{"sent": ...}`` after the last case, keeps counting what comes back for
    ``grace_s``, and prints ``{"result": ...}``."""
    spec = json.loads(sys.stdin.readline())
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with open(spec["templates"], "rb") as f:
        templates = pickle.load(f)
    socks: list[list[socket.socket]] = []
    kind_of_fd: dict[int, int] = {}
    sock_of_fd: dict[int, socket.socket] = {}
    ep = select.epoll()
    for k, kind in enumerate(KINDS):
        row = []
        for ip, ports in spec["sources"][kind]:
            for _ in range(ports):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                s.bind((ip, 0))
                row.append(s)
                kind_of_fd[s.fileno()], sock_of_fd[s.fileno()] = k, s
                ep.register(s.fileno(), select.EPOLLIN)
        socks.append(row)
    _emit({"ready": sum(len(r) for r in socks)})
    go = json.loads(sys.stdin.readline())
    live = go.get("live_ufrag")
    stream = CaseStream(templates, spec["seed"], {k: len(socks[i]) for i, k in enumerate(KINDS)},
                        live_ufrag=live.encode() if live else None)
    n_kinds = len(KINDS)
    sent, sent_bytes = [0] * n_kinds, [0] * n_kinds
    errors: dict[str, int] = {}
    back, back_bytes = [0] * n_kinds, [0] * n_kinds
    turn = [0] * n_kinds  # case k of a kind goes out of socket k mod its sockets
    target = tuple(spec["target"])
    total, rate = spec["cases"], spec["rate"]

    def drain(timeout: float) -> None:
        for fd, _ in ep.poll(timeout):
            k, sock = kind_of_fd[fd], sock_of_fd[fd]
            while True:
                try:
                    data = sock.recv(65536, socket.MSG_DONTWAIT)
                except OSError:  # nothing more (or a queued ICMP error)
                    break
                back[k] += 1
                back_bytes[k] += len(data)

    start = time.monotonic()
    started_unix = time.time()
    done, generating, behind, next_progress = 0, 0.0, 0.0, start + 1.0
    while done < total:
        now = time.monotonic()
        due = min(total, int((now - start) * rate) + 1)
        if due <= done:
            drain(max(0.0, min(0.002, start + (done + 1) / rate - now)))
            continue
        behind = max(behind, now - (start + done / rate))
        t0 = time.perf_counter()
        batch = stream.take(min(due - done, 1024))
        generating += time.perf_counter() - t0
        for k, data in batch:
            row = socks[k]
            sock = row[turn[k] % len(row)]
            turn[k] += 1
            try:
                sock.sendto(data, target)
                sent[k] += 1
                sent_bytes[k] += len(data)
            except OSError as exc:
                name = f"{KINDS[k]}:{exc.errno}"
                errors[name] = errors.get(name, 0) + 1
        done += len(batch)
        drain(0)
        if now >= next_progress:
            _emit({"progress": done})
            next_progress = now + 1.0
    attack_s = time.monotonic() - start
    _emit({"sent": done, "attack_s": attack_s})
    end = time.monotonic() + spec["grace_s"]
    while time.monotonic() < end:
        drain(0.05)
    _emit({"result": {
        "sent": {KINDS[k]: [sent[k], sent_bytes[k]] for k in range(n_kinds)},
        "back": {KINDS[k]: [back[k], back_bytes[k]] for k in range(n_kinds)},
        "errors": errors,
        "attack_s": round(attack_s, 3), "started_unix": started_unix,
        "ended_unix": started_unix + attack_s,
        "generator_s": round(generating, 3), "max_behind_s": round(behind, 4),
        "sockets": sum(len(r) for r in socks)}})


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Sender:
    """The sender process as seen from the benchmark (asyncio, inside the namespace)."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> int:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from bench.hostile.fuzz import sender_main; sender_main()",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=str(REPO))
        reaper.track_process(self.proc.pid)
        self.proc.stdin.write((json.dumps(self.spec) + "\n").encode())
        await self.proc.stdin.drain()
        return (await self._line("ready"))["ready"]

    async def go(self, live_ufrag: str | None) -> None:
        self.proc.stdin.write((json.dumps({"live_ufrag": live_ufrag}) + "\n").encode())
        await self.proc.stdin.drain()

    async def _line(self, key: str, progress=None) -> dict:
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                code = await self.proc.wait()
                raise RuntimeError(f"the sender exited ({code}) before {key!r}")
            msg = json.loads(line)
            if key in msg:
                return msg
            if progress is not None and "progress" in msg:
                progress(msg["progress"])

    async def sent(self, progress=None) -> dict:
        return await self._line("sent", progress)

    async def result(self) -> dict:
        msg = await self._line("result")
        await self.proc.wait()
        return msg["result"]

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


# ---------------------------------------------------------------- the wire

def stun_framed(data: bytes, length: int) -> bool:
    """services.wire.stun.is_stun on a datagram of ``length`` bytes of which ``data`` is the
    start (the relay's test for what a pending flow may forward)."""
    if length < HEADER_LENGTH or len(data) < 8 or data[0] & 0xC0:
        return False
    declared = (data[2] << 8) | data[3]
    return (int.from_bytes(data[4:8], "big") == MAGIC_COOKIE and declared % 4 == 0
            and HEADER_LENGTH + declared <= length)


def read_wire(path: Path, media_port: int) -> dict:
    """From a capture: attack datagrams forwarded to the transceiver per kind (STUN or not,
    datagrams and client bytes) and datagrams sent to the attack ranges per kind."""
    forwarded = {k: {"stun": 0, "other": 0, "bytes": 0} for k in KINDS}
    back = {k: {"datagrams": 0, "bytes": 0} for k in KINDS}
    for d in read_udp(path):
        dst = socket.inet_aton(d.dst_ip)
        k = kind_of_address(dst)
        if k is not None:
            row = back[KINDS[k]]
            row["datagrams"] += 1
            row["bytes"] += len(d.payload)
            continue
        p = d.payload
        if d.dst_port != media_port or len(p) < hopwire.IPV4_LENGTH or p[0] != hopwire.MAGIC:
            continue
        if p[1] != hopwire.TO_SERVER:  # IPv4, towards the server: all an attacker here makes
            continue
        k = kind_of_address(p[4:8])
        if k is None:
            continue
        row = forwarded[KINDS[k]]
        client = p[hopwire.IPV4_LENGTH:]
        row["stun" if stun_framed(client, len(client)) else "other"] += 1
        row["bytes"] += len(client)
    return {"forwarded": forwarded, "back": back}


# ---------------------------------------------------------------- live calls

def _sample_times(result) -> list[tuple[float, object]]:
    return [(result.started_unix + s.t_ms / 1000.0, s) for s in result.samples]


def call_window(results, t0: float, t1: float) -> dict:
    """The live calls between wall-clock ``t0`` and ``t1``: loss (client's received audio),
    RTCP round-trip time, and media gaps of 60 ms or more that began in the window."""
    received = lost = 0
    rtts: list[float] = []
    gaps = 0
    for r in results:
        inside = [(t, s) for t, s in _sample_times(r) if t0 <= t <= t1]
        if len(inside) >= 2:
            first, last = inside[0][1], inside[-1][1]
            received += last.packets_received - first.packets_received
            lost += max(0, last.packets_lost - first.packets_lost)
        rtts += [s.rtt_ms for _, s in inside if s.rtt_ms is not None]
        gaps += sum(1 for g in r.rx_gaps if t0 <= g[0] <= t1)
    expected = received + lost
    return {"packets": received, "lost": lost,
            "loss_pct": round(100.0 * lost / expected, 3) if expected else None,
            "rtt_ms_p50": round(statistics.median(rtts), 2) if rtts else None,
            "rtt_ms_max": round(max(rtts), 2) if rtts else None,
            "gaps_60ms": gaps}


# ---------------------------------------------------------------- crashes

def crash_lines(logs: Path) -> dict[str, int]:
    """``worker_crashed`` events and tracebacks in the services' logs (not the clients'):
    "log: what (the exception's last line)" -> how many times."""
    found: dict[str, int] = {}
    for path in sorted(logs.glob("*.log")):
        if path.name.startswith("clients"):
            continue
        for line in path.read_text(errors="replace").splitlines():
            if "worker_crashed" not in line and "Traceback" not in line:
                continue
            try:
                record = json.loads(line)
                what = (record.get("message") or record.get("event") or "?").splitlines()[0]
                exc = (record.get("exc") or record.get("exc_info") or "").strip()
                if exc:
                    what += " / " + exc.splitlines()[-1]
            except (ValueError, AttributeError):
                what = line
            key = f"{path.name}: {what[:160]}"
            found[key] = found.get(key, 0) + 1
    return found


# ---------------------------------------------------------------- one column

def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read())


def _delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0)}


async def _column(name: str, config: FuzzConfig, plan, templates_path: Path, workdir: Path,
                  say, progress) -> dict:
    from scenarios.demo_edge import CpuMark
    from scenarios.edge import Edge
    from services.client.config import ClientConfig

    loop = asyncio.get_running_loop()
    edge = Edge(plan, workdir)
    cluster, front = plan.clusters[0], plan.fronts[0]
    status_url = f"{edge.control_url(cluster)}/status"
    media_port = edge.media_port()
    relay_name = f"relay-{cluster.name}"
    pcap = workdir / "wire.pcap"
    sender = Sender({"target": [cluster.public, plan.ports.relay],
                     "templates": str(templates_path), "seed": config.seed,
                     "cases": config.cases, "rate": config.rate, "grace_s": config.grace_s,
                     "sources": sources(config)})
    quiet_s = attack_planned = config.attack_s
    call_s = config.settle_s + quiet_s + attack_planned * 1.2 + config.grace_s + 1.5
    capture = Capture(pcap, netns=plan.clusters[0].host.netns, snaplen=2200,
                      bpf_filter=f"udp and (dst port {media_port} or dst net {ATTACK_NET})")
    out: dict = {"relay_args": list(plan.relay_args)}
    calls_task = None
    try:
        say(f"{name}: starting the edge (relay {' '.join(plan.relay_args) or 'as it ships'})")
        await loop.run_in_executor(None, edge.start)
        pids = {n.rsplit("-", 1)[0]: s.process.pid for n, s in edge.services.items()}
        await loop.run_in_executor(None, capture.start)
        sockets = await sender.start()
        say(f"{name}: {sockets} sender sockets; {config.live_calls} live calls of {call_s:.0f} s")
        client = ClientConfig(url=edge.signaling_url(front), duration_s=call_s, start_rate=10.0,
                              full_sessions=config.full_clients, sample_interval_s=0.5)
        calls_task = asyncio.create_task(_calls(client, config.live_calls, workdir))
        live_ufrag = await _wait_connected(status_url, config.live_calls, calls_task)
        await asyncio.sleep(config.settle_s)

        pids["attacker"] = sender.proc.pid
        q0, c0 = CpuMark.take(pids), await loop.run_in_executor(None, edge.relay_counters)
        quiet_t0 = time.time()
        await asyncio.sleep(quiet_s)
        quiet_t1 = time.time()
        q1, c1 = CpuMark.take(pids), await loop.run_in_executor(None, edge.relay_counters)

        say(f"{name}: attack, {config.cases:,} cases at {config.rate:,.0f}/s")
        await sender.go(live_ufrag)
        a0 = CpuMark.take(pids)
        attack_t0 = time.time()
        await sender.sent(progress)
        attack_t1 = time.time()
        a1 = CpuMark.take(pids)
        result = await sender.result()  # after grace_s: the relay has published its counters
        c2 = await loop.run_in_executor(None, edge.relay_counters)
        counted_t1 = time.time()
        results = await calls_task
        calls_task = None
        alive = {n: s.process.alive() for n, s in edge.services.items()}
        c3 = await loop.run_in_executor(None, edge.relay_counters)
        status = await loop.run_in_executor(None, _get_json, status_url)
    finally:
        if calls_task is not None:
            calls_task.cancel()
            await asyncio.gather(calls_task, return_exceptions=True)
        await sender.stop()
        try:
            if capture.pid is not None:
                await loop.run_in_executor(None, capture.stop)
        finally:
            await loop.run_in_executor(None, edge.stop)

    wire = await loop.run_in_executor(None, read_wire, pcap, media_port)
    lagged, _ = lag_of(workdir)
    attack_len = attack_t1 - attack_t0
    scale = attack_len / (quiet_t1 - quiet_t0)
    total_sent = sum(v[0] for v in result["sent"].values())
    cpu = {}
    for svc in (*CPU_SERVICES, "agent", "front", "redis", "attacker"):
        quiet = q1.seconds.get(svc, 0.0) - q0.seconds.get(svc, 0.0)
        attack = a1.seconds.get(svc, 0.0) - a0.seconds.get(svc, 0.0)
        cpu[svc] = {"quiet_s": round(quiet, 3), "attack_s": round(attack, 3),
                    "ms_per_1000": round((attack - quiet * scale) * 1e6 / max(1, total_sent), 3)}
    forwarded = wire["forwarded"]
    fwd_total = sum(r["stun"] + r["other"] for r in forwarded.values())
    counters_attack = _delta(c1.get(relay_name, {}), c2.get(relay_name, {}))
    counters_quiet = _delta(c0.get(relay_name, {}), c1.get(relay_name, {}))
    # The relay's own count of hostile datagrams forwarded: what it forwarded from the quiet
    # window's end to after the grace, less the live calls' share at their quiet-window rate.
    calls_share = counters_quiet.get("packets_to_server", 0) * (counted_t1 - quiet_t1) / (
        quiet_t1 - quiet_t0)
    relay_hostile = round(counters_attack.get("packets_to_server", 0) - calls_share)
    out.update({
        "sent": {k: {"datagrams": v[0], "bytes": v[1]} for k, v in result["sent"].items()},
        "sent_total": total_sent,
        "send_errors": result["errors"],
        "attack_s": round(attack_len, 3), "quiet_s": round(quiet_t1 - quiet_t0, 3),
        "rate_achieved": round(total_sent / attack_len) if attack_len else None,
        "sender": {k: result[k] for k in ("sockets", "generator_s", "max_behind_s")},
        "came_back": {"sockets": {k: {"datagrams": v[0], "bytes": v[1]}
                                  for k, v in result["back"].items()},
                      "wire": wire["back"]},
        "forwarded": forwarded,
        "forwarded_total": fwd_total,
        "forwarded_per_100k": round(fwd_total * 1e5 / max(1, total_sent)),
        "forwarded_other_total": sum(r["other"] for r in forwarded.values()),
        "relay_forwarded_hostile": relay_hostile,  # cross-check of forwarded_total
        "relay_counters_attack": counters_attack,
        "relay_counters_quiet": counters_quiet,
        "relay_counters_end": c3.get(relay_name, {}),
        "transceiver_mux": {"counters": status.get("mux"), "state": status.get("mux_state")},
        "capture": asdict(capture.stats) if capture.stats else None,
        "cpu": cpu,
        "cpu_ms_per_1000": {svc: cpu[svc]["ms_per_1000"] for svc in CPU_SERVICES},
        "alive": alive,
        "lagged_seconds": lagged,  # per process, the whole column (docs/logs.md)
        "crash_lines": crash_lines(workdir),
        "live_calls": {
            "calls": len(results), "ok": sum(1 for r in results if r.ok),
            "reconnections": sum(r.reconnections for r in results),
            "errors": sorted({r.error for r in results if r.error}),
            "quiet": call_window(results, quiet_t0, quiet_t1),
            "attack": call_window(results, attack_t0, attack_t1),
        },
        "live_ufrag": live_ufrag,
        "logs": str(workdir),
    })
    out["violations"] = violations(name, out)
    return out


async def _calls(client, n: int, workdir: Path) -> list:
    """The live calls, their results and samples in the column's folder, and the clients'
    own event-loop lag in clients-demo.log (gaps measured while it lagged are the host's)."""
    from scenarios.demo_edge import clients_log
    from services.client.runner import run_sessions
    from services.lag import LoopLagMonitor

    with clients_log(workdir) as log:
        async with LoopLagMonitor(log):
            return await run_sessions(client, n, results_path=workdir / "sessions.jsonl",
                                      samples_path=workdir / "samples.jsonl")


async def _wait_connected(url: str, n: int, calls: asyncio.Task, timeout: float = 30.0) -> str:
    """Wait until ``n`` sessions are connected; the first one's server ufrag."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not calls.done():
        status = await loop.run_in_executor(None, _get_json, url)
        live = [s for s in status.get("session_details", []) if s["state"] == "connected"]
        if len(live) >= n:
            return live[0]["ufrag"]
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the live calls did not connect within {timeout:g} s")


def violations(column: str, c: dict) -> list[str]:
    """Every rule the column broke (empty when all held)."""
    out = []
    for where in ("sockets", "wire"):
        for kind, row in c["came_back"][where].items():
            if row["datagrams"]:
                out.append(f"{column}: {row['datagrams']} datagrams ({row['bytes']} bytes) came "
                           f"back to {kind} senders ({where})")
            if row["bytes"] > c["sent"][kind]["bytes"]:
                out.append(f"{column}: more bytes back than sent for {kind} ({where})")
    if not c["relay_args"] or "--no-pending-flows" not in c["relay_args"]:
        for kind, row in c["forwarded"].items():
            if row["other"]:
                out.append(f"{column}: {row['other']} non-STUN datagrams of {kind} forwarded "
                           "to the transceiver")
    for name, ok in c["alive"].items():
        if not ok:
            out.append(f"{column}: {name} died")
    out += [f"{column}: {n} x {what}" for what, n in c["crash_lines"].items()]
    calls = c["live_calls"]
    if calls["ok"] < calls["calls"]:
        out.append(f"{column}: {calls['calls'] - calls['ok']} live calls failed "
                   f"({', '.join(calls['errors'])})")
    return out


# ---------------------------------------------------------------- the benchmark

def run(config: FuzzConfig, say=lambda m: None, progress=None) -> dict:
    """Every column of ``config``, side by side; JSON-ready. ``progress(done, total)`` counts
    cases sent over all columns."""
    from scenarios.demo_edge import demo_plan
    from services.transceiver.ice import SHARED
    from topology.netns import in_namespace, lab_namespace

    workdir = config.workdir or temp_dir("voiceedge-fuzz-")
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"building templates ({config.templates_per_kind} per kind) in {workdir}")
    t0 = time.perf_counter()
    templates = build_templates(config.templates_per_kind, config.seed)
    build_s = time.perf_counter() - t0
    templates_path = workdir / "templates.pkl"
    templates_path.write_bytes(pickle.dumps(templates))
    rate = generator_rate(templates, min(200_000, max(20_000, config.cases // 5)), config.seed)
    say(f"{sum(map(len, templates.values()))} templates in {build_s:.1f} s; "
        f"the generator derives {rate:,.0f} cases/s")
    total = config.cases * len(config.columns)
    columns = {}
    for i, name in enumerate(config.columns):
        base = i * config.cases
        tick = (lambda n, base=base: progress(base + n, total)) if progress else None
        with lab_namespace("vefuzz") as ns:
            plan = replace(demo_plan(SHARED, ns.name, *ns.addresses),
                           relay_args=COLUMN_ARGS[name])
            coldir = workdir / name
            coldir.mkdir(exist_ok=True)
            columns[name] = in_namespace(ns.name, asyncio.run, _column(
                name, config, plan, templates_path, coldir, say, tick))
        if progress:
            progress(base + config.cases, total)
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    return {
        "config": cfg, "kinds": list(KINDS),
        "sources": {k: sum(n for _, n in v) for k, v in sources(config).items()},
        "generator": {"templates": sum(map(len, templates.values())),
                      "templates_by_kind": {k: len(v) for k, v in templates.items()},
                      "build_s": round(build_s, 2), "cases_per_s": round(rate)},
        "columns": columns,
        "violations": [v for c in columns.values() for v in c["violations"]],
        "logs": str(workdir),
    }


def lines(result: dict) -> list[str]:
    """A short human table: the columns side by side."""
    cols = result["columns"]
    names = list(cols)
    width = 20

    def row(label: str, values) -> str:
        return f"{label:<34}" + "".join(f"{v:>{width}}" for v in values)

    def fmt(v) -> str:
        if v is None:
            return "-"
        return f"{v:,.2f}" if isinstance(v, float) else f"{v:,}"

    out = [row("hostile fuzzing", names),
           row("relay options", [" ".join(cols[n]["relay_args"]) or "(ships)" for n in names])]
    out.append(row("cases sent", [fmt(cols[n]["sent_total"]) for n in names]))
    out.append(row("  rate achieved /s", [fmt(cols[n]["rate_achieved"]) for n in names]))
    out.append(row("came back: datagrams (sockets)", [fmt(sum(
        r["datagrams"] for r in cols[n]["came_back"]["sockets"].values())) for n in names]))
    out.append(row("wire capture: dropped by kernel", [fmt((cols[n]["capture"] or {}).get(
        "dropped_by_kernel")) for n in names]))
    out.append(row("came back: datagrams (wire)", [fmt(sum(
        r["datagrams"] for r in cols[n]["came_back"]["wire"].values())) for n in names]))
    out.append(row("forwarded to the transceiver", [fmt(cols[n]["forwarded_total"]) for n in names]))
    out.append(row("  per 100,000 hostile", [fmt(cols[n]["forwarded_per_100k"]) for n in names]))
    out.append(row("  of them not STUN", [fmt(cols[n]["forwarded_other_total"]) for n in names]))
    out.append(row("  relay's count (cross-check)", [fmt(cols[n]["relay_forwarded_hostile"])
                                                     for n in names]))
    out.append("forwarded by kind: STUN / other (per 100k of the kind)")
    for kind in result["kinds"]:
        cells = []
        for n in names:
            f, s = cols[n]["forwarded"][kind], cols[n]["sent"][kind]["datagrams"]
            per = (f["stun"] + f["other"]) * 1e5 / s if s else 0
            cells.append(f"{f['stun']}/{f['other']} ({per:,.0f})")
        out.append(f"  {kind:<32}" + "".join(f"{c:>{width}}" for c in cells)
                   + f"   sent {cols[names[0]]['sent'][kind]['datagrams']:,}")
    for svc in CPU_SERVICES:
        out.append(row(f"{svc} CPU ms per 1,000 hostile",
                       [fmt(cols[n]["cpu_ms_per_1000"][svc]) for n in names]))
    for key, label in (("loss_pct", "loss %"), ("rtt_ms_p50", "RTT p50 ms"),
                       ("gaps_60ms", "gaps >= 60 ms")):
        out.append(row(f"live calls {label} quiet / attack", [
            f"{fmt(cols[n]['live_calls']['quiet'][key])} / "
            f"{fmt(cols[n]['live_calls']['attack'][key])}" for n in names]))
    out.append(row("seconds lagged: relay/transc./clients", [
        "/".join(str(cols[n].get("lagged_seconds", {}).get(p, 0))
                 for p in ("relay", "transceiver", "clients")) for n in names]))
    out.append(row("live calls ok", [f"{cols[n]['live_calls']['ok']}/{cols[n]['live_calls']['calls']}"
                                     for n in names]))
    out.append(row("crashes (services gone + log lines)", [str(
        sum(not a for a in cols[n]["alive"].values()) + sum(cols[n]["crash_lines"].values()))
        for n in names]))
    out.append(f"generator: {result['generator']['cases_per_s']:,} cases/s from "
               f"{result['generator']['templates']:,} templates")
    v = result["violations"]
    out.append("violations: none" if not v else f"violations ({len(v)}):")
    out += [f"  {x}" for x in v[:20]]
    return out
