"""Service logs: one JSON object per line on stderr.

Every line has ``ts`` (UTC, ISO 8601 with microseconds and a ``Z``), ``level`` (Python's
level name: ``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``, ``CRITICAL``), ``service``, ``pid`` and
``event``, then the event's own fields::

    {"ts": "2026-11-30T10:12:13.123456Z", "level": "INFO", "service": "relay", "pid": 4242,
     "event": "flow_created", "client": "10.0.0.7:50000", ...}

Services log events with ``log_event(log, "flow_created", client=...)``. Records of other
libraries (aiortc, aioice, aiohttp, asyncio, warnings) become ``"event": "log"`` with ``logger``
and ``message``; an exception adds ``exc`` (the traceback as one string). So every line of a
service's log parses, and the logs of a run merge into one timeline by ``ts``.
"""
from __future__ import annotations

import json
import logging
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TextIO

# Keys of every line; "source" is added by the run's timeline merge (the log file's name).
RESERVED = ("ts", "level", "service", "pid", "event", "source")
# Libraries that log every ICE check or packet at INFO: WARNING unless debugging.
CHATTY = ("aioice", "aiortc")


@dataclass(frozen=True)
class Event:
    """A log record's message: an event name and its fields (str() is the JSON of both, for
    handlers that are not ours, such as pytest's)."""

    name: str
    fields: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_fields(self.name, self.fields)

    def __str__(self) -> str:
        return json.dumps({"event": self.name, **self.fields}, default=str)


def _check_fields(event: str, fields: dict[str, Any]) -> None:
    clash = [k for k in fields if k in RESERVED]
    if clash:
        raise ValueError(f"event {event!r}: field names {clash} are reserved")


def log_event(logger: logging.Logger, event: str, /, *, level: int = logging.INFO,
              exc_info=None, **fields: Any) -> None:
    """Log ``event`` with ``fields`` (JSON-serialisable; anything else is logged as str()).
    A reserved field name raises ValueError, whether or not the level is enabled."""
    _check_fields(event, fields)
    if logger.isEnabledFor(level):
        logger.log(level, Event(event, fields), exc_info=exc_info)


def utc_timestamp(created: float) -> str:
    """A record's time as ``2026-11-30T10:12:13.123456Z``."""
    return datetime.fromtimestamp(created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class JsonFormatter(logging.Formatter):
    """Formats any record as one JSON object (no newline inside: JSON escapes them)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": utc_timestamp(record.created),
                               "level": record.levelname, "service": self.service,
                               "pid": record.process}
        if isinstance(record.msg, Event):
            out["event"] = record.msg.name
            out.update(record.msg.fields)
        else:
            out.update(event="log", logger=record.name, message=record.getMessage())
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


def configure_service_logging(service: str, level: int = logging.INFO,
                              stream: TextIO | None = None) -> logging.Handler:
    """Make this process log JSON lines to ``stream`` (stderr): call once, first thing, in a
    service's entry point. Replaces the root logger's handlers; also routes warnings and
    uncaught exceptions (main thread and other threads) through the log. Child processes made
    by fork inherit all of it."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET if level <= logging.DEBUG
                                         else logging.WARNING)
    logging.captureWarnings(True)
    log = logging.getLogger(f"voiceedge.{service}")

    def uncaught(exc_type, exc, tb) -> None:
        log_event(log, "uncaught_exception", level=logging.CRITICAL, exc_info=(exc_type, exc, tb))

    def uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        log_event(log, "uncaught_exception", level=logging.CRITICAL,
                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
                  thread=args.thread.name if args.thread else None)

    sys.excepthook = uncaught
    threading.excepthook = uncaught_in_thread
    return handler
