"""Checks of service logs (services/logs.py): every line one JSON object with the common keys."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


def service_records(text: str, service: str) -> list[dict]:
    """Parse a service's stderr; fail on any line that is not a well-formed record of it."""
    records = []
    lines = text.splitlines()
    assert lines, f"{service} logged nothing"
    for line in lines:
        record = json.loads(line)  # raises on a plain-text line
        assert isinstance(record, dict), line
        assert TS.fullmatch(record["ts"]), line
        when = datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
        assert abs((datetime.now(timezone.utc) - when).total_seconds()) < 600, line  # UTC
        assert record["level"] in LEVELS, line
        assert record["service"] == service, line
        assert isinstance(record["event"], str) and record["event"], line
        assert isinstance(record["pid"], int), line
        records.append(record)
    return records


def events(records: list[dict], name: str) -> list[dict]:
    return [r for r in records if r["event"] == name]
