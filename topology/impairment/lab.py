"""Two namespaces joined by a veth pair: the smallest world to impair, for tests and benches.

    a (va: 10.99.0.1/24, fd99::1/64) <---veth---> b (vb: 10.99.0.2/24, fd99::2/64)
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from topology.impairment.model import NetNode
from topology.netns import add_netns, delete_netns, ip


@dataclass(frozen=True)
class PairLab:
    a: NetNode
    b: NetNode
    if_a: str
    if_b: str
    addr_a: str
    addr_b: str
    addr6_a: str
    addr6_b: str


class pair_lab:
    """Context manager: make the two namespaces and the veth; delete them on exit (deleting a
    namespace removes its veth end, its iptables rules and any queue bound in it)."""

    def __init__(self, prefix: str = "veimp", subnet: str = "10.99.0", subnet6: str = "fd99::") -> None:
        tag = f"{prefix}-{os.getpid()}"
        self.names = (f"{tag}-a", f"{tag}-b")
        self.subnet, self.subnet6 = subnet, subnet6

    def __enter__(self) -> PairLab:
        name_a, name_b = self.names
        try:
            path_a, path_b = add_netns(name_a), add_netns(name_b)
            a6, b6 = f"{self.subnet6}1", f"{self.subnet6}2"
            ip("link", "add", "va", "netns", name_a, "type", "veth", "peer", "name", "vb",
               "netns", name_b)
            ip("-n", name_a, "addr", "add", f"{self.subnet}.1/24", "dev", "va")
            ip("-n", name_b, "addr", "add", f"{self.subnet}.2/24", "dev", "vb")
            ip("-n", name_a, "addr", "add", f"{a6}/64", "dev", "va", "nodad")
            ip("-n", name_b, "addr", "add", f"{b6}/64", "dev", "vb", "nodad")
            ip("-n", name_a, "link", "set", "va", "up")
            ip("-n", name_b, "link", "set", "vb", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return PairLab(NetNode(name_a, path_a), NetNode(name_b, path_b), "va", "vb",
                       f"{self.subnet}.1", f"{self.subnet}.2", a6, b6)

    def __exit__(self, *exc) -> None:
        for name in self.names:
            delete_netns(name)
