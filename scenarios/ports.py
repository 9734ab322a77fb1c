"""Which UDP sockets a process tree holds, read from /proc (no tools, any namespace).

A service started by the edge launcher leads its own session (``start_new_session``), so its
worker processes are the processes of that session. Their socket inodes (``/proc/PID/fd``) are
matched against the UDP tables of their network namespace (``/proc/PID/net/udp`` and
``udp6``, which show the namespace of that process, whatever the reader's).
"""
from __future__ import annotations

import ipaddress
import os
from typing import NamedTuple


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


def session_pids(leader: int) -> list[int]:
    """The leader, then every other process in its session."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # the command name may hold spaces and parentheses: split after the last ')'
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == leader:  # field 6 of stat: the session id
            pids.append(int(entry))
    return sorted(pids, key=lambda pid: pid != leader)


def socket_inodes(pid: int) -> set[int]:
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


def _decode(hex_addr: str) -> tuple[str, int]:
    """'0100007F:0D96' (/proc/net/udp, little-endian words) -> ('127.0.0.1', 3478)."""
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    # the kernel prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw)), int(port, 16)


def udp_table(pid: int) -> dict[int, tuple[str, int]]:
    """Socket inode -> local (address, port) of every UDP socket in ``pid``'s namespace."""
    out = {}
    for name in ("udp", "udp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            out[int(cols[9])] = _decode(cols[1])
    return out


def udp_bindings(leader: int) -> list[UdpBinding]:
    """Every UDP socket held by the processes of ``leader``'s session, once each (a forked
    worker shares its parent's sockets: they are the parent's)."""
    pids = session_pids(leader)
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
