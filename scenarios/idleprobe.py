"""A process that does nothing but watch its own event loop's lag (services/lag.py), run by a
scenario beside its clients at their priority (``python -m scenarios.idleprobe``).

A client's lagged second may be its own work or the host's: this process has no work, so each
second it lags is the host's alone. The runner counts its lagged seconds over the calls
(``host_cpu.json``, ``idle_probe``) next to where the CPU went.
"""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from services.lifecycle import serve_until_signal
from services.logs import configure_service_logging

SERVICE = "idle-probe"


@asynccontextmanager
async def _nothing():
    yield None


def main() -> None:
    configure_service_logging(SERVICE)
    serve_until_signal(_nothing, logging.getLogger(f"voiceedge.{SERVICE}"))


if __name__ == "__main__":
    main()
