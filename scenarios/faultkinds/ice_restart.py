"""``ice_restart``: the callers of a client region (target ``last_mile/R``) restart ICE on their
live calls, on the same path: each sends a new ice-ufrag, ice-pwd and its candidates in a
``PATCH`` of its call through its region's front to the transceiver that owns the session
(RFC 8445 section 9, the WHIP shape of RFC 9725: docs/mobility.md) and checks again; the
session, its DTLS association and its agent stay, and the media stays on the old pair until
the new one is nominated. The project's aiortc clients restart (their process is sent
SIGUSR1); Chromium's sessions are not asked to."""
from __future__ import annotations

import signal
import time

from analysis.faulteffect import GAP_OVER_RTT
from scenarios.faultkinds.base import FaultKind


class IceRestart(FaultKind):
    name = "ice_restart"
    targets = ("last_mile",)
    measures = (GAP_OVER_RTT,)  # the gap beyond one RTT (target: at most 50 ms)

    def apply(self, run):
        t, r = run.spec.target, run.record
        r.at_unix = r.end_unix = r.ready_unix = time.time()   # before any client can act on it
        told = run.signal_clients(t.region, signal.SIGUSR1)
        if not told:
            raise RuntimeError(f"no aiortc client process of {t.region} is running")


KIND = IceRestart()
