"""The registry of edge architectures: every module of this package that defines
``ARCHITECTURE`` (an ``Architecture``, scenarios/architectures/base.py) is one, so a new
architecture is one new file here. External architectures (external.py) are declared by
scenario files instead, and resolved through ``Scenario.architecture``.
"""
from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from scenarios.architectures.base import BASELINE, Architecture


@cache
def registry() -> dict[str, Architecture]:
    """Name -> architecture, in their ``order``."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        arch = getattr(module, "ARCHITECTURE", None)
        if isinstance(arch, Architecture):
            found.append(arch)
    out = {a.name: a for a in sorted(found, key=lambda a: (a.order, a.name))}
    if len(out) != len(found):
        raise RuntimeError("two architecture modules share a name")
    baselines = [a.name for a in out.values() if a.role == BASELINE]
    if len(baselines) != 1:
        raise RuntimeError(f"exactly one architecture is the baseline, not {baselines}")
    return out


def names() -> tuple[str, ...]:
    return tuple(registry())


def default_names() -> tuple[str, ...]:
    """What a scenario runs when its file names no architectures."""
    return tuple(n for n, a in registry().items() if a.default)


def baseline() -> str:
    return next(n for n, a in registry().items() if a.role == BASELINE)


def get(name: str) -> Architecture:
    """The registered architecture ``name``; KeyError if there is none."""
    try:
        return registry()[name]
    except KeyError:
        raise KeyError(f"no architecture {name!r} (choose from {', '.join(registry())})") \
            from None
