"""Signaling abuse: hostile HTTP against a live front, with real calls through it meanwhile.

The edge of ``voiceedge demo edge`` (Redis, relay, transceiver, agent) in a lab namespace, and
a signaling front in front of it started with the configured limits. After a warm-up, the
front's file descriptors, tasks and memory are the baseline; then, all at once:

- ``oversized``: bodies over the cap, declared (``Content-Length``), chunked, or a lying
  ``Content-Length``: 413.
- ``content_type``: anything but ``application/sdp``, or none: 415.
- ``pathological_sdp``: 5,000 candidates, 500 m-lines, a 100 KiB attribute, binary garbage,
  NUL bytes, 20,000 lines, invalid UTF-8, no audio...: 400, or 413 where the case is bigger
  than the body cap (5,000 candidates and a 100 KiB attribute cannot fit in 64 KiB).
- ``slow_upload``: headers, then the body a byte every ``byte_interval_s``: 408 within the
  front's read timeout (+ ``answer_slack_s``).
- ``slow_headers``: the request itself a byte at a time: closed within the front's idle
  timeout (+ ``answer_slack_s``).
- ``junk_burst``: ``junk_posts`` concurrent requests, each on its own connection: junk
  bodies through aiohttp's client, and raw junk (not HTTP, header bombs, a line over aiohttp's
  cap, a request abandoned half sent): a 4xx, or closed, or (counted) a timeout; never a 5xx.
- ``unauthenticated``: well-formed offers ``POST``ed with no credential, a malformed one, a
  forged key, a forged token and an expired token, and the same asking for ICE servers
  (``GET /v1/ice-servers``, the front hands out TURN credentials) and tokens: 401 each.
- ``token_replay``: a call token limited to one call, used for its call, then replayed: 403.
- ``cross_key``: another key's call ``DELETE``d with a second key, its token, and another token
  of the call's own key: 403 each; its own token then ends it (204).
- ``real_calls``: aiortc clients (services/client) calling through the front as the burst
  starts, with a token of their own key: each must succeed.

The front checks API keys (two: the real calls' and the abuser's; docs/auth.md), so the abuse
of the body's limits above carries a valid token of the abuser's key: the front checks the
credential before it reads a byte of a body. Over the run: calls created only for the real
calls and the one call a round the ownership cases need (so the agent's sessions too), no
token minted and no TURN credential issued.

The warm-up before the baseline is the same abuse (every kind, one call), so that first uses
(code paths, metric labels, caches, the allocators' high-water marks) are paid before it; the
abuse then runs ``rounds`` times. After each round, once the front's descriptors are back
(within ``fd_slack`` of the baseline) and its asyncio tasks too (to their count before any
abuse), the front says what its memory is after a full garbage collection and malloc_trim
(``/metrics?gc=1&trim=1``, services/introspect.py). A leak grows memory in every round, so the
smallest growth of a round must stay within a slack: the heap malloc has handed out
(``heap_slack_kib``: native memory, and Python's objects over 512 bytes), Python's blocks
(``blocks_slack``), RSS once malloc has given its free memory back (``rss_slack_mib``: what is
left of RSS noise is Python's own allocator keeping 1 MiB arenas that a few live objects pin,
now and then a few MiB in one round). RSS as the allocators keep it, and the heap's free
memory, are reported, not bounded: glibc keeps several MiB that a burst freed, more or less
from one round to the next, which is not a leak. ``violations`` lists what did not hold.
Everything started is stopped, the namespace removed.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.hostile.hygiene import memory_figures
from scenarios.credentials import PrivateFiles
from scenarios.demo_edge import demo_plan
from scenarios.edge import Edge
from scenarios.processes import http_ok, voiceedge_cmd
from services import procfs
from services.client.config import ClientConfig
from services.client.credential import bearer
from services.client.runner import run_sessions
from services.signaling.auth import ApiKey, Caller, KeyRing
from services.turn.credentials import new_secret
from services.transceiver.ice import SHARED
from topology.netns import in_namespace, lab_namespace
from voiceedge.reaper import temp_dir

MEMORY = ("heap_kib", "heap_free_kib", "py_blocks", "rss_trimmed_kib", "rss_kib")
KINDS = ("oversized", "content_type", "pathological_sdp", "slow_upload", "slow_headers",
         "junk_burst", "unauthenticated", "token_replay", "cross_key")
ENDED = ("closed", "reset")  # the connection ended without an answer (raw junk, slow headers)


@dataclass(frozen=True)
class SignalingAbuseConfig:
    junk_posts: int = 1000          # the concurrent burst (warm-up: the same again, before)
    slow_uploads: int = 20          # concurrent clients, body a byte at a time
    slow_headers: int = 20          # concurrent clients, headers a byte at a time
    byte_interval_s: float = 1.0    # one byte a second
    repeats: int = 3                # each oversized / content-type / pathological case
    real_calls: int = 3
    unauthenticated: int = 300      # requests without a valid credential a round
    replays: int = 20               # a used-up token's call, replayed
    call_duration_s: float = 3.0
    answer_timeout_s: float = 15.0  # no answer by then: a timeout
    answer_slack_s: float = 1.5     # slow clients: ended within the front's timeout + this
    # the front's limits (voiceedge signaling flags); the body cap stays its default, 64 KiB
    read_timeout_s: float = 5.0
    idle_timeout_s: float = 5.0
    fd_slack: int = 5               # descriptors above the baseline once connections closed
    heap_slack_kib: int = 128       # growth allowed after the warm-up: malloc's heap in use,
    blocks_slack: int = 200         # Python's blocks (both after a collection)
    rss_slack_mib: float = 4.0      # and RSS after malloc_trim, in one round at least
    rounds: int = 2                 # the abuse, measured, after the warm-up
    settle_s: float = 8.0           # how long to wait for descriptors, and tasks, to come back
    seed: int = 1
    workdir: Path | None = None

    @classmethod
    def quick(cls) -> "SignalingAbuseConfig":
        """The same burst, shorter slow clients and calls: for tests."""
        return cls(slow_uploads=4, slow_headers=4, byte_interval_s=0.25, repeats=1,
                   real_calls=1, call_duration_s=1.0, read_timeout_s=1.5, idle_timeout_s=1.5,
                   answer_slack_s=2.0, answer_timeout_s=10.0, settle_s=5.0)

    def front_args(self) -> list[str]:
        return ["--read-timeout", f"{self.read_timeout_s:g}",
                "--idle-timeout", f"{self.idle_timeout_s:g}"]


@dataclass(frozen=True)
class Answer:
    """What one hostile request got: an HTTP status ("413"), ``closed`` / ``reset`` (the
    connection ended without an answer), ``timeout``, ``abandoned`` (the client left first)
    or ``error:<what>`` (e.g. the connection was refused)."""

    kind: str
    case: str
    outcome: str
    seconds: float
    ok: bool


# ------------------------------------------------------------ offers

def _sdp(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n").encode()


_HEAD = ("v=0", "o=- 1 1 IN IP4 0.0.0.0", "s=-", "t=0 0", "a=group:BUNDLE 0")
_AUDIO = ("m=audio 9 UDP/TLS/RTP/SAVPF 111", "c=IN IP4 0.0.0.0", "a=sendrecv", "a=mid:0",
          "a=rtcp-mux", "a=rtpmap:111 opus/48000/2", "a=ice-ufrag:abcd",
          "a=ice-pwd:" + "p" * 24, "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
          "a=setup:actpass")
OFFER = _sdp(*_HEAD, *_AUDIO)  # well formed: what a front would forward


def pathological_offers(rng: random.Random) -> list[tuple[str, bytes, int]]:
    """(case, body, status the default limits give it)."""
    cand = "a=candidate:{0} 1 udp 2130706431 10.{1}.{2}.{3} {4} typ host"
    short = "a=candidate:0 1 udp 1 10.0.0.1 1 typ host"
    return [
        ("5,000 candidates", _sdp(*_HEAD, *_AUDIO, *(
            cand.format(i, i >> 16 & 255, i >> 8 & 255, i & 255, 1024 + i) for i in range(5000))),
         413),
        ("500 m-lines", _sdp(*_HEAD, *(f"m=audio 9 RTP/AVP 0\r\na=mid:{i}" for i in range(500))),
         400),
        ("100 KiB attribute", _sdp(*_HEAD, *_AUDIO, "a=x-huge:" + "y" * 100 * 1024), 413),
        ("1,000 candidates (under the cap)", _sdp(*_HEAD, *_AUDIO, *[short] * 1000), 400),
        ("8 KiB attribute", _sdp(*_HEAD, *_AUDIO, "a=fmtp:111 " + "z" * 8192), 400),
        ("20,000 lines", _sdp(*_HEAD, *_AUDIO) + b"a=\n" * 20_000, 400),
        ("64 KiB binary garbage", rng.randbytes(64 * 1024), 400),
        ("NUL bytes", OFFER.replace(b"s=-", b"s=\x00\x00\x00"), 400),
        ("invalid UTF-8", OFFER.replace(b"s=-", b"s=\xff\xfe\xfd"), 400),
        ("no audio", _sdp(*_HEAD, "m=video 9 RTP/AVP 96", "a=mid:0"), 400),
        ("not SDP", b"hello, edge", 400),
        ("empty", b"", 400),
    ]


# ------------------------------------------------------------ requests

async def post(http: aiohttp.ClientSession, url: str, body, content_type: str | None,
               timeout_s: float, headers: dict[str, str] | None = None,
               method: str = "POST") -> tuple[str, float]:
    """POST (or ``method``) through aiohttp's client: (outcome, seconds)."""
    headers = {**(headers or {}),
               **({} if content_type is None else {"Content-Type": content_type})}
    started = time.monotonic()
    try:
        async with http.request(method, url, data=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            await r.read()
            outcome = str(r.status)
    except asyncio.TimeoutError:
        outcome = "timeout"
    except aiohttp.ServerDisconnectedError:
        outcome = "closed"
    except (aiohttp.ClientOSError, ConnectionError) as exc:
        outcome = "reset" if isinstance(getattr(exc, "os_error", exc), ConnectionResetError) \
            else f"error:{type(exc).__name__}"
    except aiohttp.ClientError as exc:
        outcome = f"error:{type(exc).__name__}"
    return outcome, time.monotonic() - started


async def raw(host: str, port: int, chunks: list[bytes], timeout_s: float,
              interval_s: float = 0.0, abandon: bool = False) -> tuple[str, float]:
    """Write ``chunks`` on a fresh TCP connection, ``interval_s`` apart, while reading the
    answer's status line: (outcome, seconds). ``abandon``: close right after writing."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, asyncio.TimeoutError) as exc:
        return f"error:{type(exc).__name__}", time.monotonic() - started

    async def send() -> None:
        for i, chunk in enumerate(chunks):
            if i and interval_s:
                await asyncio.sleep(interval_s)
            writer.write(chunk)
            await writer.drain()

    async def status() -> str:
        line = await reader.readline()
        if not line:
            return "closed"
        parts = line.split()
        return parts[1].decode(errors="replace") if len(parts) > 1 else "garbled"

    sending = asyncio.create_task(send())
    try:
        if abandon:
            await asyncio.wait_for(sending, timeout_s)
            return "abandoned", time.monotonic() - started
        reading = asyncio.create_task(status())
        try:
            done, _ = await asyncio.wait({reading}, timeout=timeout_s)
            if not done:
                reading.cancel()
                return "timeout", time.monotonic() - started
            return reading.result(), time.monotonic() - started
        except ConnectionResetError:
            return "reset", time.monotonic() - started
    except (ConnectionError, asyncio.TimeoutError):
        return "reset", time.monotonic() - started
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        writer.close()


def _request(body_length: int | str, content_type: str = "application/sdp",
             extra: str = "", auth: str = "") -> bytes:
    """A raw POST's head; ``auth``: its Authorization value (the front checks the credential
    before it reads a byte of the body: the body's own checks need a valid one)."""
    auth_line = f"Authorization: {auth}\r\n" if auth else ""
    return (f"POST /v1/calls HTTP/1.1\r\nHost: edge\r\nContent-Type: {content_type}\r\n"
            f"{auth_line}Content-Length: {body_length}\r\n{extra}\r\n").encode()


# ------------------------------------------------------------ the abuse

@dataclass(frozen=True)
class Front:
    """Where the front listens and how long a slow client may last there."""

    host: str
    port: int
    read_timeout_s: float
    idle_timeout_s: float
    auth: str = ""   # the Authorization value the body-checking abuse carries (a valid one)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1/calls"

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": self.auth} if self.auth else {}


def _status_ok(outcome: str, want: int | None = None) -> bool:
    if want is not None:
        return outcome == str(want)
    return outcome.isdigit() and 400 <= int(outcome) < 500


async def fixed_cases(front: Front, cfg: SignalingAbuseConfig,
                      http: aiohttp.ClientSession) -> list[Answer]:
    """The oversized, content-type and pathological cases, ``cfg.repeats`` times each."""
    rng = random.Random(cfg.seed)
    big = b"a=" + b"x" * (1 << 20)

    async def chunked():
        for _ in range(50):
            yield b"a=" + b"c" * 4094

    auth = front.headers
    cases = [("oversized", "1 MiB", lambda: post(http, front.url, big, "application/sdp",
                                                  cfg.answer_timeout_s, auth), 413),
             ("oversized", "100 KiB", lambda: post(http, front.url, big[:100 * 1024],
                                                   "application/sdp", cfg.answer_timeout_s,
                                                   auth), 413),
             ("oversized", "chunked 200 KiB", lambda: post(http, front.url, chunked(),
                                                           "application/sdp",
                                                           cfg.answer_timeout_s, auth), 413),
             ("oversized", "Content-Length 1 TB", lambda: raw(
                 front.host, front.port, [_request(10 ** 12, auth=front.auth), OFFER],
                 cfg.answer_timeout_s), 413)]
    for ctype in ("text/plain", "application/json", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x", "application/sdpx", None):
        cases.append(("content_type", ctype or "none",
                      lambda c=ctype: post(http, front.url, OFFER, c, cfg.answer_timeout_s,
                                           auth), 415))
    for name, body, want in pathological_offers(rng):
        cases.append(("pathological_sdp", name,
                      lambda b=body: post(http, front.url, b, "application/sdp",
                                          cfg.answer_timeout_s, auth), want))
    cases = cases * cfg.repeats
    got = await asyncio.gather(*(send() for _, _, send, _ in cases))
    return [Answer(kind, name, outcome, s, _status_ok(outcome, want))
            for (kind, name, _, want), (outcome, s) in zip(cases, got)]


async def slow_clients(front: Front, cfg: SignalingAbuseConfig) -> list[Answer]:
    """Bodies and headers a byte every ``cfg.byte_interval_s``: 408 / closed in time."""
    body_bytes = [bytes([b]) for b in OFFER]
    head = _request(len(OFFER), auth=front.auth)
    upload = [head] + body_bytes
    headers = [bytes([b]) for b in head] + body_bytes
    limit_upload = front.read_timeout_s + cfg.answer_slack_s
    limit_headers = front.idle_timeout_s + cfg.answer_slack_s
    jobs = ([("slow_upload", upload, limit_upload)] * cfg.slow_uploads
            + [("slow_headers", headers, limit_headers)] * cfg.slow_headers)
    got = await asyncio.gather(*(raw(front.host, front.port, chunks, cfg.answer_timeout_s,
                                     cfg.byte_interval_s) for _, chunks, _ in jobs))
    out = []
    for (kind, _, limit), (outcome, s) in zip(jobs, got):
        ended = outcome == "408" if kind == "slow_upload" else outcome in ENDED
        out.append(Answer(kind, "a byte every %gs" % cfg.byte_interval_s, outcome, s,
                          ended and s <= limit))
    return out


def _junk(i: int, rng: random.Random, auth: str = "") -> tuple[str, str, object]:
    """The burst's request ``i``: (case, "http" | "raw" | "abandon", what to send), with
    ``auth`` as its Authorization value."""
    pick = i % 10
    if pick == 0:
        return "random bytes as SDP", "http", (rng.randbytes(rng.randrange(0, 4096)),
                                               "application/sdp")
    if pick == 1:
        cut = OFFER[:rng.randrange(1, OFFER.index(b"a=fingerprint"))]
        return "truncated offer", "http", (cut, "application/sdp")
    if pick == 2:
        return "SDP as text/plain", "http", (OFFER, "text/plain")
    if pick == 3:
        return "70 KiB body", "http", (b"v=0\r\n" + b"a" * 70 * 1024, "application/sdp")
    if pick == 4:
        return "too many candidates", "http", (
            OFFER + b"a=candidate:0 1 udp 1 10.0.0.1 1 typ host\r\n" * 100, "application/sdp")
    if pick == 5:
        return "not HTTP", "raw", [rng.randbytes(rng.randrange(1, 2048))]
    if pick == 6:
        return "200 headers", "raw", [_request(len(_JUNK_SDP), auth=auth, extra="".join(
            f"X-Junk-{k}: {k}\r\n" for k in range(200))), _JUNK_SDP]
    if pick == 7:
        return "16 KiB header line", "raw", [_request(0, auth=auth,
                                                       extra=f"X-Long: {'L' * 16384}\r\n")]
    if pick == 8:
        return "bad Content-Length", "raw", [_request("-5", auth=auth), _JUNK_SDP]
    return "abandoned half way", "abandon", [_request(len(OFFER), auth=auth),
                                             OFFER[:len(OFFER) // 2]]


# Junk never carries a whole well-formed offer: that would be a call (the transceiver's
# capacity is a matter for rate limits, not for these checks).
_JUNK_SDP = _sdp(*_HEAD, "m=audio 9 UDP/TLS/RTP/SAVPF 111")


async def junk_burst(front: Front, n: int, cfg: SignalingAbuseConfig,
                     seed: int) -> list[Answer]:
    """``n`` junk requests at once, each on its own connection."""
    rng = random.Random(seed)
    jobs = [_junk(i, rng, front.auth) for i in range(n)]
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        async def one(how, what):
            if how == "http":
                return await post(http, front.url, what[0], what[1], cfg.answer_timeout_s,
                                  front.headers)
            return await raw(front.host, front.port, what, cfg.answer_timeout_s,
                             abandon=how == "abandon")
        got = await asyncio.gather(*(one(how, what) for _, how, what in jobs))
    return [Answer("junk_burst", case, outcome, s,
                   _status_ok(outcome) or outcome in ("timeout", "abandoned", *ENDED))
            for (case, _, _), (outcome, s) in zip(jobs, got)]


def unauthenticated_credentials(ring: KeyRing, key: ApiKey) -> list[tuple[str, dict]]:
    """(case, headers) of requests no front may serve: no credential, a malformed one, the
    key's id with another secret, a token whose payload was changed after signing, an expired
    token (minted two hours ago for ten minutes)."""
    token = ring.mint(Caller(key.id), 600).value
    payload, mac = token[len("vet_"):].split(".")
    forged = "vet_" + payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB") + "." + mac
    expired = ring.mint(Caller(key.id), 600, now=time.time() - 7200).value
    return [("no credential", {}), ("Basic scheme", {"Authorization": "Basic dXNlcjpwdw=="}),
            ("random bearer", bearer("x" * 40)),
            ("forged key", bearer(ApiKey(key.id, bytes(32)).text)),
            ("forged token", bearer(forged)), ("expired token", bearer(expired))]


async def unauthenticated(front: Front, n: int, credentials: list[tuple[str, dict]],
                          cfg: SignalingAbuseConfig) -> list[Answer]:
    """``n`` requests at once without a valid credential: offers, ICE servers, tokens."""
    routes = [("POST", front.url, OFFER, "application/sdp"),
              ("GET", f"{front.base}/v1/ice-servers", None, None),
              ("POST", f"{front.base}/v1/client_secrets", b"{}", "application/json")]
    jobs = [(credentials[i % len(credentials)], routes[i // len(credentials) % len(routes)])
            for i in range(n)]
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        got = await asyncio.gather(*(post(http, url, body, ctype, cfg.answer_timeout_s,
                                          headers, method)
                                     for (_, headers), (method, url, body, ctype) in jobs))
    return [Answer("unauthenticated", f"{case}: {method} {urlsplit(url).path}", outcome, s,
                   outcome == "401")
            for ((case, _), (method, url, _, _)), (outcome, s) in zip(jobs, got)]


@dataclass(frozen=True)
class OwnedCall:
    """A call the ownership cases are about: placed by ``token`` (one call allowed) of the
    real calls' key, at ``location``."""

    token: str
    location: str


async def place_owned_call(front: Front, ring: KeyRing, key: ApiKey,
                           cfg: SignalingAbuseConfig) -> OwnedCall | str:
    """The call, or why it could not be placed."""
    token = ring.mint(Caller(key.id), 600, max_calls=1).value
    async with aiohttp.ClientSession() as http:
        async with http.post(front.url, data=OFFER,
                             headers={"Content-Type": "application/sdp", **bearer(token)},
                             timeout=aiohttp.ClientTimeout(total=cfg.answer_timeout_s)) as r:
            await r.read()
            location = r.headers.get("Location")
            if r.status != 201 or not location:
                return f"HTTP {r.status}"
    return OwnedCall(token, f"{front.base}{location}")


async def ownership_cases(front: Front, call: OwnedCall, ring: KeyRing, owner: ApiKey,
                          other: ApiKey, cfg: SignalingAbuseConfig) -> list[Answer]:
    """The used-up token replayed (403 each), the call ``DELETE``d by anyone but its creator
    (403 each), at once."""
    replay = [("token_replay", "its one call used", "POST", front.url, OFFER,
               "application/sdp", bearer(call.token), "403")] * cfg.replays
    strangers = [("another key", other.text),
                 ("another key's token", ring.mint(Caller(other.id), 600).value),
                 ("another token of the call's key", ring.mint(Caller(owner.id), 600).value)]
    deletes = [("cross_key", case, "DELETE", call.location, None, None, bearer(credential),
                "403") for case, credential in strangers]
    jobs = replay + deletes
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        got = await asyncio.gather(*(post(http, url, body, ctype, cfg.answer_timeout_s,
                                          headers, method)
                                     for _, _, method, url, body, ctype, headers, _ in jobs))
    return [Answer(kind, case, outcome, s, outcome == want)
            for (kind, case, *_, want), (outcome, s) in zip(jobs, got)]


async def end_owned_call(call: OwnedCall, cfg: SignalingAbuseConfig) -> Answer:
    """Its creator ends it: 204 says the refused DELETEs left it alone."""
    async with aiohttp.ClientSession() as http:
        outcome, s = await post(http, call.location, None, None, cfg.answer_timeout_s,
                                bearer(call.token), "DELETE")
    return Answer("cross_key", "its creator's token, after", outcome, s, outcome == "204")


async def real_calls(front: Front, cfg: SignalingAbuseConfig,
                     credential: str | None = None) -> list:
    client = ClientConfig(url=front.url, duration_s=cfg.call_duration_s, start_rate=5.0,
                          full_sessions=0, signaling_timeout_s=cfg.answer_timeout_s,
                          setup_timeout_s=cfg.answer_timeout_s, reconnect_attempts=0,
                          headers=bearer(credential))
    return await run_sessions(client, cfg.real_calls)


# ------------------------------------------------------------ the front, measured

@dataclass(frozen=True)
class Usage:
    """The front's descriptors and RSS (as the allocators keep it), from /proc."""

    fds: int
    rss_kib: int


def usage(pid: int) -> Usage:
    return Usage(procfs.open_fds(pid), procfs.kib(procfs.status_fields(pid), "VmRSS") or 0)


async def _samples(scrape: "Scrape", query: str = "") -> list:
    """The samples of the front's ``/metrics``."""
    async with aiohttp.ClientSession() as http:
        async with http.get(scrape.url + query, headers=scrape.headers) as r:
            text = await r.text()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


async def memory(url: "Scrape") -> dict[str, int | None]:
    """The front's own memory figures (hygiene.memory_figures) from its ``/metrics`` at
    ``url``, after a full garbage collection and malloc_trim (read after ``usage``: trimming
    lowers RSS)."""
    prefix = "voiceedge_signaling_process_"
    process = {s.name[len(prefix):]: int(s.value) for s in await _samples(url, "?gc=1&trim=1")
               if s.name.startswith(prefix)}
    return memory_figures(process, trimmed=True)


async def steady(pid: int, within_s: float, floor: int = 0, still_s: float = 1.0) -> Usage:
    """The front's usage once its descriptor count is down to ``floor`` or has not changed
    for ``still_s`` (or ``within_s`` passed): the connections of what came before are gone."""
    deadline = time.monotonic() + within_s
    last, since = usage(pid), time.monotonic()
    while time.monotonic() < deadline and last.fds > floor:
        await asyncio.sleep(0.1)
        now = usage(pid)
        if now.fds != last.fds:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still_s:
            break
    return usage(pid)


async def quiet(url: "Scrape", tasks: int, within_s: float) -> int:
    """Wait until the front (``/metrics`` at ``url``) runs no more than ``tasks`` asyncio
    tasks, at most ``within_s``: a request's handler can outlive its connection by a second or
    two (aiohttp's lingering close), holding its objects. The count then."""
    deadline = time.monotonic() + within_s
    while (now := await _gauge(url, "process_asyncio_tasks")) > tasks and \
            time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return now


async def _gauge(url: "Scrape", name: str) -> int:
    return sum(int(s.value) for s in await _samples(url)
               if s.name == f"voiceedge_signaling_{name}")


async def metrics(url: "Scrape") -> dict[tuple[str, str], float]:
    """The front's refusals: {("status", "413"): n, ("reason", "too_large"): n, ...}, and
    what it gave: calls created, tokens minted, TURN credentials issued."""
    out = {}
    for s in await _samples(url):
        if s.name in ("voiceedge_signaling_tokens_minted_total",
                      "voiceedge_signaling_turn_credentials_issued_total"):
            out[(s.name[len("voiceedge_signaling_"):-len("_total")], "")] = s.value
        if s.name == "voiceedge_signaling_calls_refused_total":
            out[("status", s.labels["status"])] = s.value
        elif s.name == "voiceedge_signaling_offers_rejected_total":
            out[("reason", s.labels["reason"])] = s.value
        elif s.name == "voiceedge_signaling_calls_created_total":
            out[("created", "")] = s.value
    return out


@dataclass(frozen=True)
class Scrape:
    """The front's ``/metrics`` and the header that reads it (an API key)."""

    url: str
    headers: dict[str, str]


class AbuseEdge:
    """``with AbuseEdge(ns, workdir, cfg) as edge``: the demo's edge without its front, and a
    front of its own with ``cfg``'s limits, two API keys (``owner``: the real calls', and
    ``abuser``'s) and TURN credentials to hand out, in lab namespace ``ns`` (a
    LabNamespace). The keys and the TURN secret live in a private folder, gone at exit."""

    def __init__(self, ns, workdir: Path, cfg: SignalingAbuseConfig) -> None:
        plan = replace(demo_plan(SHARED, ns.name, *ns.addresses), fronts=())
        self.edge = Edge(plan, workdir)
        self.cfg = cfg
        self.agent_health = f"http://127.0.0.1:{plan.ports.agent}/healthz"
        cluster = plan.clusters[0]
        self.owner, self.abuser = ApiKey.new("app-a"), ApiKey.new("app-b")
        self.ring = KeyRing([self.owner, self.abuser])
        self._secrets = PrivateFiles()
        keys = self._secrets.write("api-keys", f"{self.owner.text}\n{self.abuser.text}")
        turn = self._secrets.write("turn-secret", new_secret())
        self.front = Front("127.0.0.1", plan.ports.signaling, cfg.read_timeout_s,
                           cfg.idle_timeout_s,
                           auth=f"Bearer {self.ring.mint(Caller(self.abuser.id), 3600).value}")
        self._cmd = voiceedge_cmd(
            "signaling", "--listen", f"{self.front.host}:{self.front.port}",
            "--transceiver", self.edge.control_url(cluster), "--advertise",
            plan.advertise(cluster), "--region", "abuse", "--api-keys", str(keys),
            "--turn-url", "turn:127.0.0.1:3478", "--turn-secret-file", str(turn),
            *cfg.front_args())
        self._host = cluster.host

    def __enter__(self) -> "AbuseEdge":
        try:
            self.edge.start()
            health = f"http://{self.front.host}:{self.front.port}/healthz"
            self.edge.add("front-abuse", self._host, self._cmd, "signaling",
                          lambda: http_ok(health))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.edge.stop()
        self._secrets.close()

    @property
    def pid(self) -> int:
        return self.edge.services["front-abuse"].process.pid

    @property
    def log_path(self) -> Path:
        return self.edge.logs / "front-abuse.log"

    @property
    def metrics_url(self) -> Scrape:
        return Scrape(f"http://{self.front.host}:{self.front.port}/metrics",
                      bearer(self.owner.text))


# ------------------------------------------------------------ the run

def run(config: SignalingAbuseConfig = SignalingAbuseConfig(), say=lambda msg: None) -> dict:
    """Start it all, abuse the front, stop it all: a JSON-ready dict (module docstring)."""
    workdir = config.workdir or temp_dir("voiceedge-sigabuse-")
    workdir.mkdir(parents=True, exist_ok=True)
    with lab_namespace("vesig") as ns:
        say(f"starting the edge and a front in {workdir}")
        with AbuseEdge(ns, workdir, config) as edge:
            result = in_namespace(ns.name, asyncio.run, abuse(edge, config, say))
        result["processes_left"] = [name for name, s in edge.edge.services.items()
                                    if s.process.alive()]
    if result["processes_left"]:
        result["violations"].append(f"still running after stop: {result['processes_left']}")
    result["logs"] = str(workdir)
    return result


async def abuse(edge: AbuseEdge, cfg: SignalingAbuseConfig, say=lambda msg: None) -> dict:
    """Everything of ``run`` against a started ``edge``; runs inside its namespace."""
    front, pid = edge.front, edge.pid
    idle_tasks = await _gauge(edge.metrics_url, "process_asyncio_tasks")
    say("warm-up: the same abuse and a call")
    await all_at_once(edge, replace(cfg, real_calls=1), cfg.seed)
    points = [await settle(edge, cfg, idle_tasks)]
    before_metrics = await metrics(edge.metrics_url)
    agent_before = await _agent_sessions(edge)
    log_lines = _lines_of(edge.log_path)
    say(f"front: {points[0]['fds']} fds, {points[0]['rss_kib'] / 1024:.1f} MiB; the abuse, "
        f"{cfg.rounds} times: {cfg.junk_posts} junk at once, {cfg.slow_uploads} + "
        f"{cfg.slow_headers} slow clients, oversized / content type / pathological offers, "
        f"{cfg.real_calls} real calls")
    peak = [points[0]["fds"]]

    async def watch() -> None:
        while True:
            peak[0] = max(peak[0], usage(pid).fds)
            await asyncio.sleep(0.05)

    answers, sessions = [], []
    for i in range(cfg.rounds):
        watcher = asyncio.create_task(watch())
        try:
            got, calls = await all_at_once(edge, cfg, cfg.seed + 1 + i)
        finally:
            watcher.cancel()
        answers, sessions = answers + got, sessions + calls
        points.append(await settle(edge, cfg, idle_tasks, points[0]["fds"]))
    after_metrics = await metrics(edge.metrics_url)
    delta = {name: int(after_metrics.get((key, ""), 0) - before_metrics.get((key, ""), 0))
             for name, key in (("calls_created", "created"), ("tokens_minted", "tokens_minted"),
                               ("turn_credentials_issued", "turn_credentials_issued"))}
    given = {"agent_sessions": await _agent_sessions(edge) - agent_before, **delta,
             "legitimate_calls": len(sessions) + cfg.rounds}   # + the owned call a round
    return summarise(cfg, answers, sessions, points, peak[0], idle_tasks,
                     {k: int(v - before_metrics.get(k, 0)) for k, v in after_metrics.items()
                      if v - before_metrics.get(k, 0) and k[0] in ("status", "reason")},
                     _lines_of(edge.log_path) - log_lines, given)


async def _agent_sessions(edge: AbuseEdge) -> int:
    """The agent's sessions so far: one for every call a transceiver took."""
    async with aiohttp.ClientSession() as http:
        async with http.get(edge.agent_health) as r:
            return int((await r.json())["sessions_total"])


async def settle(edge: AbuseEdge, cfg: SignalingAbuseConfig, idle_tasks: int,
                 fds: int = 0) -> dict[str, int | None]:
    """The front once what came before is gone (``steady``, ``quiet``): its fds, RSS, asyncio
    tasks and ``memory``."""
    now = await steady(edge.pid, cfg.settle_s, floor=fds)
    tasks = await quiet(edge.metrics_url, idle_tasks, cfg.settle_s)
    return {"fds": now.fds, "rss_kib": now.rss_kib, "tasks": tasks,
            **await memory(edge.metrics_url)}


async def all_at_once(edge: AbuseEdge, cfg: SignalingAbuseConfig,
                      seed: int) -> tuple[list, list]:
    """Every kind of abuse and ``cfg.real_calls`` calls at the same time: (answers, the calls'
    results). The ownership cases' call is placed first, and ended by its creator after."""
    front, ring = edge.front, edge.ring
    owned = await place_owned_call(front, ring, edge.owner, cfg)
    answers = []
    if isinstance(owned, str):
        answers.append(Answer("cross_key", "the call to own", owned, 0.0, False))
    strangers = unauthenticated_credentials(ring, edge.owner)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))
    try:
        slow = asyncio.create_task(slow_clients(front, cfg))
        calls = asyncio.create_task(real_calls(
            front, cfg, ring.mint(Caller(edge.owner.id), 3600).value))
        burst, fixed, denied, owners = await asyncio.gather(
            junk_burst(front, cfg.junk_posts, cfg, seed), fixed_cases(front, cfg, http),
            unauthenticated(front, cfg.unauthenticated, strangers, cfg),
            ownership_cases(front, owned, ring, edge.owner, edge.abuser, cfg)
            if not isinstance(owned, str) else asyncio.sleep(0, []))
        answers += burst + fixed + denied + owners + await slow
        if not isinstance(owned, str):
            answers.append(await end_owned_call(owned, cfg))
        return answers, await calls
    finally:
        await http.close()


def _lines_of(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def summarise(cfg: SignalingAbuseConfig, answers: list[Answer], sessions: list,
              points: list[dict], peak_fds: int, idle_tasks: int, refusals: dict,
              log_lines: int, given: dict | None = None) -> dict:
    """The result of ``run``; ``points`` are the front after the warm-up and after each round
    (``settle``), ``idle_tasks`` its asyncio tasks before any abuse, ``given`` what the front
    and the agent gave over the rounds (calls, agent sessions, tokens, TURN credentials)
    against the legitimate calls."""
    kinds = {}
    violations = []
    for kind in KINDS:
        mine = [a for a in answers if a.kind == kind]
        if not mine:
            continue
        kinds[kind] = {"requests": len(mine),
                       "outcomes": dict(sorted(Counter(a.outcome for a in mine).items())),
                       "timeouts": sum(a.outcome == "timeout" for a in mine),
                       "max_answer_s": round(max(a.seconds for a in mine), 3)}
        bad = Counter(f"{a.case}: {a.outcome} after {a.seconds:.1f} s"
                      for a in mine if not a.ok)
        for what, n in sorted(bad.items()):
            violations.append(f"{kind}: {what}" + (f" (x{n})" if n > 1 else ""))
    given = given or {}
    legit = given.get("legitimate_calls")
    for name in ("calls_created", "agent_sessions"):
        if legit is not None and given.get(name) != legit:
            violations.append(f"{name}: {given.get(name)}, not the {legit} legitimate calls")
    for name in ("tokens_minted", "turn_credentials_issued"):
        if given.get(name):
            violations.append(f"{name}: {given[name]} without a valid credential")
    fivexx = sum(1 for a in answers if a.outcome.startswith("5"))
    if fivexx:
        violations.append(f"{fivexx} requests answered 5xx")
    ok = [s for s in sessions if s.ok]
    if len(ok) < len(sessions):
        violations.append(f"real calls: {len(sessions) - len(ok)} of {len(sessions)} failed: "
                          + "; ".join(sorted({s.error or "?" for s in sessions if not s.ok})))
    baseline = points[0]
    for i, now in enumerate(points[1:], 1):
        if now["fds"] > baseline["fds"] + cfg.fd_slack:
            violations.append(f"round {i}: front fds {baseline['fds']} -> {now['fds']} (more "
                              f"than +{cfg.fd_slack})")
        if now["tasks"] > idle_tasks:
            violations.append(f"round {i}: front asyncio tasks {idle_tasks} when idle, still "
                              f"{now['tasks']} {cfg.settle_s:g} s after the abuse")
    growth = {key: [None if None in (a[key], b[key]) else b[key] - a[key]
                    for a, b in zip(points, points[1:])] for key in MEMORY}
    for key, slack in (("heap_kib", cfg.heap_slack_kib), ("py_blocks", cfg.blocks_slack),
                       ("rss_trimmed_kib", cfg.rss_slack_mib * 1024)):
        if None in growth[key]:
            violations.append(f"front {key}: not reported")
        elif min(growth[key]) > slack:
            violations.append(f"front {key} grew in every round: "
                              f"{' / '.join(map(str, growth[key]))} (more than +{slack:g})")
    front = {"fds_before": baseline["fds"], "fds_peak": peak_fds,
             "fds_after": points[-1]["fds"], "tasks_idle": idle_tasks,
             "tasks_after": max(p["tasks"] for p in points[1:]),
             "rss_mib_before": round(baseline["rss_kib"] / 1024, 1),
             "rss_mib_after": round(points[-1]["rss_kib"] / 1024, 1),
             "memory": points, "growth": growth}
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "kinds": kinds,
        "front": {**front, "log_lines_during": log_lines},
        "refusals": {f"{a}={b}" if b else a: n for (a, b), n in sorted(refusals.items())},
        "given": given,
        "real_calls": {"attempted": len(sessions), "succeeded": len(ok),
                       "setup_ms": [round(s.setup_ms, 1) for s in ok if s.setup_ms]},
        "violations": violations,
    }


def _signed(value: int | None) -> str:
    return "-" if value is None else f"{value:+d}"


def lines(result: dict) -> list[str]:
    """A short human table of ``run``'s result."""
    out = [f"{'abuse':<18} {'requests':>8} {'max s':>7}  outcomes"]
    for kind, k in result["kinds"].items():
        outcomes = ", ".join(f"{o}: {n}" for o, n in k["outcomes"].items())
        out.append(f"{kind:<18} {k['requests']:>8} {k['max_answer_s']:>7.2f}  {outcomes}")
    f, calls = result["front"], result["real_calls"]
    out.append(f"front: fds {f['fds_before']} -> {f['fds_after']} (peak {f['fds_peak']}), "
               f"RSS {f['rss_mib_before']} -> {f['rss_mib_after']} MiB, "
               f"{f['log_lines_during']} log lines")
    out.append("front, growth in each round (collected): " + "; ".join(
        f"{what} {' / '.join(_signed(g) for g in f['growth'][key])}"
        for key, what in (("heap_kib", "heap in use KiB"), ("heap_free_kib", "heap free KiB"),
                          ("py_blocks", "Python blocks"),
                          ("rss_trimmed_kib", "RSS after malloc_trim KiB"),
                          ("rss_kib", "RSS KiB"))))
    out.append(f"real calls during the burst: {calls['succeeded']}/{calls['attempted']} ok")
    g = result.get("given") or {}
    if g:
        out.append(f"given over the rounds: {g['calls_created']} calls and "
                   f"{g['agent_sessions']} agent sessions ({g['legitimate_calls']} legitimate "
                   f"calls), {g['tokens_minted']} tokens, {g['turn_credentials_issued']} TURN "
                   "credentials")
    if result["violations"]:
        out += ["VIOLATIONS:"] + [f"  {v}" for v in result["violations"]]
    else:
        out.append("no violations")
    return out


if __name__ == "__main__":
    import json
    import sys

    quick = "--quick" in sys.argv
    res = run(SignalingAbuseConfig.quick() if quick else SignalingAbuseConfig(),
              say=lambda m: print(m, file=sys.stderr, flush=True))
    print("\n".join(lines(res)))
    if "--json" in sys.argv:
        print(json.dumps(res, indent=2))
    sys.exit(1 if res["violations"] else 0)
