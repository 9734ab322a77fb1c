"""Relay counters: kept as plain ints in a worker, published to shared memory once a second."""
from __future__ import annotations

import multiprocessing
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

DROP_REASONS = (
    "oversize",            # datagram larger than a receive slot (MSG_TRUNC)
    "unknown_not_stun",    # non-STUN from an address with no flow (and no Redis mapping)
    "stun_malformed",      # STUN-range first byte but bad framing or attribute overrun
    "stun_no_username",    # well-framed STUN without USERNAME
    "bad_ufrag",           # USERNAME whose server ufrag fails the tag or the format
    "no_route",            # valid hint, no next hop for it here (or another cluster's hint)
    "flow_table_full",     # first packet while max_flows flows exist
    "bad_hop_header",      # internal datagram without a valid hop header
    "return_no_flow",      # return datagram for a client with no flow: never reflected
    "return_wrong_source", # return datagram not from the flow's next hop
    "wrong_prev_hop",      # internal datagram of a flow from an unexpected upstream relay
    "recovery_backlog",    # too many datagrams waiting for one Redis lookup
    "recovery_busy",       # max_lookups Redis lookups already in flight
    "overload",            # a first packet while the slow path's backlog is full
    "rate_limited",        # the source IP's first-packet token bucket is empty
    "pending_not_stun",    # non-STUN from a pending flow (its next hop has not answered)
    "pending_per_ip",      # a new pending flow over the per-source-IP cap
    "pending_per_prefix",  # a new pending flow over the per-/24 (/64) cap
    "send_failed",         # the kernel refused a send
)
# name -> help text; the order is the shared-memory layout.
COUNTERS = {
    "packets_to_server": "datagrams forwarded towards transceivers",
    "bytes_to_server": "bytes forwarded towards transceivers (client datagrams, no headers)",
    "packets_to_client": "datagrams forwarded towards clients",
    "bytes_to_client": "bytes forwarded towards clients (client datagrams, no headers)",
    "receive_batches": "socket wake-ups that returned datagrams (datagrams / this = datagrams per wake-up)",
    "flows_created": "flows established by their next hop's answer to a STUN first packet",
    "flows_pending_created": "pending flows opened by a routable STUN first packet",
    "flows_pending_expired": "pending flows removed unanswered after the pending TTL",
    "flows_pending_evicted": "pending flows removed (oldest first) to make room in a full table",
    "flows_pending": "pending flows in the table now (gauge; included in flows_active)",
    "rate_limit_untracked": "first packets let through unlimited: the rate limiter's table of "
                            "sources was full",
    "flows_recovered": "flows re-created from the Redis flow cache",
    "flows_moved": "flows that followed a STUN check from their address to another next hop, "
                   "once that hop answered (a NAT gave the address to another caller)",
    "flows_expired": "flows removed after the idle timeout",
    "flows_active": "flows in the table now (gauge)",
    "redis_writes": "flow mappings written to Redis",
    "redis_writes_dropped": "flow mappings not written (queue full or Redis down)",
    "redis_lookups": "Redis lookups for non-STUN datagrams from unknown addresses",
    "redis_hits": "Redis lookups that found a flow",
    "redis_errors": "Redis operations that failed",
    "redis_up": "1 while the last Redis operation succeeded (gauge)",
    **{f"drops_{r}": f"datagrams dropped: {r.replace('_', ' ')}" for r in DROP_REASONS},
}
NAMES = tuple(COUNTERS)
INDEX = {name: i for i, name in enumerate(NAMES)}
GAUGES = {"flows_active", "flows_pending", "redis_up"}


def shared_block(workers: int):
    """One unsynchronised uint64 row per worker (each row has a single writer)."""
    return multiprocessing.get_context("fork").Array("Q", workers * len(NAMES), lock=False)


@dataclass
class Drops:
    """Drop counts by reason (slow path only, so a dict is fine)."""

    counts: dict[str, int]

    @classmethod
    def new(cls) -> "Drops":
        return cls({r: 0 for r in DROP_REASONS})

    def add(self, reason: str, n: int = 1) -> None:
        self.counts[reason] += n


PREFIX = "voiceedge_relay_"


def totals_from_text(text: str) -> dict[str, int]:
    """Relay counters in Prometheus exposition ``text``, summed over workers, named as in
    COUNTERS (without the ``voiceedge_relay_`` prefix and the ``_total`` suffix)."""
    out: dict[str, int] = {}
    for counters in workers_from_text(text).values():
        for name, value in counters.items():
            out[name] = out.get(name, 0) + value
    return out


def workers_from_text(text: str) -> dict[str, dict[str, int]]:
    """Relay counters in Prometheus exposition ``text`` per worker (its ``worker`` label)."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        # The parser strips _total from a counter's name; an untyped family would keep it.
        name = family.name.removeprefix(PREFIX).removesuffix("_total")
        # A counter's value is its <name>_total sample (not _created); a gauge's is <name>.
        value = f"{family.name}_total" if family.type == "counter" else family.name
        for sample in family.samples:
            if sample.name == value:
                row = out.setdefault(sample.labels.get("worker", ""), {})
                row[name] = row.get(name, 0) + sample.value
    return {w: {k: int(v) for k, v in row.items()} for w, row in out.items()}


def scrape(url: str, timeout: float = 2.0, per_worker: bool = False) -> dict:
    """A relay's counters from its Prometheus endpoint, summed (``totals_from_text``) or
    per worker (``workers_from_text``)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    return workers_from_text(text) if per_worker else totals_from_text(text)
