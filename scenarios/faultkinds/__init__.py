"""The fault kinds a scenario's ``faults:`` list may name: one module per kind, one registry.

Each module here defines a ``FaultKind`` subclass (base.py) and ``KIND``, its one instance.
``KINDS`` maps each kind's name to it, in the order the docs and error messages list them: a
new kind is a new module and its name in ``_MODULES`` (docs/faults.md, "Adding a fault
kind")."""
from __future__ import annotations

from importlib import import_module
from types import MappingProxyType

from scenarios.faultkinds.base import LINK_TIERS, FaultKind, Options

_MODULES = ("relay_kill", "redis_down", "transceiver_crash", "cluster_outage", "link_down",
            "loss_burst", "nat_rebind", "ice_restart", "handover")

KINDS: MappingProxyType[str, FaultKind] = MappingProxyType({
    k.name: k for k in (import_module(f"{__name__}.{m}").KIND for m in _MODULES)})

__all__ = ["KINDS", "LINK_TIERS", "FaultKind", "Options"]
