"""Which UDP sockets a process tree holds, read from /proc (no tools, any namespace).

A service started by the edge launcher leads its own session (``start_new_session``), so its
worker processes are the processes of that session. Their socket inodes (``/proc/PID/fd``) are
matched against the UDP tables of their network namespace (``/proc/PID/net/udp`` and
``udp6``, which show the namespace of that process, whatever the reader's).
"""
from __future__ import annotations

from typing import NamedTuple

from services.procfs import processes, socket_inodes, udp_table


class UdpBinding(NamedTuple):
    address: str
    port: int
    pid: int
    inode: int
    service: str = ""
    host: str = ""

    @property
    def wildcard(self) -> bool:
        return self.address in ("0.0.0.0", "::")


def process_sessions() -> dict[int, list[int]]:
    """Every process session now: session id -> its pids (one pass over /proc)."""
    out: dict[int, list[int]] = {}
    for pid, fields in processes():
        out.setdefault(int(fields[3]), []).append(pid)
    return out


def session_pids(leader: int, index: dict[int, list[int]] | None = None) -> list[int]:
    """The leader, then every other process in its session (``index``: ``process_sessions()``
    read once for many leaders; read now when not given)."""
    pids = (process_sessions() if index is None else index).get(leader, [])
    return sorted(pids, key=lambda pid: pid != leader)


def udp_bindings(leader: int, index: dict[int, list[int]] | None = None) -> list[UdpBinding]:
    """Every UDP socket held by the processes of ``leader``'s session, once each (a forked
    worker shares its parent's sockets: they are the parent's). ``index``: as for
    ``session_pids``."""
    pids = session_pids(leader, index)
    if not pids:
        return []
    table = udp_table(pids[0])
    seen: dict[int, UdpBinding] = {}
    for pid in pids:
        for inode in socket_inodes(pid):
            if inode in table and inode not in seen:
                address, port = table[inode]
                seen[inode] = UdpBinding(address, port, pid, inode)
    return list(seen.values())
