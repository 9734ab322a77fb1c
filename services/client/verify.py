"""What a session checks came back from the edge, and how it tells (docs/client.md, Verification).

The checks (their names are the ones results files carry, ``verifies`` and ``verified``):

- ``audio``: the tone's echo (its level decoded, or voiced payload sizes for a light client);
- ``datachannel``: the event the client sent on the data channel came back, as it was (a raw
  echo) or inside the agent protocol's envelope, ``{"type": "agent.echo", "event": ...}``;
- ``envelope``: it came back inside that envelope (the project's agent does this; an external
  edge may echo raw or not at all). Asking for ``envelope`` asks for ``datachannel`` too.

What a session verifies is the architecture's to declare; the default is the project's edge.
"""
from __future__ import annotations

import json

AUDIO, DATACHANNEL, ENVELOPE = "audio", "datachannel", "envelope"
CHECKS = (AUDIO, DATACHANNEL, ENVELOPE)
DEFAULT_VERIFIES = CHECKS
ECHO_TYPE = "agent.echo"   # the agent protocol's envelope of an echoed event (docs/agent-protocol.md)
RAW = "raw"                # a data-channel echo as it was sent (``datachannel_echo``)


def parse_verifies(text: str | tuple | list) -> tuple[str, ...]:
    """``audio,datachannel,envelope`` (or a sequence of names) -> the checks in CHECKS order;
    ``envelope`` brings ``datachannel``. ValueError (one line) for an unknown name."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}: choose from "
                         f"{', '.join(CHECKS)}")
    chosen = set(names) | ({DATACHANNEL} if ENVELOPE in names else set())
    return tuple(c for c in CHECKS if c in chosen)


def echo_form(sent: dict | None, message: str | bytes) -> str | None:
    """How a data-channel ``message`` echoes the ``sent`` event: ENVELOPE, RAW, or None."""
    if sent is None:
        return None
    try:
        event = json.loads(message)
    except ValueError:
        return None
    if event == sent:
        return RAW
    if isinstance(event, dict) and event.get("type") == ECHO_TYPE and event.get("event") == sent:
        return ENVELOPE
    return None


def datachannel_counts(verifies: tuple[str, ...], echo: str | None) -> bool:
    """Whether a data-channel echo of form ``echo`` verifies the channel: only the envelope
    when ``envelope`` is asked for, either form otherwise."""
    return echo == ENVELOPE if ENVELOPE in verifies else echo is not None


def verified(verifies: tuple[str, ...], audio: bool, echo: str | None) -> list[str]:
    """The checks of ``verifies`` that passed, given the audio echo and the data-channel
    echo's form."""
    passed = {AUDIO: audio, DATACHANNEL: datachannel_counts(verifies, echo),
              ENVELOPE: echo == ENVELOPE}
    return [c for c in verifies if passed[c]]
