"""Scenario files: what a run builds, whom it calls, and how."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

from scenarios import architectures
from scenarios.architectures.base import Architecture
from scenarios.architectures.external import External
from scenarios.clients import needs_browser, parse_mix
from scenarios.conversationspec import ConversationSpec
from scenarios.faultspec import FaultSpec
from scenarios.priorities import Priorities
from scenarios.sweepspec import SweepSpec
from services.clienttypes import AIORTC, CHROMIUM
from topology.nat import MAPPINGS, NatSpec
from services.mediapaths import MEDIA_PATHS, NATIVE, PYTHON
from voiceedge.errors import ConfigError

# The architectures a scenario runs when its file names none (scenarios/architectures/).
DEFAULT_ARCHITECTURES = architectures.default_names()
DEFAULT_SCENARIO = Path(__file__).with_name("default.yaml")


class ScenarioError(ConfigError):
    """A scenario file that cannot run; the message names the file and the field."""


@dataclass(frozen=True)
class ManyRegions:
    """The load of a run with more than ``more_than`` client regions, in place of the file's:
    each region's client, ingress relay and front are processes of their own, so a live call
    of a wide world costs the host more than one of a narrow world (docs/scenarios.md)."""

    more_than: int
    live_at_once: float
    sessions_per_region: int | None = None   # aiortc sessions a region (None: the file's)

    @classmethod
    def parse(cls, raw, path) -> "ManyRegions":
        needed, keys = {"more_than", "live_at_once"}, {"more_than", "live_at_once",
                                                      "sessions_per_region"}
        if not isinstance(raw, dict) or set(raw) - keys or not needed <= set(raw):
            raise ScenarioError(f"{path}: many_regions: more_than and live_at_once, and "
                                f"optionally sessions_per_region ({raw!r})")

        def number(key, kind, low, high):
            value = raw[key]
            if not isinstance(value, kind) or isinstance(value, bool) or not low <= value <= high:
                raise ScenarioError(f"{path}: many_regions: {key}: {low}..{high} ({value!r})")
            return value

        return cls(number("more_than", int, 1, 1000),
                   float(number("live_at_once", (int, float), 1, 2000)),
                   number("sessions_per_region", int, 1, 200)
                   if "sessions_per_region" in raw else None)


@dataclass(frozen=True)
class Scenario:
    name: str
    clusters: tuple[str, ...]
    # Sessions per client region by client type (scenarios/clients/), in the registry's order.
    clients: dict = field(default_factory=lambda: {AIORTC: 7})
    full_clients_per_region: int = 2  # aiortc sessions with the full client; the rest light
    call_duration_s: float = 6.0
    start_rate: float = 3.0
    # The load as calls live at once per architecture over all client regions: each region
    # then starts live_at_once / (regions x call_duration_s) calls a second (for_client_regions);
    # None: start_rate as given.
    live_at_once: float | None = None
    architectures: tuple[str, ...] = DEFAULT_ARCHITECTURES
    last_mile: str = "last_mile_broadband"
    profiles: dict = field(default_factory=dict)
    calibration_count: int = 150
    calibration_rate: float = 100.0
    calibration_at_load: bool = True  # probe the calls' paths again while the calls run
    min_success_pct: float = 100.0  # below this for any architecture, the run exits 1
    transceivers_per_cluster: int = 1
    media_path: str = PYTHON          # the transceivers': python or native
    light_path: str = PYTHON          # the light aiortc clients': python or native (the pump)
    faults: tuple[FaultSpec, ...] = ()
    media_timeout_s: float = 1.5      # the clients' media watchdog (docs/client.md)
    reconnect_attempts: int = 3       # the clients' bounded retry after a failed connection
    sweep: SweepSpec | None = None    # the parameters a sweep varies (scenarios/sweepspec.py)
    external: tuple[External, ...] = ()  # architectures of the file's own (bring your own edge)
    realtime: Priorities = Priorities()  # SCHED_FIFO of services and clients (priorities.py)
    halt_poll_us: int = 2000          # idle cores poll this long before halting (haltpoll.py)
    many_regions: ManyRegions | None = None  # the load of a world of many client regions
    # Calls that speak in turns to a reply agent (every session; docs/conversation.md)
    conversation: ConversationSpec | None = None
    nat: NatSpec | None = None        # a NAT in front of every client region (topology/nat.py)
    description: str = ""
    source: str = ""

    @property
    def sessions_per_region(self) -> int:
        """aiortc sessions per client region (``sessions_per_region: N`` is
        ``clients: {aiortc: N}``)."""
        return self.clients.get(AIORTC, 0)

    @property
    def chromium_per_region(self) -> int:
        return self.clients.get(CHROMIUM, 0)

    @property
    def total_per_region(self) -> int:
        """Sessions of every client type per client region."""
        return sum(self.clients.values())

    @property
    def needs_browser(self) -> bool:
        """Whether a client type of the mix needs Chromium (the Makefile asks)."""
        return needs_browser(self.clients)

    def to_dict(self) -> dict:
        """The scenario as config.json records it, with the aiortc and Chromium counts under
        their older names too (results folders written before the mix have only those)."""
        return asdict(self) | {"sessions_per_region": self.sessions_per_region,
                               "chromium_per_region": self.chromium_per_region}

    @classmethod
    def load(cls, path: str | Path) -> "Scenario":
        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ScenarioError(f"scenario file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ScenarioError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(doc, dict):
            raise ScenarioError(f"{path}: must be a mapping of fields")
        known = {"name", "description", "clusters", "sessions_per_region", "call_duration_s",
                 "start_rate", "architectures", "last_mile", "profiles", "calibration",
                 "min_success_pct", "full_clients_per_region", "transceivers_per_cluster",
                 "faults", "client", "clients", "sweep", "external",
                 "media_path", "light_path", "live_at_once", "realtime", "halt_poll_us",
                 "many_regions", "conversation", "nat"}
        unknown = set(doc) - known
        if unknown:
            raise ScenarioError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")

        def need(key, kind, check=lambda v: True, what="invalid"):
            value = doc.get(key)
            if not isinstance(value, kind) or isinstance(value, bool) or not check(value):
                raise ScenarioError(f"{path}: {key}: {what} ({value!r})")
            return value

        clusters = need("clusters", list, lambda v: bool(v) and all(isinstance(c, str) for c in v),
                        "a non-empty list of region names")
        external = _external(path, doc)
        archs = doc.get("architectures", list(DEFAULT_ARCHITECTURES))
        known = architectures.names() + tuple(e.name for e in external)
        if (not isinstance(archs, list) or not archs
                or not all(isinstance(a, str) for a in archs) or set(archs) - set(known)):
            raise ScenarioError(f"{path}: architectures: choose from {', '.join(known)}")
        unused = [e.name for e in external if e.name not in archs]
        if unused:
            raise ScenarioError(f"{path}: external: {', '.join(unused)} not in architectures")
        calibration = doc.get("calibration", {}) or {}
        if not isinstance(calibration, dict) or set(calibration) - {"count", "rate", "at_load"}:
            raise ScenarioError(f"{path}: calibration: only count, rate and at_load")
        if not isinstance(calibration.get("at_load", True), bool):
            raise ScenarioError(f"{path}: calibration: at_load is true or false")
        profiles = doc.get("profiles", {}) or {}
        if not isinstance(profiles, dict):
            raise ScenarioError(f"{path}: profiles: a mapping of profile -> overrides")
        mix = _client_mix(path, doc)
        sessions = mix.get(AIORTC, 0)
        nat = _nat(path, doc.get("nat"))
        conversation = None
        if doc.get("conversation") is not None:
            try:
                conversation = ConversationSpec.parse(doc["conversation"], path)
            except ValueError as exc:
                raise ScenarioError(str(exc)) from None
            if "full_clients_per_region" in doc:
                raise ScenarioError(f"{path}: conversation: every aiortc session speaks, on "
                                    "light_path (native: the pump; python: full aiortc "
                                    "clients); leave out full_clients_per_region")
        # a conversation's callers: light ones on the native pump, or full aiortc clients
        talk_full = 0 if doc.get("light_path") == NATIVE else sessions
        full = (need("full_clients_per_region", int, lambda v: 0 <= v <= sessions,
                     f"0..sessions_per_region ({sessions})")
                if "full_clients_per_region" in doc
                else talk_full if conversation is not None else min(2, sessions))
        client = doc.get("client", {}) or {}
        if not isinstance(client, dict) or set(client) - {"media_timeout_s",
                                                          "reconnect_attempts"}:
            raise ScenarioError(f"{path}: client: only media_timeout_s and reconnect_attempts")
        media_timeout = client.get("media_timeout_s", 1.5)
        attempts = client.get("reconnect_attempts", 3)
        if (not isinstance(media_timeout, (int, float)) or isinstance(media_timeout, bool)
                or not 0.2 <= media_timeout <= 30):
            raise ScenarioError(f"{path}: client: media_timeout_s: 0.2..30 s ({media_timeout!r})")
        if not isinstance(attempts, int) or isinstance(attempts, bool) or not 0 <= attempts <= 10:
            raise ScenarioError(f"{path}: client: reconnect_attempts: 0..10 ({attempts!r})")
        per_cluster = (need("transceivers_per_cluster", int, lambda v: 1 <= v <= 10, "1..10")
                       if "transceivers_per_cluster" in doc else 1)
        media_path, light_path = (doc.get(k, PYTHON) for k in ("media_path", "light_path"))
        for key, value in (("media_path", media_path), ("light_path", light_path)):
            if value not in MEDIA_PATHS:
                raise ScenarioError(f"{path}: {key}: {' or '.join(MEDIA_PATHS)} ({value!r})")
        raw_faults = doc.get("faults", []) or []
        if not isinstance(raw_faults, list):
            raise ScenarioError(f"{path}: faults: a list of faults (docs/faults.md)")
        try:
            faults = tuple(FaultSpec.parse(f, i) for i, f in enumerate(raw_faults))
        except ValueError as exc:
            raise ScenarioError(f"{path}: faults: {exc}") from None
        if len({f.name for f in faults}) != len(faults):
            raise ScenarioError(f"{path}: faults: names repeat")
        sweep = None
        if doc.get("sweep") is not None:
            try:
                sweep = SweepSpec.parse(doc["sweep"], str(path))
            except ValueError as exc:
                raise ScenarioError(str(exc)) from None
        try:
            realtime = Priorities.parse(doc.get("realtime", True))
        except ValueError as exc:
            raise ScenarioError(f"{path}: realtime: {exc} ({doc.get('realtime')!r})") from None
        if ("start_rate" in doc) == ("live_at_once" in doc):
            raise ScenarioError(f"{path}: give start_rate (calls started a second per client "
                                "region) or live_at_once (calls live at once), one of them")
        many = None
        if doc.get("many_regions") is not None:
            if "live_at_once" not in doc:
                raise ScenarioError(f"{path}: many_regions: needs live_at_once (the load of "
                                    "the narrower worlds)")
            many = ManyRegions.parse(doc["many_regions"], path)
            if many.sessions_per_region is not None and "clients" in doc:
                raise ScenarioError(f"{path}: many_regions: sessions_per_region with a clients "
                                    "mix: give the mix's aiortc count in sessions_per_region")
        live_at_once = None
        if "live_at_once" in doc:
            live_at_once = float(need("live_at_once", (int, float), lambda v: 1 <= v <= 2000,
                                      "1..2000 calls"))
            start_rate = live_at_once / float(doc.get("call_duration_s") or 1)  # one region's
        else:
            start_rate = float(need("start_rate", (int, float), lambda v: 0 < v <= 50,
                                    "0..50/s"))
        scenario = cls(
            name=need("name", str, lambda v: v.replace("-", "").replace("_", "").isalnum(),
                      "letters, digits, - and _ only"),
            clusters=tuple(clusters),
            clients=mix, full_clients_per_region=full,
            call_duration_s=float(need("call_duration_s", (int, float), lambda v: 2 <= v <= 600,
                                       "2..600 s")),
            start_rate=start_rate, live_at_once=live_at_once,
            architectures=tuple(dict.fromkeys(archs)),
            last_mile=doc.get("last_mile", "last_mile_broadband"),
            profiles=profiles,
            calibration_count=int(calibration.get("count", 150)),
            calibration_rate=float(calibration.get("rate", 100)),
            calibration_at_load=calibration.get("at_load", True),
            min_success_pct=float(need("min_success_pct", (int, float), lambda v: 0 <= v <= 100,
                                       "0..100")) if "min_success_pct" in doc else 100.0,
            transceivers_per_cluster=per_cluster, media_path=media_path, light_path=light_path,
            faults=faults,
            media_timeout_s=float(media_timeout), reconnect_attempts=attempts, sweep=sweep,
            external=external, realtime=realtime,
            halt_poll_us=int(need("halt_poll_us", int, lambda v: 0 <= v <= 10_000,
                                  "0..10000 us (0: the host's setting)"))
            if "halt_poll_us" in doc else 2000,
            many_regions=many, conversation=conversation, nat=nat,
            description=str(doc.get("description", "")).strip(), source=str(path))
        if scenario.calibration_count < 20 or scenario.calibration_rate <= 0:
            raise ScenarioError(f"{path}: calibration: count >= 20 and a positive rate")
        for f in faults:
            try:
                f.check_world(scenario.clusters, per_cluster)
            except ValueError as exc:
                raise ScenarioError(f"{path}: faults: {f.name}: {exc}") from None
        return scenario

    def for_client_regions(self, regions: int) -> "Scenario":
        """The scenario as run with ``regions`` client regions: ``live_at_once`` spread over
        them as each region's start rate (unchanged without it); with more client regions
        than ``many_regions.more_than``, that block's load and sessions instead."""
        if self.live_at_once is None:
            return self
        scenario = self
        many = self.many_regions
        if many is not None and regions > many.more_than:
            clients = (self.clients if many.sessions_per_region is None
                       else {**self.clients, AIORTC: many.sessions_per_region})
            scenario = replace(self, live_at_once=many.live_at_once, clients=clients,
                               full_clients_per_region=min(self.full_clients_per_region,
                                                           clients.get(AIORTC, 0)))
        rate = scenario.live_at_once / (max(regions, 1) * scenario.call_duration_s)
        if not 0 < rate <= 50:
            raise ScenarioError(f"{self.source}: live_at_once {scenario.live_at_once:g} over "
                                f"{regions} client regions is {rate:.3g} calls a second per "
                                "region (0..50)")
        return replace(scenario, start_rate=rate)

    def architecture(self, name: str) -> Architecture:
        """The architecture ``name`` this scenario runs: the file's own, or a registered one."""
        for e in self.external:
            if e.name == name:
                return e
        return architectures.get(name)

    @property
    def requirements(self) -> tuple:
        """What this scenario's architectures need installed (topology/preflight.py)."""
        return tuple(dict.fromkeys(r for name in self.architectures
                                   for r in self.architecture(name).requirements))

    @property
    def baseline(self) -> str:
        """What every other architecture is compared with (scenarios/architectures/)."""
        return architectures.baseline()


def _external(path: Path, doc: dict) -> tuple[External, ...]:
    """The file's ``external:`` architectures (docs/scenarios.md, "Bring your own edge")."""
    raw = doc.get("external")
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise ScenarioError(f"{path}: external: a mapping of name -> its edge "
                            f"(docs/scenarios.md, \"Bring your own edge\")")
    out = []
    for name, entry in raw.items():
        if name in architectures.names():
            raise ScenarioError(f"{path}: external: {name} is a built-in architecture's name")
        try:
            out.append(External.parse(name, entry))
        except ValueError as exc:
            raise ScenarioError(f"{path}: external: {exc}") from None
    return tuple(out)


def _client_mix(path: Path, doc: dict) -> dict[str, int]:
    """Sessions per client region by client type: ``sessions_per_region`` (aiortc only) or a
    ``clients`` mix such as ``{aiortc: 20, chromium: 2}`` (scenarios/clients/), not both."""
    if "clients" not in doc:
        value = doc.get("sessions_per_region")
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 200:
            raise ScenarioError(f"{path}: sessions_per_region: 1..200 ({value!r})")
        return {AIORTC: value}
    if "sessions_per_region" in doc:
        raise ScenarioError(f"{path}: give sessions_per_region or clients, not both")
    try:
        return parse_mix(doc["clients"])
    except ValueError as exc:
        raise ScenarioError(f"{path}: clients: {exc}") from None


def _nat(path: Path, block) -> NatSpec | None:
    """``nat: {mapping: endpoint-independent | symmetric, udp_timeout_s: N}`` (both optional)."""
    if block is None:
        return None
    if not isinstance(block, dict) or set(block) - {"mapping", "udp_timeout_s"}:
        raise ScenarioError(f"{path}: nat: a mapping with mapping ({' or '.join(MAPPINGS)}) "
                            "and udp_timeout_s")
    try:
        return NatSpec(**block)
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
