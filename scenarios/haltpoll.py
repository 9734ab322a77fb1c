"""Idle cores that poll before they halt, for the length of a run (KVM guests' haltpoll).

On a virtual machine a core with nothing to run halts, and waking it again exits to the
hypervisor: on this 2-core VM two processes bouncing a datagram across cores took 28-34 us of
CPU per wake-up and 71-87 us a round trip; with idle cores polling up to 200 us before they
halt, 8 us and 14 us (bench: docs/scenarios.md). The emulated world wakes a process for every
datagram at every hop, some 30,000 times a second at REGION=all, so a run asks the guest's
haltpoll cpuidle driver (``/sys/module/haltpoll/parameters``) to poll ``us`` microseconds
without shrinking the window, and restores what it found when the run ends (Ctrl-C included).
Polling is idle time to the guest: the host-CPU figures count only work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PARAMETERS = Path("/sys/module/haltpoll/parameters")
_WINDOW, _SHRINK = "guest_halt_poll_ns", "guest_halt_poll_allow_shrink"


@dataclass
class HaltPolling:
    """``with HaltPolling(us) as polling:`` idle cores poll ``us`` us before halting (0: the
    host's setting left alone); ``polling.state`` says what the run had."""

    us: int
    parameters: Path = PARAMETERS
    state: str = ""
    _saved: dict[str, str] = field(default_factory=dict)

    def __enter__(self) -> "HaltPolling":
        if not self.us:
            self.state = "left as the host has it"
            return self
        try:
            self._saved = {name: (self.parameters / name).read_text().strip()
                           for name in (_WINDOW, _SHRINK)}
        except OSError:
            self.state = "not available (no haltpoll cpuidle driver)"
            return self
        try:
            (self.parameters / _WINDOW).write_text(str(self.us * 1000))
            (self.parameters / _SHRINK).write_text("N")
        except OSError as exc:
            self.__exit__()
            self.state = f"not set: {exc.strerror or exc}"
            return self
        self.state = f"{self.us} us (haltpoll; set for the run, restored after)"
        return self

    def __exit__(self, *exc) -> None:
        for name, value in self._saved.items():
            try:
                (self.parameters / name).write_text(value)
            except OSError:
                pass
        self._saved = {}
