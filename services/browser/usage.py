"""What the browser costs: CPU and memory of the driver's process tree, by role, from /proc.

The tree is every process below ``voiceedge browser`` (its own Python process is counted
apart): Playwright's driver (``node``), Chromium's browser process, its renderers (one per
page), its GPU, utility (network, audio) and zygote processes. CPU is user + system time,
with the children each process has reaped (Chromium's ended renderers are in the browser
process's); memory is PSS (``smaps_rollup``: shared pages split between their users, so the
sum is not inflated by Chromium's shared libraries) and RSS.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from services.procfs import descendants, kib, stat_fields, status_fields

_TICK = os.sysconf("SC_CLK_TCK")
# "zygote": with the renderers it has reaped (ended pages); "exited": a process ending at the
# time of the look (no command line any more), with its CPU
ROLES = ("driver", "browser", "renderer", "gpu", "utility", "zygote", "exited", "other")


def role_of(argv: list[str]) -> str:
    """A process's role from its command line."""
    if not argv:
        return "exited"
    if os.path.basename(argv[0]) == "node":
        return "driver"
    kind = next((a.split("=", 1)[1] for a in argv if a.startswith("--type=")), None)
    return {None: "browser", "renderer": "renderer", "gpu-process": "gpu",
            "utility": "utility", "zygote": "zygote"}.get(kind, "other")


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Usage:
    """One look at the tree: per role, CPU seconds so far, PSS and RSS in KiB, processes."""

    cpu_s: dict[str, float] = field(default_factory=dict)
    pss_kib: dict[str, int] = field(default_factory=dict)
    rss_kib: dict[str, int] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)

    @property
    def total_cpu_s(self) -> float:
        return sum(self.cpu_s.values())

    @property
    def total_pss_kib(self) -> int:
        return sum(self.pss_kib.values())


def measure(root: int | None = None) -> Usage:
    """The processes below ``root`` (default: this process), not ``root`` itself."""
    root = os.getpid() if root is None else root
    usage = Usage()
    for pid in descendants(root)[1:]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                # Chromium's child processes rewrite their command line as one string
                argv = f.read().decode(errors="replace").replace("\0", " ").split()
            fields = stat_fields(pid)
            rss = kib(status_fields(pid), "VmRSS") or 0
        except OSError:  # gone meanwhile
            continue
        role = role_of(argv)
        cpu = sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK
        usage.cpu_s[role] = usage.cpu_s.get(role, 0.0) + cpu
        usage.pss_kib[role] = usage.pss_kib.get(role, 0) + _pss_kib(pid)
        usage.rss_kib[role] = usage.rss_kib.get(role, 0) + rss
        usage.processes[role] = usage.processes.get(role, 0) + 1
    return usage
