"""The fault kinds a scenario's ``faults:`` list may name: one module per kind, one registry.

``KINDS`` maps each kind's name to it, in the order the docs and error messages list them.
A new kind is a new module here (a ``FaultKind`` subclass, see base.py) and one entry below;
docs/faults.md, "Adding a fault kind"."""
from __future__ import annotations

from types import MappingProxyType

from scenarios.faultkinds.base import LINK_TIERS, FaultKind, Options
from scenarios.faultkinds.cluster_outage import ClusterOutage
from scenarios.faultkinds.link_down import LinkDown
from scenarios.faultkinds.loss_burst import LossBurst
from scenarios.faultkinds.redis_down import RedisDown
from scenarios.faultkinds.relay_kill import RelayKill
from scenarios.faultkinds.transceiver_crash import TransceiverCrash

KINDS: MappingProxyType[str, FaultKind] = MappingProxyType({k.name: k for k in (
    RelayKill(), RedisDown(), TransceiverCrash(), ClusterOutage(), LinkDown(), LossBurst())})

__all__ = ["KINDS", "LINK_TIERS", "FaultKind", "Options"]
