"""Make the impairment backend asked for, or the one this kernel supports."""
from __future__ import annotations

import logging

from topology.impairment.backend import (BACKENDS, BackendUnavailable, ImpairmentBackend,
                                         detect)
from topology.impairment.netem import NetemBackend
from topology.impairment.seed import seed_from_env
from topology.impairment.userspace import UserspaceBackend

log = logging.getLogger("voiceedge.impairment")

def make_backend(name: str | None = None, **options) -> ImpairmentBackend:
    """The backend called ``name``, or the one this kernel supports when ``name`` is None
    (``detect``; the choice and its reason are logged). ``options`` go to the backend's
    constructor. Asking for netem on a kernel without it is an error, never a silent run
    without impairment."""
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown impairment backend {name!r} (choose from {', '.join(BACKENDS)})")
    if name is None:
        found = detect()
        name = found.name
        log.info("impairment backend: %s (chosen automatically: %s)", name, found.reason)
    elif name == "netem":
        found = detect()
        if found.name != "netem":
            raise BackendUnavailable(f"the netem backend was asked for, but {found.reason}; "
                                     f"use the userspace backend")
        log.info("impairment backend: netem (asked for; %s)", found.reason)
    else:
        log.info("impairment backend: %s (asked for)", name)
    if name == "netem":
        return NetemBackend(**options)
    if options.get("seed") is None:
        options["seed"] = seed_from_env()
    return UserspaceBackend(**options)
