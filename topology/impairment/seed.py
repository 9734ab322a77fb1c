"""The seed of the userspace engine's draws, from the environment (light: read by every
command at start, before anything heavy is imported)."""
from __future__ import annotations

import os

# Repeatable loss and delay draws for the userspace engine (each queue's stream seeded from
# this plus its queue number): a test suite or a CI gate sets it so that a correct world cannot
# fail its calibration by the draw's chance (docs/impairment.md, "Repeatable draws").
SEED_ENV = "VOICEEDGE_IMPAIRMENT_SEED"


def seed_from_env() -> int | None:
    """The seed that ``SEED_ENV`` sets, or None; ValueError when it is not an integer."""
    text = os.environ.get(SEED_ENV, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{SEED_ENV} must be an integer, not {text!r}") from None
