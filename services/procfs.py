"""Facts about processes and their UDP sockets, read from /proc (no tools, any namespace).

Shared by the relay (who else holds my port?), the edge launcher (which public ports does a
service hold?), the demo (CPU of a process and its children) and the services' and benchmarks'
view of what a process holds (open fds, memory).
"""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


_CPUIDLE = "/sys/devices/system/cpu"


@dataclass(frozen=True)
class HostTimes:
    """Seconds since boot summed over every core, from ``/proc/stat``'s first line; the idle
    time from the cpuidle states' microsecond counters where the kernel has them."""

    idle: float      # idle + iowait
    steal: float     # taken by the hypervisor (tick-sampled)
    irq: float       # hardware and software interrupts, where accounted apart (tick-sampled)

    @classmethod
    def read(cls, path: str = "/proc/stat", cpuidle: str | None = _CPUIDLE) -> "HostTimes":
        with open(path) as f:
            fields = [int(v) / _TICK for v in f.readline().split()[1:9]]
        fields += [0.0] * (8 - len(fields))
        user, nice, system, idle, iowait, irq, softirq, steal = fields
        fine = cpuidle_seconds(cpuidle) if cpuidle else None
        return cls((idle if fine is None else fine) + iowait, steal, irq + softirq)


def cpuidle_seconds(root: str = _CPUIDLE) -> float | None:
    """Time every core spent in its idle states (cpuidle's per-state ``time``, microseconds),
    or None without cpuidle. /proc/stat counts in clock ticks (10 ms): over a 0.2 s window of a
    benchmark that is 100 us per packet at 500 packets a second, more than what it measures.
    A core idle right now has its current stay counted when it wakes."""
    try:
        cpus = [d for d in os.listdir(root) if d.startswith("cpu") and d[3:].isdigit()]
        total = 0
        for cpu in cpus:
            states = os.path.join(root, cpu, "cpuidle")
            for state in os.listdir(states):
                with open(os.path.join(states, state, "time")) as f:
                    total += int(f.read())
    except (OSError, ValueError):
        return None
    return total / 1e6 if cpus else None


def stat_fields(pid: int | str) -> list[str]:
    """``/proc/PID/stat`` after the command name (which may hold spaces and parentheses):
    index 0 is the state, 1 the parent pid, 3 the session id, 11/12 user/system ticks."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, stat fields) of every process that is still there when read."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                yield int(entry), stat_fields(entry)
            except OSError:  # gone meanwhile
                continue


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a dead child its parent has not reaped)."""
    try:
        return stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def process_tree() -> tuple[set[int], dict[int, list[int]]]:
    """(every pid now, parent pid -> its children's pids), in one pass over /proc."""
    children: dict[int, list[int]] = {}
    alive = set()
    for p, fields in processes():
        alive.add(p)
        children.setdefault(int(fields[1]), []).append(p)
    return alive, children


def descendants(pid: int | None) -> list[int]:
    """``pid`` (if it is still there) and every process below it, parents first."""
    if pid is None:
        return []
    alive, children = process_tree()
    out, todo = [], [pid] if pid in alive else []
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(sorted(children.get(p, ())))
    return out


def status_fields(pid: int | str = "self") -> dict[str, str]:
    """``/proc/PID/status`` as name -> value (``VmRSS`` -> ``"1234 kB"``)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def kib(status: dict[str, str], key: str) -> int | None:
    """A ``... kB`` field of ``status_fields`` in KiB (None when absent: a zombie)."""
    return int(status[key].split()[0]) if key in status else None


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(fields: list[str]) -> float:
    """User + system CPU seconds of a process (its ended threads included) from its stat."""
    return (int(fields[11]) + int(fields[12])) / _TICK


def precise_cpu_seconds(pid: int | str) -> float:
    """CPU seconds of a process at nanosecond precision: its live threads' scheduler time
    (``/proc/PID/task/*/schedstat``). ``stat``'s ticks (10 ms) would read 0 for a process that
    used a few ms; they still count threads that ended, so the larger of the two is returned."""
    ticks = cpu_seconds(stat_fields(pid))
    live_ns = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return ticks
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                live_ns += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            continue
    return max(ticks, live_ns / 1e9)


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets ``pid`` holds (empty if it is gone or not ours to read)."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def decode_address(hex_addr: str) -> tuple[str, int]:
    """'0100007F:0D96' (/proc/net/udp, little-endian words) -> ('127.0.0.1', 3478)."""
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    # the kernel prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw)), int(port, 16)


def udp_table(pid: int | str = "thread-self") -> dict[int, tuple[str, int]]:
    """Socket inode -> local (address, port) of every UDP socket in ``pid``'s network
    namespace (``/proc/PID/net`` shows that process's namespace, whatever the reader's; the
    default, the calling thread's, follows a thread that entered another namespace)."""
    out = {}
    for name in ("udp", "udp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            out[int(cols[9])] = decode_address(cols[1])
    return out
