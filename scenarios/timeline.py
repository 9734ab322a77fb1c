"""One time-ordered timeline of everything the services and clients of a run logged.

Every service logs one JSON object per line with ``ts`` (UTC, microseconds), ``level``,
``service`` and ``event``. ``merge_timeline`` reads every ``*.log`` of a folder, tags each
record with the file it came from (``source``), sorts by ``ts`` and writes
``timeline.jsonl``. Lines that are not such records (redis-server's own log, a crash trace)
are left out of the timeline and counted in its last line (``event: timeline_skipped``).
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

TIMELINE = "timeline.jsonl"


def _records(path: Path) -> tuple[list[dict], int]:
    records, skipped = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if not isinstance(record, dict) or not isinstance(record.get("ts"), str):
            skipped += 1
            continue
        record["source"] = path.stem
        records.append(record)
    return records, skipped


def merge_timeline(folder: Path) -> Path:
    """Merge ``folder/*.log`` into ``folder/timeline.jsonl``; returns its path."""
    records, skipped = [], {}
    for path in sorted(folder.glob("*.log")):
        got, bad = _records(path)
        records.extend(got)
        if bad:
            skipped[path.stem] = bad
    records.sort(key=lambda r: r["ts"])  # ISO-8601 UTC with a fixed width sorts as text
    out = folder / TIMELINE
    with open(out, "w") as f:
        for record in records:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
        if skipped:
            ts = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            f.write(json.dumps({"ts": ts, "level": "INFO", "service": "runner",
                                "event": "timeline_skipped", "lines_not_json": skipped}) + "\n")
    return out
