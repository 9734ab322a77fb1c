"""A relay's workers live and die with it.

The workers share the relay's ports through SO_REUSEPORT. A worker that outlived its relay
(the relay killed with SIGKILL, as a crash or the OOM killer would) would keep its sockets and
its stale flows, and a relay started again on the same port would share that port with it: the
kernel would spread flows over old and new workers. Two guards:

- ``die_with_parent``: a worker asks the kernel for a signal (SIGKILL) when its parent dies
  (``PR_SET_PDEATHSIG``), and exits at once if its parent is already gone;
- ``port_holders``: before it opens its ports, a relay looks for any process of its network
  namespace that holds one of them, and refuses to start beside it.
"""
from __future__ import annotations

import ctypes
import os
import signal
from dataclasses import dataclass

from services.procfs import processes, socket_inodes, udp_table

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """Have ``sig`` sent to this process when its parent dies; exit now if ``parent_pid`` is
    no longer its parent (the parent died between the fork and this call)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(1)


class PortTaken(Exception):
    """Another process holds a port the relay is about to share through SO_REUSEPORT."""

    def __init__(self, holders: list["PortHolder"]) -> None:
        first = holders[0]
        super().__init__(
            f"UDP {first.address} is already held by pid {first.pid} ({first.command}"
            f"{f', and {len(holders) - 1} more' if len(holders) > 1 else ''}): a worker that "
            "outlived its relay? Stop it first; SO_REUSEPORT would share the port with it")


@dataclass(frozen=True)
class PortHolder:
    """A process that holds a UDP socket bound to a port we want."""

    pid: int
    command: str
    address: str  # "ip:port" as bound (0.0.0.0 / :: for a wildcard)


_WILDCARDS = ("0.0.0.0", "::")


def _overlaps(bound: tuple[str, int], wanted: tuple[str, int]) -> bool:
    return bound[1] == wanted[1] and (bound[0] == wanted[0] or bound[0] in _WILDCARDS
                                      or wanted[0] in _WILDCARDS)


def port_holders(addresses: list[tuple[str, int]],
                 exclude: set[int] = frozenset()) -> list[PortHolder]:
    """The processes (other than ``exclude``) of any namespace holding a UDP socket of this
    network namespace bound where one of ``addresses`` (ip, port) would bind, from /proc."""
    inodes = {inode: bound for inode, bound in udp_table().items()
              if any(_overlaps(bound, wanted) for wanted in addresses)}
    holders: list[PortHolder] = []
    if not inodes:
        return holders
    for pid, _ in processes():
        if pid in exclude:
            continue
        for inode in socket_inodes(pid) & inodes.keys():
            ip, port = inodes[inode]
            where = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
            holders.append(PortHolder(pid, _command(pid), where))
    return holders


def _command(pid: int) -> str:
    try:
        raw = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:120]
