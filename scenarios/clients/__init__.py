"""The client types a scenario's ``clients`` mix may name, and the commands of a region's mix.

A mix maps client type -> sessions per client region, e.g. ``{aiortc: 7, chromium: 1}``
(``sessions_per_region: N`` is ``{aiortc: N}``). Each type is one module here; a new one is a
module and a line in ``REGISTRY``. The runner (scenarios/runner.py) and a deployment target
(scenarios/target.py) start what ``commands`` returns: the types with a ready event first.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from scenarios.clients.aiortc import AiortcClient
from scenarios.clients.base import MAX_PER_REGION, ClientCommand, ClientType, RegionClients
from scenarios.clients.chromium import ChromiumClient

if TYPE_CHECKING:
    from scenarios.spec import Scenario

# In this order a region's sessions are numbered and its processes listed.
REGISTRY: dict[str, ClientType] = {t.name: t for t in (AiortcClient(), ChromiumClient())}
CLIENT_TYPES = tuple(REGISTRY)

__all__ = ["CLIENT_TYPES", "REGISTRY", "ClientCommand", "ClientType", "RegionClients",
           "client_type", "commands", "needs_browser", "parse_mix", "results_suffixes"]


def client_type(name: str) -> ClientType:
    """The registered client type ``name``; KeyError names the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown client type {name!r}: {', '.join(CLIENT_TYPES)}") from None


def parse_mix(mix) -> dict[str, int]:
    """A ``clients`` mapping checked against the registry, in the registry's order, zero
    counts dropped. ValueError (one line, the field's own words) for anything else."""
    if not isinstance(mix, dict) or not mix or set(mix) - set(CLIENT_TYPES):
        raise ValueError(f"a mapping of client type to sessions per region, types "
                         f"{', '.join(CLIENT_TYPES)} ({mix!r})")
    for name, n in mix.items():
        kind = REGISTRY[name]
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_PER_REGION:
            raise ValueError(f"{name}: 0..{MAX_PER_REGION} sessions ({n!r})")
        if n > kind.max_per_region:
            raise ValueError(f"{name}: at most {kind.max_per_region} per region "
                             f"({kind.max_reason})")
    out = {name: mix[name] for name in CLIENT_TYPES if mix.get(name)}
    if not out:
        raise ValueError("at least one session")
    return out


def needs_browser(mix: dict[str, int]) -> bool:
    """Whether any client type of the mix needs Chromium (make browsers)."""
    return any(REGISTRY[name].needs_browser for name, n in mix.items() if n)


def commands(scenario: "Scenario", where: RegionClients,
             verifies: tuple[str, ...] | None = None,
             extra_args: tuple[str, ...] | list[str] = ()) -> list[ClientCommand]:
    """The client processes of one region: one per client type of the scenario's mix, its
    sessions numbered after the previous types' (so (region, session) names one session);
    the types with a ready event first. ``verifies`` and ``extra_args``: the architecture's
    (what its clients check, its ICE options)."""
    out, base = [], 0
    for name, n in scenario.clients.items():
        if not n:
            continue
        kind = client_type(name)
        out.append(ClientCommand(
            name, f"{kind.process}-{where.region}",
            tuple(kind.argv(scenario, where, n, base, verifies, tuple(extra_args))), n,
            kind.ready_event, kind.ready_timeout_s(n), kind.realtime))
        base += n
    return sorted(out, key=lambda c: c.ready_event is None)


def results_suffixes() -> tuple[str, ...]:
    """Every client type's results-file suffix: sessions-REGION{suffix}.jsonl."""
    return tuple(t.results_suffix for t in REGISTRY.values())
