"""What a client type is to a run: how it starts its sessions of one client region."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scenarios.spec import Scenario

MAX_PER_REGION = 200  # sessions of any one client type per client region


@dataclass(frozen=True)
class RegionClients:
    """One client region of a run, as a client type needs it to build its command."""

    url: str                     # the signaling URL this region's clients call
    region: str                  # names the processes, logs and results files
    logs: Path                   # the architecture's log folder
    number: int = 0              # the region's place among the regions with clients (0-based)
    regions: int = 1             # how many client regions the run has
    retry_setup: bool = False    # call again when an answered setup never connects (faults)
    rx_log: Path | None = None   # append every received RTP packet here (captures)
    # When the first call is due (Unix s; None: once the process is up). Fault runs set it:
    # their faults count from it. Types with a ready event start before it is known.
    start_at_unix: float | None = None
    # Or: a file the run writes that time into once all its client processes are up (types
    # without a ready event wait for it after their start-up).
    start_file: Path | None = None
    # the call token this region's client processes carry to the front (None: an open front)
    credential_file: Path | None = None


@dataclass(frozen=True)
class ClientCommand:
    """One client process to start: its ``voiceedge`` arguments and what the runner needs to
    start it, wait for it and read its results."""

    client_type: str
    name: str                    # the process, e.g. client-apac (its log: logs/NAME.log)
    argv: tuple[str, ...]        # after ``voiceedge``
    sessions: int
    ready_event: str | None = None   # a log event it prints once ready for its calls
    ready_timeout_s: float = 0.0
    realtime: bool = True            # may run at the clients' priority (scenarios/priorities.py)

    def log_path(self, logs: Path) -> Path:
        return logs / f"{self.name}.log"


class ClientType:
    """A kind of WebRTC client a scenario's ``clients`` mix names: one module each
    (scenarios/clients/), listed in the registry (scenarios/clients/__init__.py)."""

    name: str = ""               # its key in ``clients`` and its sessions' client_type
    process: str = ""            # process name prefix: PROCESS-REGION
    results_suffix: str = ""     # its results files: sessions-REGION{suffix}.jsonl, samples-...
    needs_browser: bool = False  # needs Chromium installed (make browsers)
    realtime: bool = True        # its processes may run at the clients' SCHED_FIFO priority
    ready_event: str | None = None  # started and ready before any other type's calls start
    max_per_region: int = MAX_PER_REGION
    max_reason: str = ""         # why a type allows fewer

    def argv(self, scenario: "Scenario", where: RegionClients, sessions: int, index_base: int,
             verifies: tuple[str, ...] | None = None, extra_args: tuple[str, ...] = ()
             ) -> list[str]:
        """The ``voiceedge`` arguments of ``sessions`` sessions of ``where``'s region, indices
        from ``index_base``; ``verifies``: the checks that count (None: the client's default,
        the project's edge); ``extra_args``: the architecture's own client options (ICE)."""
        raise NotImplementedError

    def ready_timeout_s(self, sessions: int) -> float:
        return 0.0

    def results_files(self, logs: Path, region: str) -> tuple[Path, Path]:
        """(sessions, samples) JSON-lines files of one region's sessions of this type."""
        return (logs / f"sessions-{region}{self.results_suffix}.jsonl",
                logs / f"samples-{region}{self.results_suffix}.jsonl")

    def audio_dir(self, region: str) -> str:
        """The folder (under the logs) a conversation's replies heard are kept in."""
        return f"audio-{region}{self.results_suffix}"

    def _conversation(self, scenario: "Scenario", where: RegionClients) -> list[str]:
        """The conversation's options, if the scenario holds one."""
        talk = scenario.conversation
        return [] if talk is None else talk.client_args(where.logs / self.audio_dir(where.region))

    @staticmethod
    def _credential(where: RegionClients) -> list[str]:
        return [] if where.credential_file is None else [
            "--credential-file", str(where.credential_file)]

    def _outputs(self, where: RegionClients) -> list[str]:
        sessions, samples = self.results_files(where.logs, where.region)
        return ["--results", str(sessions), "--samples", str(samples)]

    @staticmethod
    def _verify(verifies: tuple[str, ...] | None) -> list[str]:
        return [] if verifies is None else ["--verify", ",".join(verifies)]
