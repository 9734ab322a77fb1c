"""The worker's first-packet admission in C (``--admission native``; _admission.c).

For IPv4 clients of the public port, ``_admission.Admission`` makes the decisions that
admission.py, routing.py and the flow table's pending flows make in Python: the source's token
bucket, the STUN walk to USERNAME and the routing ufrag's tag, the pending caps and the
eviction of the oldest, the pending TTL. It keeps the pending flows itself; a flow becomes a
Python ``Flow`` only when its next hop answers. Its token buckets are the worker's only ones
(``Admission.limiter``): Redis lookups and the Python path's pending flows (IPv6, the cluster
tier's upstream datagrams) spend from the same bucket per source.
"""
from __future__ import annotations

from services.relay import _admission
from services.relay.config import RelayConfig
from services.relay.flows import Hop

REASONS = _admission.REASONS          # drop reason of first()'s result -1 - index
NOT_STUN = _admission.NOT_STUN        # not STUN and no pending flow: the Python path's
HEADER_BYTES = 8                      # the IPv4 hop header first() writes


def native_admission(config: RelayConfig, hop) -> tuple[_admission.Admission, list[Hop]]:
    """The C admission for ``config`` and the next hops its results index (``hop``: the
    flow table's one-``Hop``-per-address lookup)."""
    routes = config.routes
    hops = [hop(addr) for addr in routes.routes.values()]
    index = {id_: k for k, id_ in enumerate(routes.routes)}
    native = _admission.Admission(
        config.secret, routes.tier == "ingress",
        routes.cluster_id if routes.cluster_id is not None else -1, index,
        config.first_packet_rate, config.first_packet_burst, 65_536, config.max_pending,
        config.pending_per_ip, config.pending_per_prefix, int(config.pending_ttl * 1e9))
    return native, hops
