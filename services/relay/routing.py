"""Where a first packet goes: the server ufrag in its STUN USERNAME, through the route table."""
from __future__ import annotations

from typing import Callable

from services.relay.config import RouteTable
from services.wire.stun import StunError, read_username, server_ufrag
from services.wire.ufrag import UfragCodec, UfragError


class Router:
    """Reads a first packet's routing hint; ``hop`` turns a next hop's address into the
    worker's one ``Hop`` for it (flows.FlowTable.hop)."""

    def __init__(self, codec: UfragCodec, routes: RouteTable, hop: Callable) -> None:
        self._codec = codec
        self._routes = routes
        self._hop = hop

    def route(self, datagram: memoryview):
        """(cluster id, transceiver id, next hop) from the USERNAME of a first datagram in
        STUN's range (``in_stun_range``), or the drop reason (a plain tuple or str: this runs
        for every first packet of a flood)."""
        try:
            username = read_username(datagram)
        except StunError:
            return "stun_malformed"
        if username is None:
            return "stun_no_username"
        try:
            hint = self._codec.decode(server_ufrag(username))
        except UfragError:
            return "bad_ufrag"
        addr = self._routes.next_hop(hint.cluster_id, hint.transceiver_id)
        if addr is None:
            return "no_route"
        return hint.cluster_id, hint.transceiver_id, self._hop(addr)
