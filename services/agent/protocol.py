"""The agent protocol's wire format (docs/agent-protocol.md): session ids, parsing, server events."""
from __future__ import annotations

import json
import re
from typing import Any

from services.agent.pcm import FRAME_BYTES, FRAME_MS, SAMPLE_RATE

SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
AUDIO_FORMAT = {"encoding": "pcm_s16le", "sample_rate": SAMPLE_RATE, "channels": 1,
                "frame_ms": FRAME_MS, "frame_bytes": FRAME_BYTES}

# Control events from the transceiver; every other event type is a forwarded client event.
SESSION_STARTED = "session.started"
SESSION_ENDED = "session.ended"
# Control event to the transceiver: drop the reply frames it holds for the session (a barge-in)
OUTPUT_AUDIO_BUFFER_CLEAR = "output_audio_buffer.clear"


class BadEvent(ValueError):
    """A text message that is not one JSON object with a string "type"."""


def valid_session_id(session_id: str) -> bool:
    return SESSION_ID.fullmatch(session_id) is not None


def parse_event(text: str) -> dict[str, Any]:
    try:
        event = json.loads(text)
    except ValueError as exc:
        raise BadEvent(f"not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise BadEvent(f"not a JSON object but {type(event).__name__}")
    kind = event.get("type")
    if not isinstance(kind, str) or not kind:
        raise BadEvent('no "type" string')
    return event


def dump(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


def error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, **extra}


OPUS_FORMAT = {"encoding": "opus", "sample_rate": SAMPLE_RATE, "channels": 1, "frame_ms": FRAME_MS}
OPUS_MAX_BYTES = 1275   # the largest Opus packet (RFC 6716 3.4)


def session_created(session_id: str, mode: str, codec: str = "pcm16",
                    link: str | None = None) -> dict[str, Any]:
    event = {"type": "session.created", "session_id": session_id, "mode": mode,
             "audio": OPUS_FORMAT if codec == "opus" else AUDIO_FORMAT}
    if link is not None:
        event["frames"] = {"link": link}
    return event


def echo(event: dict[str, Any]) -> dict[str, Any]:
    return {"type": "agent.echo", "event": event}


def _unix(t: float | None) -> float | None:
    return None if t is None else round(t, 6)


def speech_started(audio_ms: int, audio_unix: float | None = None,
                   detected_unix: float | None = None) -> dict[str, Any]:
    """``audio_start_unix``: when the first voiced frame arrived; ``detected_unix``: when the
    VAD said so (wall clock, seconds)."""
    return {"type": "input_audio_buffer.speech_started", "audio_start_ms": audio_ms,
            "audio_start_unix": _unix(audio_unix), "detected_unix": _unix(detected_unix)}


def speech_stopped(audio_ms: int, audio_unix: float | None = None,
                   detected_unix: float | None = None) -> dict[str, Any]:
    """``audio_end_unix``: when the last voiced frame arrived; ``detected_unix``: when the
    hangover ran out."""
    return {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": audio_ms,
            "audio_end_unix": _unix(audio_unix), "detected_unix": _unix(detected_unix)}


def response_created(response_id: str) -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": response_id, "status": "in_progress"}}


def output_audio_buffer_clear(response_id: str) -> dict[str, Any]:
    return {"type": OUTPUT_AUDIO_BUFFER_CLEAR, "response_id": response_id}


def response_audio_done(response_id: str, frames: int) -> dict[str, Any]:
    return {"type": "response.audio.done", "response_id": response_id, "frames": frames}


def response_done(response_id: str, frames: int, first_frame_unix: float | None = None,
                  cancelled: bool = False, cancelled_unix: float | None = None,
                  late_frames: int | None = None) -> dict[str, Any]:
    """``first_frame_unix``: when the reply's first frame went to the transceiver (None: no
    frame did); ``cancelled_unix``: when a barge-in cancelled it; ``late_frames``: its frames
    the agent sent later than its lead covers (each may have left 20 ms of silence in it)."""
    cancelled = cancelled or cancelled_unix is not None
    response: dict[str, Any] = {"id": response_id,
                                "status": "cancelled" if cancelled else "completed",
                                "frames": frames, "first_frame_unix": _unix(first_frame_unix)}
    if late_frames is not None:
        response["late_frames"] = late_frames
    if cancelled:
        response["status_details"] = {"reason": "turn_detected"}
        response["cancelled_unix"] = _unix(cancelled_unix)
    return {"type": "response.done", "response": response}
