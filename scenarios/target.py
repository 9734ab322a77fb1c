"""``voiceedge scenario FILE --target URL``: a scenario's clients against a deployed edge.

No world is built and nothing is calibrated: the clients run on this host, as the scenario
says (sessions, start rate, call length, Chromium sessions), against the signaling front at
URL, and their sessions are written to the same results folder as an emulated run's, with one
architecture, ``deployment``, and one client region, ``target``. ``config.json`` records the
target; the report says the figures are a deployment's, taken over whatever network lies
between this host and it, with no configured floor to measure them against.

What the deployment's own services did is not visible from here: the ports a run shows are the
distinct server media addresses the clients' selected ICE pairs reached, and only the clients'
own lag can mark a session saturated.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from scenarios.credentials import TOKEN_LIFE_S, PrivateFiles
from scenarios.processes import ServiceError, ServiceProcess, voiceedge_cmd
from scenarios.clients import RegionClients
from scenarios.clients import commands as client_commands
from scenarios.runner import (ArchitectureRun, RunResult, ResultCount, _logged,
                              ServerSide, client_rows, git_commit, write_results)
from scenarios.saturation import LagWindows
from scenarios.spec import Scenario, ScenarioError
from scenarios.timeline import TIMELINE, merge_timeline

ARCHITECTURE = "deployment"  # the one architecture of a target run
REGION = "target"            # its one client region: this host
MODE = "deployment target"


class TargetUnreachable(RuntimeError):
    """The target's signaling front did not answer its health check."""


@dataclass(frozen=True)
class Target:
    """A deployed edge: its signaling front's base URL (scheme, host, port, optional prefix)."""

    url: str

    @classmethod
    def parse(cls, text: str) -> "Target":
        """``http[s]://host[:port][/prefix]``; a trailing ``/v1/calls`` or ``/call`` is the
        front's own path and is dropped. ValueError (one line) for anything else."""
        parts = urlsplit(text.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--target {text!r}: expected http[s]://HOST[:PORT], the "
                             f"deployment's signaling front")
        try:
            parts.port
        except ValueError:
            raise ValueError(f"--target {text!r}: bad port") from None
        if parts.query or parts.fragment:
            raise ValueError(f"--target {text!r}: no query or fragment, only the front's URL")
        path = parts.path.rstrip("/")
        for own in ("/v1/calls", "/call"):
            path = path.removesuffix(own)
        return cls(urlunsplit((parts.scheme, parts.netloc, path, "", "")))

    @property
    def calls_url(self) -> str:
        return f"{self.url}/v1/calls"

    @property
    def page_url(self) -> str:
        return f"{self.url}/call"

    @property
    def health_url(self) -> str:
        return f"{self.url}/healthz"

    def mint_token(self, api_key: str, ttl_s: int, timeout: float = 10.0) -> str:
        """A call token from the front (``POST /v1/client_secrets`` with the API key), as an
        application server gets one for its browsers; TargetUnreachable (one line, never
        the key) when the front does not give one."""
        url = f"{self.url}/v1/client_secrets"
        request = urllib.request.Request(
            url, data=json.dumps({"expires_in": ttl_s}).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as exc:
            reason = exc.read().decode(errors="replace").strip().splitlines()[:1]
            raise TargetUnreachable(f"{url} gave no call token for --api-key-file's key: HTTP "
                                    f"{exc.code} {''.join(reason)[:200]}") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TargetUnreachable(f"{url}: {reason}") from None

    def check(self, timeout: float = 5.0) -> dict:
        """The front's /healthz (200 while a transceiver answers); TargetUnreachable if not."""
        try:
            with urllib.request.urlopen(self.health_url, timeout=timeout) as r:
                body = r.read()
        except urllib.error.HTTPError as exc:
            raise TargetUnreachable(f"{self.health_url} answered HTTP {exc.code}: the "
                                    f"front has no healthy transceiver") from None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TargetUnreachable(f"{self.health_url}: {reason}") from None
        try:
            return json.loads(body)
        except ValueError:
            return {}


class TargetRunner:
    """One run of a scenario's clients against a deployment."""

    def __init__(self, scenario: Scenario, target: Target, results_root: Path = Path("results"),
                 say=lambda msg, transient=False: None, progress=None,
                 verifies: tuple[str, ...] | None = None,
                 extra_args: tuple[str, ...] = (), api_key: str | None = None) -> None:
        """``say`` and ``progress`` as ScenarioRunner's; ``verifies``: what the clients
        count as verified (None: the project's edge, services/client/verify.py);
        ``extra_args``: more options for every client; ``api_key``: the deployment's key,
        which the run trades for a call token its clients carry (None: an open front).
        ScenarioError for a scenario that needs the emulated world (faults)."""
        if scenario.faults:
            raise ScenarioError(f"{scenario.source or scenario.name}: faults break the "
                                f"emulated world's links and services; a deployment target "
                                f"has none to break (use a scenario without faults)")
        self.target = target
        self.api_key = api_key
        self.verifies = verifies
        self.extra_args = tuple(extra_args)
        self.say = say
        self.progress = progress or (lambda what, done, total: None)
        self.client_regions = [REGION]
        self.scenario = scenario = scenario.for_client_regions(1)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.directory = results_root / f"{scenario.name}-target-{stamp}"

    def run(self) -> RunResult:
        """Check the target, run the clients, write the results folder."""
        health = self.target.check()
        token = (None if self.api_key is None
                 else self.target.mint_token(self.api_key, TOKEN_LIFE_S))
        self.directory.mkdir(parents=True, exist_ok=False)
        logs = self.directory / "logs" / ARCHITECTURE
        logs.mkdir(parents=True)
        started = time.monotonic()
        result = RunResult(self.directory, self.scenario, [REGION], [], MODE, None)
        self._write_config(health)
        sc = self.scenario
        clients: list[ServiceProcess] = []
        interrupted = False
        secrets = PrivateFiles()
        try:
            self._start_clients(logs, clients, None if token is None
                                else secrets.write("token-clients", token))
            results = ResultCount(logs)
            planned = sc.total_per_region
            deadline = (time.monotonic() + planned / sc.start_rate + sc.call_duration_s + 90)
            while any(c.alive() for c in clients):
                if time.monotonic() > deadline:
                    raise ServiceError("the clients did not finish in time")
                done, failed = results.poll()
                self.progress(ARCHITECTURE, done, planned)
                self.say(f"{done} of {planned} sessions done, {failed} failed, "
                         f"{time.monotonic() - started:.0f} s", transient=True)
                time.sleep(0.5)
        except KeyboardInterrupt:  # Ctrl-C: the sessions that ended are still written
            interrupted = True
        finally:
            for proc in clients:
                proc.stop()
            secrets.close()
            merge_timeline(logs)
        lag = LagWindows.from_run(logs / TIMELINE)
        sessions, samples, attempts, gaps = client_rows(
            ARCHITECTURE, REGION, logs, lag, ServerSide.read(logs / TIMELINE))
        peak, addresses = _peak_and_addresses(sessions)
        seconds = round(time.monotonic() - started, 1)
        result.architectures.append(ArchitectureRun(
            ARCHITECTURE, sessions, samples, {}, peak, len(addresses), len(addresses),
            [f"server media address {a}" for a in sorted(addresses)], seconds,
            attempts=attempts, gaps=gaps))
        self.progress(ARCHITECTURE, len(sessions), len(sessions))
        ok = sum(1 for s in sessions if s["ok"])
        self.say(f"{ok}/{len(sessions)} sessions ok in {seconds:.0f} s")
        result.timings["total_s"] = seconds
        write_results(result)
        if interrupted:
            raise KeyboardInterrupt
        return result

    def _write_config(self, health: dict) -> None:
        (self.directory / "config.json").write_text(json.dumps({
            "scenario": self.scenario.to_dict(), "mode": MODE,
            "target": {"url": self.target.url, "healthz": health},
            "client_regions": [REGION], "clusters": [], "world_regions": [],
            "architectures": [ARCHITECTURE], "baseline": None, "backend": MODE,
            "commit": git_commit(), "impairments": {},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2, default=str))

    def _start_clients(self, logs: Path, clients: list[ServiceProcess],
                       credential_file: Path | None) -> None:
        """The scenario's client mix on this host (scenarios/clients/), as in an emulated
        run: the types with a ready event (the browsers) ready before the others start."""
        where = RegionClients(self.target.calls_url, REGION, logs,
                              credential_file=credential_file)
        commands = client_commands(self.scenario, where, self.verifies, self.extra_args)
        for c in commands:
            proc = ServiceProcess(c.name, voiceedge_cmd(*c.argv), c.log_path(logs)).start()
            clients.append(proc)
            if c.ready_event is not None:
                proc.wait_ready(lambda p=proc, e=c.ready_event: _logged(p.log_path, e),
                                timeout=c.ready_timeout_s)


def _peak_and_addresses(sessions: list[dict]) -> tuple[int, set[str]]:
    """The most sessions connected at once (from the clients' own times) and the distinct
    server media addresses of the selected ICE pairs ("local -> remote")."""
    events = []
    for s in sessions:
        start, end = s.get("connected_unix"), s.get("ended_unix")
        if s.get("ok") and start is not None and end is not None:
            events += [(float(start), 1), (float(end), -1)]
    live = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        live += step
        peak = max(peak, live)
    addresses = {str(s["ice_pair"]).split(" -> ")[-1] for s in sessions
                 if s.get("ok") and s.get("ice_pair") and " -> " in str(s["ice_pair"])}
    return peak, addresses
