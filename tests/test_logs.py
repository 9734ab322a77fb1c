"""Service logs (services/logs.py): the formatter, and real processes' stderr line by line."""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone

import aiohttp
import pytest

from services.logs import Event, JsonFormatter, log_event
from tests.conftest import REPO
from tests.logcheck import events, service_records


def record(msg, level=logging.INFO, name="voiceedge.relay", args=None, exc_info=None):
    return logging.LogRecord(name, level, __file__, 1, msg, args, exc_info)


def test_an_event_is_one_json_line_with_the_common_keys_first():
    r = record(Event("flow_created", {"client": "10.0.0.7:5000", "hops": ("a", 1), "n": None}),
               logging.WARNING)
    line = JsonFormatter("relay").format(r)
    [parsed] = service_records(line, "relay")
    assert list(parsed)[:5] == ["ts", "level", "service", "pid", "event"]
    assert parsed == {"ts": parsed["ts"], "level": "WARNING", "service": "relay",
                      "pid": r.process, "event": "flow_created", "client": "10.0.0.7:5000",
                      "hops": ["a", 1], "n": None}
    when = datetime.strptime(parsed["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert abs(when.timestamp() - r.created) < 1e-5


def test_timestamps_are_utc_whatever_the_local_zone(monkeypatch):
    monkeypatch.setenv("TZ", "Pacific/Chatham")  # +12:45 / +13:45
    time.tzset()
    try:
        r = record(Event("x"))
        r.created = 1_800_000_000.123456
        parsed = json.loads(JsonFormatter("agent").format(r))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert parsed["ts"] == "2027-01-15T08:00:00.123456Z"


def test_other_libraries_records_and_exceptions_stay_on_one_line():
    try:
        1 / 0
    except ZeroDivisionError:
        exc_info = sys.exc_info()
    r = record("ICE check %s\nfailed", logging.ERROR, name="aioice.ice", args=("x",),
               exc_info=exc_info)
    line = JsonFormatter("transceiver").format(r)
    assert "\n" not in line
    [parsed] = service_records(line, "transceiver")
    assert (parsed["event"], parsed["logger"], parsed["message"]) == (
        "log", "aioice.ice", "ICE check x\nfailed")
    assert "ZeroDivisionError" in parsed["exc"] and "Traceback" in parsed["exc"]


def test_reserved_field_names_are_refused():
    for key in ("ts", "service", "pid", "event", "source"):  # (level is log_event's argument)
        with pytest.raises(ValueError, match="reserved"):
            log_event(logging.getLogger("voiceedge.test"), "x", **{key: 1})
        with pytest.raises(ValueError, match="reserved"):
            Event("x", {key: 1})


def test_an_event_reads_as_json_in_handlers_that_are_not_ours(caplog):
    caplog.set_level(logging.INFO, "voiceedge.test")
    log_event(logging.getLogger("voiceedge.test"), "call_created", call="c~0~s")
    [r] = caplog.records
    assert json.loads(r.getMessage()) == {"event": "call_created", "call": "c~0~s"}


SCRIPT = textwrap.dedent("""
    import logging, os, threading, warnings
    from services.logs import configure_service_logging, log_event
    configure_service_logging("probe", logging.INFO)
    log = logging.getLogger("voiceedge.probe")
    log_event(log, "hello", n=1)
    logging.getLogger("somelib").warning("plain %s", "text")
    logging.getLogger("aioice.ice").info("chatty: hidden unless debugging")
    warnings.warn("careful")
    pid = os.fork()
    if pid == 0:
        log_event(log, "from_child")
        os._exit(0)
    os.waitpid(pid, 0)
    def boom():
        raise ValueError("in a thread")
    t = threading.Thread(target=boom, name="worker-1")
    t.start(); t.join()
    raise RuntimeError("boom")
""")


def test_a_configured_process_logs_only_json_even_warnings_crashes_and_forks():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout == ""
    records = service_records(proc.stderr, "probe")
    assert [r["event"] for r in records] == [
        "hello", "log", "log", "from_child", "uncaught_exception", "uncaught_exception"]
    hello, plain, warned, child, thread, main = records
    assert hello["n"] == 1 and hello["level"] == "INFO"
    assert (plain["logger"], plain["message"], plain["level"]) == ("somelib", "plain text",
                                                                   "WARNING")
    assert warned["logger"] == "py.warnings" and "careful" in warned["message"]
    assert child["pid"] != hello["pid"]
    assert thread["thread"] == "worker-1" and "ValueError: in a thread" in thread["exc"]
    assert main["level"] == "CRITICAL" and "RuntimeError: boom" in main["exc"]
    assert records == sorted(records, key=lambda r: r["ts"])


def _wait_for_line(path, event: str, proc: subprocess.Popen, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if json.loads(line)["event"] == event:
                return json.loads(line)
        assert proc.poll() is None, path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no {event} in {path.read_text()}")


def test_the_agent_process_logs_json_lines_only_including_library_records(tmp_path):
    """``voiceedge -v agent``: its own events and asyncio's debug records, all JSON."""
    log_path = tmp_path / "agent.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "voiceedge", "-v", "agent", "--listen",
                                 "127.0.0.1", "--port", "0"], stdout=log, stderr=log, cwd=REPO)
    try:
        port = _wait_for_line(log_path, "agent_started", proc)["port"]

        async def one_session():
            async with aiohttp.ClientSession() as http:
                ws = await http.ws_connect(f"http://127.0.0.1:{port}/v1/sessions/t1")
                await ws.send_json({"type": "session.started", "session_id": "t1"})
                assert json.loads((await ws.receive(timeout=5)).data)["type"] == "session.created"
                await ws.close()

        asyncio.run(one_session())
        _wait_for_line(log_path, "session_closed", proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert proc.returncode == 0
    records = service_records(log_path.read_text(), "agent")
    names = [r["event"] for r in records]
    for name in ("agent_started", "session_opened", "session_closed", "agent_stopped"):
        assert names.count(name) == 1, names
    assert any(r["event"] == "log" and r["logger"] == "asyncio" for r in records)
    [closed] = events(records, "session_closed")
    assert closed["session"] == "t1" and closed["events_in"] == 1
