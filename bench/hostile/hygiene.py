"""Resource hygiene: thousands of sessions, complete and failed half-way, leave nothing behind.

The one-host edge of ``voiceedge demo edge`` (scenarios/demo_edge.py: Redis, relay, transceiver,
echo agent, signaling as real processes in a lab namespace) takes ``complete`` real client
sessions (services/client/runner.py, short calls, bounded concurrency) and, at the same time,
``halfway`` sessions that fail half-way, a third of each kind:

- ``no-ice``: the offer is POSTed, the answer read, and nothing is ever sent;
- ``no-dtls``: ICE completes (the client's own aioice agent, driven with the answer's
  ufrag/password) but DTLS never starts; the client keeps answering consent checks until after
  the transceiver's setup timeout, so only that timeout can end the session;
- ``vanished``: the call connects (ICE, DTLS, SCTP), then the client goes silent and closes
  without a datagram more (no DTLS close_notify, no RTCP BYE, no DELETE): only the
  transceiver's consent checks (RFC 7675, aioice) can end it.

None of them sends DELETE: the server's timeouts must reap them. Each service is measured from
outside (/proc: open fds and RSS of the process and its children, so the relay's workers count)
and through its endpoints (asyncio tasks, the relay's flows, the transceiver's sessions and
shared-socket state, the agent's sessions, and the process figures of services/introspect.py):
``before`` (after a warm-up, the edge idle again), ``after`` (the clients done; half-way
sessions still held) and ``reaped`` (once every session and flow is gone, or
``reap_timeout_s``). The sessions run in ``rounds``; the edge is idle between rounds. Bounds
(``violations``):

- fds, asyncio tasks, flows, sessions and everything the shared socket holds (learned
  addresses, ufrags, parked datagrams, hop cache: ``SharedSocket.state_sizes``) exactly back
  to ``before`` after every round (each the minimum of a few samples over ``settle_s``, so a
  connection being closed or a background refill at that instant does not count);
- memory: a leak grows memory in every round by the same amount; high-water marks are reached
  in round 1. So the smallest growth of any round after the first must stay under a bound, per
  service, of what the transceiver, agent and signaling say after a full garbage collection
  (``?gc=1``): ``heap_round_kib`` for the heap malloc has handed out (``heap_kib``: native
  memory, OpenSSL, libsrtp, libopus..., and Python's objects over 512 bytes; a leak of 1 KiB
  per session is 500 KiB in a round of 500 sessions, the default 4 rounds of 250 complete +
  250 half-way), ``blocks_round`` for Python's blocks (live objects: one more per session is
  500 a round), ``rss_round_kib`` for RSS once malloc has handed its free memory back
  (``?trim=1``: ``rss_trimmed_kib``; the relay, which cannot, by its RSS). RSS as the
  allocators keep it (``rss_kib``) and malloc's free memory (``heap_free_kib``) are reported,
  not bounded: glibc keeps what the peak freed, tens of MiB in the transceiver, and it drifts
  by hundreds of KiB a round without any memory in use more. docs/hostile.md ("Resource
  hygiene") has the measured noise under each bound.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.rtcconfiguration import RTCBundlePolicy
from aiortc.rtcicetransport import candidate_to_aioice
from aiortc.sdp import SessionDescription
from prometheus_client.parser import text_string_to_metric_families

from scenarios.demo_edge import demo_plan
from scenarios.edge import Edge
from services.client.config import ClientConfig
from services.client.runner import run_sessions
from services.client.session import DATA_CHANNEL
from services.client.signaling import SignalingError, post_offer
from services.procfs import descendants, kib, open_fds, status_fields
from services.relay.counters import scrape
from services.transceiver.ice import SHARED
from topology.netns import in_namespace, lab_namespace
from voiceedge.reaper import temp_dir

NO_ICE, NO_DTLS, VANISHED = "no-ice", "no-dtls", "vanished"
HALFWAY_KINDS = (NO_ICE, NO_DTLS, VANISHED)
# bounded by their growth per round (some only reported), not back to baseline
MEMORY = ("rss_kib", "rss_trimmed_kib", "heap_kib", "heap_free_kib", "py_blocks")
SERVICES = {"relay": "relay-demo", "transceiver": "transceiver-demo",
            "signaling": "front-demo", "agent": "agent-demo"}
# Service defaults the full run keeps (None in the config): transceiver --setup-timeout,
# aioice's consent interval (6 failed checks end a session), relay --idle-timeout.
DEFAULT_SETUP_S, DEFAULT_CONSENT_S, DEFAULT_RELAY_IDLE_S = 10.0, 5.0, 30.0


@dataclass(frozen=True)
class HygieneConfig:
    complete: int = 1000
    halfway: int = 1000
    rounds: int = 4
    call_s: float = 1.0
    # Complete + half-way sessions at once stay within signaling's 8 spare warm connections
    # (services/signaling/pool.py), so its pool, and the transceiver's fds with it, keep their
    # idle size instead of growing for 60 s after a burst.
    concurrency: int = 6
    halfway_concurrency: int = 2
    halfway_rate: float = 4.0       # half-way sessions started per second, at most
    full_clients: int = 2           # per round; the other complete sessions are light clients
    warmup: int = 3                 # complete sessions before the baseline
    warmup_halfway: bool = True     # and one of each half-way kind
    setup_timeout_s: float | None = None       # transceiver; None: its default (10 s)
    consent_interval_s: float | None = None    # transceiver, test-only; None: aioice's 5 s
    relay_idle_timeout_s: float | None = None  # relay; None: its default (30 s)
    reap_timeout_s: float = 150.0   # longest wait for the edge to be idle again
    settle_s: float = 2.0           # samples taken over this long; the minimum counts
    heap_round_kib: int = 128       # growth in every round after the first: a leak
    blocks_round: int = 500         # the same for Python's allocated blocks (collected)
    rss_round_kib: int = 256        # and for RSS (trimmed, where the service can)
    blocks_total: int | None = None  # Python's blocks from before to the end, if set
    workdir: Path | None = None
    media_path: str = "native"      # the transceiver's (docs/mediaplane.md): its state too
    light_path: str = "native"      # the light clients'


    @classmethod
    def quick(cls, **changes) -> "HygieneConfig":
        """2 rounds of 40 complete + 40 half-way, server timeouts of a second or two (the
        test). Round 1 reaches the high-water marks; round 2 bounds the heap in use as tightly
        (56 KiB: a leak of 1 KiB per session is 80), Python's blocks and RSS loosely (caches
        that fill over a few hundred sessions grow them by hundreds of blocks and KiB a round
        at this scale; a session's object graph left behind is thousands of blocks a session);
        Python's blocks also from before to the end (first uses of code paths the warm-up did
        not take count too)."""
        return replace(cls(complete=80, halfway=80, rounds=2, warmup=2, warmup_halfway=False,
                           concurrency=6, halfway_concurrency=2, halfway_rate=20.0,
                           setup_timeout_s=1.5, consent_interval_s=0.2,
                           relay_idle_timeout_s=1.0, reap_timeout_s=30.0, settle_s=1.0,
                           heap_round_kib=56, blocks_round=2500, rss_round_kib=1024,
                           blocks_total=5000),
                       **changes)

    def __post_init__(self) -> None:
        if self.complete < 0 or self.halfway < 0 or self.rounds < 1:
            raise ValueError("complete and halfway must be >= 0, rounds >= 1")
        if self.concurrency < 1 or self.halfway_concurrency < 1 or self.halfway_rate <= 0:
            raise ValueError("concurrencies and halfway_rate must be positive")

    def timeouts(self) -> dict[str, float]:
        """The server-side timeouts that reap half-way sessions, as run."""
        consent = self.consent_interval_s or DEFAULT_CONSENT_S
        return {"transceiver_setup_s": self.setup_timeout_s or DEFAULT_SETUP_S,
                "consent_interval_s": consent,
                "consent_expiry_s": round(6 * (consent * 1.2 + 0.5), 1),  # worst case
                "relay_idle_s": self.relay_idle_timeout_s or DEFAULT_RELAY_IDLE_S}


# ------------------------------------------------------------------ half-way clients

class _Muted:
    """Stands in for a client socket's transport: sends nothing (the client vanished), closes
    the real one."""

    def __init__(self, transport) -> None:
        self._transport = transport

    def sendto(self, data, addr=None) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._transport, name)


def _ice_agent(pc: RTCPeerConnection):
    """The aioice Connection of ``pc`` (max-bundle: one for every m-line)."""
    return pc.getTransceivers()[0].receiver.transport.transport._connection


async def _ice_only(pc: RTCPeerConnection, answer: str) -> None:
    """Complete ICE with the answer's ufrag/password and candidates, as the controlling agent,
    without aiortc (so DTLS never starts)."""
    media = SessionDescription.parse(answer).media[0]
    agent = _ice_agent(pc)
    agent.ice_controlling = True
    agent.remote_username, agent.remote_password = media.ice.usernameFragment, media.ice.password
    for candidate in media.ice_candidates:
        await agent.add_remote_candidate(candidate_to_aioice(candidate))
    await agent.add_remote_candidate(None)
    await agent.connect()


async def _connect(pc: RTCPeerConnection, answer: str) -> None:
    connected = asyncio.Event()

    @pc.on("connectionstatechange")
    def changed() -> None:
        if pc.connectionState in ("connected", "failed", "closed"):
            connected.set()

    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    await connected.wait()
    if pc.connectionState != "connected":
        raise ConnectionError(f"connection {pc.connectionState}")


def _vanish(pc: RTCPeerConnection) -> None:
    """From now on nothing ``pc`` sends leaves the host (its close included)."""
    for protocol in _ice_agent(pc)._protocols:
        protocol.transport = _Muted(protocol.transport)


async def halfway_call(http: aiohttp.ClientSession, url: str, kind: str, timeout_s: float,
                       hold_s: float = 0.0, reached=lambda: None) -> str | None:
    """One half-way session of ``kind``; None when it got as far as ``kind`` says, else why
    not. ``reached()`` is called once it got there (or failed); a ``no-dtls`` session then
    keeps its ICE agent (answering consent checks) ``hold_s`` longer."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[],
                                            bundlePolicy=RTCBundlePolicy.MAX_BUNDLE))
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        pc.createDataChannel(DATA_CHANNEL)
        await pc.setLocalDescription(await pc.createOffer())
        answer = await post_offer(http, url, pc.localDescription.sdp, timeout_s)
        async with asyncio.timeout(timeout_s):
            if kind == NO_DTLS:
                await _ice_only(pc, answer.sdp)
            elif kind == VANISHED:
                await _connect(pc, answer.sdp)
                _vanish(pc)
        reached()
        if kind == NO_DTLS:
            await asyncio.sleep(hold_s)
        return None
    except SignalingError as exc:
        return str(exc)
    except (TimeoutError, ConnectionError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}".rstrip(": ")
    finally:
        reached()
        await pc.close()


async def run_halfway(url: str, n: int, cfg: HygieneConfig, on_done=None) -> dict:
    """``n`` half-way sessions, kinds in turn, at most ``halfway_rate`` per second and
    ``halfway_concurrency`` setting up at once (a ``no-dtls`` hold does not count); per kind:
    {"n", "ok", "failed": {reason: count}}."""
    out = {kind: {"n": 0, "ok": 0, "failed": Counter()} for kind in HALFWAY_KINDS}
    slots = asyncio.Semaphore(cfg.halfway_concurrency)
    hold_s = (cfg.setup_timeout_s or DEFAULT_SETUP_S) + 1.0

    async def one(http, kind: str) -> None:
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                slots.release()

        error = await halfway_call(http, url, kind, 10.0, hold_s, release)
        row = out[kind]
        row["n"] += 1
        if error is None:
            row["ok"] += 1
        else:
            row["failed"][error] += 1
        if on_done is not None:
            on_done()

    tasks = []
    async with aiohttp.ClientSession() as http:
        try:
            t0 = time.monotonic()
            for i in range(n):
                delay = t0 + i / cfg.halfway_rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await slots.acquire()
                tasks.append(asyncio.create_task(one(http, HALFWAY_KINDS[i % 3])))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return {kind: {**row, "failed": dict(row["failed"])} for kind, row in out.items()}


# ------------------------------------------------------------------ measuring

def _read(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


def _samples(url: str) -> dict[str, float]:
    """Prometheus text at ``url``: sample name -> value, summed over labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(_read(url).decode()):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _proc(root: int | None) -> dict[str, int | None]:
    """Open fds and RSS (KiB) of ``root`` and its descendants, from /proc."""
    fds = rss = 0
    pids = descendants(root)
    for pid in pids:
        try:
            pid_fds, pid_rss = open_fds(pid), kib(status_fields(pid), "VmRSS")
        except OSError:  # gone meanwhile
            continue
        if pid_rss is not None:  # not a zombie
            fds, rss = fds + pid_fds, rss + pid_rss
    return {"fds": fds, "rss_kib": rss} if pids else {"fds": None, "rss_kib": None}


def _int(value) -> int | None:
    return None if value is None else int(value)


class Probe:
    """Reads every service of a running demo edge; call ``sample`` from inside its namespace."""

    def __init__(self, edge: Edge) -> None:
        cluster, front = edge.plan.clusters[0], edge.plan.fronts[0]
        p = edge.plan.ports
        self.edge = edge
        self.transceiver = f"{edge.control_url(cluster)}/status"
        self.relay = edge.metrics_url()
        self.agent = f"http://127.0.0.1:{p.agent}/metrics"
        self.signaling = f"http://{front.listen}:{p.signaling}/metrics"

    def _pid(self, service: str) -> int | None:
        s = self.edge.services.get(SERVICES[service])
        return s.process.pid if s is not None and s.process.alive() else None

    def sample(self, collect: bool = False, trim: bool = False) -> dict[str, dict]:
        """Every service now; ``collect``: Python's blocks and the heap after a full garbage
        collection (transceiver, agent, signaling; the edge should be idle); ``trim``: and
        their RSS after malloc's free memory is handed back (``rss_trimmed_kib``), read after
        ``rss_kib``, which is never trimmed."""
        query = "?gc=1&trim=1" if trim else "?gc=1" if collect else ""
        out = {name: _proc(self._pid(name)) for name in SERVICES}
        counters = scrape(self.relay)
        out["relay"].update(flows_active=counters.get("flows_active"),
                            flows_pending=counters.get("flows_pending"))
        status = json.loads(_read(self.transceiver + query))
        process = status.get("process") or {}
        out["transceiver"].update(memory_figures(process, trim),
                                  tasks=process.get("asyncio_tasks"), sessions=status["sessions"],
                                  udp_sockets=status["udp_sockets"])
        mux = status.get("mux_state") or {}
        out["transceiver"].update({f"mux_{k}": v for k, v in mux.items()})
        for name, url, extra in (("agent", self.agent, "sessions_active"),
                                 ("signaling", self.signaling, "transceiver_warm_connections")):
            prefix = f"voiceedge_{name}_"
            metrics = {k[len(prefix):]: _int(v) for k, v in _samples(url + query).items()
                       if k.startswith(prefix)}
            process = {k[len("process_"):]: v for k, v in metrics.items()
                       if k.startswith("process_")}
            out[name].update(memory_figures(process, trim), tasks=process.get("asyncio_tasks"))
            out[name]["sessions" if name == "agent" else "warm_connections"] = metrics.get(extra)
        return out


def memory_figures(process: dict, trimmed: bool) -> dict[str, int | None]:
    """A service's own memory figures (services/introspect.py's snapshot keys) in the
    benchmarks' units: ``py_blocks``, ``heap_kib`` (malloc's heap in use), ``heap_free_kib``
    (freed, still kept) and, when the service trimmed its heap first, ``rss_trimmed_kib``;
    None where the service does not report one."""
    def kib(key: str) -> int | None:
        return None if process.get(key) is None else process[key] // 1024

    out = {"py_blocks": process.get("python_blocks"), "heap_kib": kib("heap_in_use_bytes"),
           "heap_free_kib": kib("heap_free_bytes")}
    if trimmed:
        out["rss_trimmed_kib"] = kib("rss_bytes")
    return out


def held(sample: dict, baseline: dict | None) -> list[str]:
    """What the edge still holds for sessions (empty: idle). With a ``baseline``, signaling's
    warm connections must also be back to its number."""
    out = []
    for service, key in (("transceiver", "sessions"), ("agent", "sessions"),
                         ("relay", "flows_active"), ("relay", "flows_pending")):
        if sample[service].get(key):
            out.append(f"{service} {key} {sample[service][key]}")
    for key, value in sample["transceiver"].items():
        if key.startswith("mux_") and value:
            out.append(f"transceiver {key} {value}")
    if baseline is not None:
        warm, was = (sample["signaling"]["warm_connections"],
                     baseline["signaling"]["warm_connections"])
        if warm != was:
            out.append(f"signaling warm_connections {warm} (baseline {was})")
    return out


def settled(samples: list[dict]) -> dict:
    """Per service and key, the minimum over ``samples`` (None where a sample had none)."""
    out: dict[str, dict] = {}
    for service in samples[0]:
        keys = set().union(*(s[service].keys() for s in samples))
        values = {k: [s[service].get(k) for s in samples] for k in keys}
        out[service] = {k: (None if None in v else min(v)) for k, v in sorted(values.items())}
    return out


async def reap(probe: Probe, baseline: dict | None, cfg: HygieneConfig) -> tuple[dict, float, list]:
    """Wait until the edge holds nothing (``held``) or ``reap_timeout_s``, then sample it for
    ``settle_s``, collecting garbage first, and once more trimming the heaps too: (settled
    sample, seconds waited, what was still held at the timeout)."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    while True:
        sample = await loop.run_in_executor(None, probe.sample)
        still = held(sample, baseline)
        if not still or time.monotonic() - started > cfg.reap_timeout_s:
            break
        await asyncio.sleep(0.25)
    waited = round(time.monotonic() - started, 1)
    samples = []
    end = time.monotonic() + cfg.settle_s
    while not samples or time.monotonic() < end:
        samples.append(await loop.run_in_executor(None, probe.sample, True))
        await asyncio.sleep(cfg.settle_s / 4)
    out = settled(samples)  # RSS as the allocators keep it: trimmed only now, once
    trimmed = await loop.run_in_executor(None, probe.sample, True, True)
    for service, row in trimmed.items():
        if "rss_trimmed_kib" in row:
            out[service]["rss_trimmed_kib"] = row["rss_trimmed_kib"]
    return out, waited, still


# ------------------------------------------------------------------ the run

def run(config: HygieneConfig = HygieneConfig(), say=lambda msg: None, progress=None) -> dict:
    """The whole measurement (needs root: a lab namespace); JSON-ready. ``progress(done,
    total)`` is called as sessions end."""
    workdir = config.workdir or temp_dir("voiceedge-hygiene-")
    workdir.mkdir(parents=True, exist_ok=True)
    with lab_namespace("vehyg") as ns:
        plan = replace(demo_plan(SHARED, ns.name, *ns.addresses, config.media_path),
                       relay_args=_option("--idle-timeout", config.relay_idle_timeout_s),
                       transceiver_args=("--media-path", config.media_path,
                                         *_option("--setup-timeout", config.setup_timeout_s),
                                         *_option("--test-consent-interval",
                                                  config.consent_interval_s)))
        result = in_namespace(ns.name, asyncio.run, _run(config, plan, workdir, say, progress))
    result["violations"] = violations(result, config)
    return result


def _option(flag: str, value) -> tuple[str, ...]:
    """``(flag, value)``, or nothing for None (the service's default)."""
    return () if value is None else (flag, str(value))


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


async def _sessions(cfg: HygieneConfig, url: str, complete: int, halfway: int,
                    workdir: Path, ended) -> dict:
    """``complete`` client sessions and ``halfway`` half-way ones at the same time."""
    client = ClientConfig(url=url, duration_s=cfg.call_s, start_rate=50.0,
                          concurrency=cfg.concurrency,
                          full_sessions=min(cfg.full_clients, complete),
                          light_path=cfg.light_path)
    jobs = [run_sessions(client, complete, results_path=workdir / "sessions.jsonl",
                         on_result=lambda _r: ended()) if complete else asyncio.sleep(0, [])]
    jobs.append(run_halfway(url, halfway, cfg, ended) if halfway else asyncio.sleep(0, {}))
    results, half = await asyncio.gather(*jobs)
    failed = Counter(r.error or "unknown" for r in results if not r.ok)
    return {"complete": {"n": len(results), "ok": len(results) - sum(failed.values()),
                         "failed": dict(failed)}, "halfway": half}


def _add(total: dict, part: dict) -> None:
    for key, value in part.items():
        if isinstance(value, dict):
            _add(total.setdefault(key, {}), value)
        else:
            total[key] = total.get(key, 0) + value


async def _run(cfg: HygieneConfig, plan, workdir: Path, say, progress) -> dict:
    from scenarios.timeline import merge_timeline

    loop = asyncio.get_running_loop()
    edge = Edge(plan, workdir)
    probe = Probe(edge)
    url = edge.signaling_url(plan.fronts[0])
    total, done = cfg.complete + cfg.halfway, 0

    def ended() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    rounds, outcome = [], {}
    try:
        say(f"starting the edge in {workdir}")
        await loop.run_in_executor(None, edge.start)
        say(f"warm-up: {cfg.warmup} sessions"
            + (" and one of each half-way kind" if cfg.warmup_halfway else ""))
        await _sessions(cfg, url, cfg.warmup, 3 if cfg.warmup_halfway else 0, workdir,
                        lambda: None)
        before, warmup_s, warm_held = await reap(probe, None, cfg)
        for i, (n, m) in enumerate(zip(_split(cfg.complete, cfg.rounds),
                                       _split(cfg.halfway, cfg.rounds))):
            say(f"round {i + 1}/{cfg.rounds}: {n} complete sessions, {m} half-way")
            _add(outcome, await _sessions(cfg, url, n, m, workdir, ended))
            after = await loop.run_in_executor(None, probe.sample)
            say(f"round {i + 1}: waiting for the edge to reap what is left")
            reaped, waited, still = await reap(probe, before, cfg)
            rounds.append({"after": after, "reaped": reaped, "reap_s": waited, "held": still})
    finally:
        await loop.run_in_executor(None, edge.stop)
        merge_timeline(workdir)

    last = rounds[-1] if rounds else {"after": before, "reaped": before}
    services = {}
    for name in SERVICES:
        b, a, r = before[name], last["after"][name], last["reaped"][name]
        services[name] = {"before": b, "after": a, "reaped": r,
                          "delta": {k: (None if r.get(k) is None or b.get(k) is None
                                        else r[k] - b[k]) for k in r}}
    return {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
            "timeouts": cfg.timeouts(), "sessions": outcome, "services": services,
            "warmup": {"reap_s": warmup_s, "held": warm_held},
            "rounds": rounds, "logs": str(workdir)}


def violations(result: dict, cfg: HygieneConfig) -> list[str]:
    """Growth beyond the bounds of the module docstring, one line each."""
    out = []
    if result["warmup"]["held"]:
        out.append("warm-up not reaped: " + ", ".join(result["warmup"]["held"]))
    before = {name: s["before"] for name, s in result["services"].items()}
    for i, rnd in enumerate(result["rounds"], 1):
        if rnd["held"]:
            out.append(f"round {i}: still held {cfg.reap_timeout_s:g} s after the clients: "
                       + ", ".join(rnd["held"]))
        for name, row in rnd["reaped"].items():
            for key, value in row.items():
                was = before[name].get(key)
                if key in MEMORY or value is None or was is None:
                    continue
                if value > was:
                    out.append(f"round {i}: {name} {key} {was} -> {value} (+{value - was}) "
                               "once reaped; bound: back to baseline")
    for name in before:
        bounds = {rss_key(result, name): cfg.rss_round_kib, "heap_kib": cfg.heap_round_kib,
                  "py_blocks": cfg.blocks_round}
        for key, bound in bounds.items():
            growth = round_growth(result, name, key)
            if growth and min(growth) > bound:
                out.append(f"{name} {key} grew in every round after the first: "
                           f"{' / '.join(map(str, growth))} (bound {bound} in one of them)")
        was = before[name].get("py_blocks")
        now = result["rounds"][-1]["reaped"][name].get("py_blocks")
        if cfg.blocks_total is not None and None not in (was, now) and now - was > cfg.blocks_total:
            out.append(f"{name} py_blocks {was} -> {now} (+{now - was}) once reaped; bound: "
                       f"+{cfg.blocks_total}")
    return out


def rss_key(result: dict, service: str) -> str:
    """The RSS that is bounded: after the service trimmed its heap, where it can."""
    trimmed = all(r["reaped"][service].get("rss_trimmed_kib") is not None
                  for r in result["rounds"])
    return "rss_trimmed_kib" if trimmed else "rss_kib"


def round_growth(result: dict, service: str, key: str) -> list[int]:
    """How much ``key`` of ``service`` grew in each round after the first (reaped to
    reaped); empty when it is not measured."""
    values = [r["reaped"][service].get(key) for r in result["rounds"]]
    if None in values:
        return []
    return [b - a for a, b in zip(values, values[1:])]


def _fmt(value) -> str:
    return "-" if value is None else str(value)


def lines(result: dict) -> list[str]:
    """The hygiene numbers as a short table."""
    s = result["sessions"]
    complete = s.get("complete", {"n": 0, "ok": 0})
    half = ", ".join(f"{k} {v['ok']}/{v['n']}" for k, v in s.get("halfway", {}).items())
    out = [f"sessions: {complete['ok']}/{complete['n']} complete ok; half-way as meant: {half}",
           "reaped in " + ", ".join(f"{r['reap_s']:g} s" for r in result["rounds"])
           + " after the clients (timeouts: " + ", ".join(
               f"{k} {v:g}" for k, v in result["timeouts"].items()) + ")",
           f"{'service':<12} {'metric':<22} {'before':>9} {'after':>9} {'reaped':>9} {'delta':>7}"]
    for name, svc in result["services"].items():
        for key in svc["reaped"]:
            d = svc["delta"].get(key)
            out.append(f"{name:<12} {key:<22} {_fmt(svc['before'].get(key)):>9} "
                       f"{_fmt(svc['after'].get(key)):>9} {_fmt(svc['reaped'].get(key)):>9} "
                       f"{'-' if d is None else f'{d:+d}':>7}")
    for key in MEMORY:
        growth = {name: round_growth(result, name, key) for name in result["services"]}
        if any(growth.values()):
            out.append(f"{key} growth per round after the first: " + "; ".join(
                f"{name} {' / '.join(map(str, g))}" for name, g in growth.items() if g))
    out.append("violations: " + ("none" if not result["violations"] else ""))
    out += [f"  {v}" for v in result["violations"]]
    return out
