"""``voiceedge bench tokencheck``: three real fronts (two open, one with keys) before one
real transceiver, calls in turn; the keyed front's calls carry a token and are placed."""
from __future__ import annotations

import subprocess
import sys

from bench import tokencheck
from tests.conftest import REPO


def test_the_bench_places_every_call_through_each_front_and_reports_medians(caplog):
    result = tokencheck.run(calls=8)
    assert result.calls == 8
    for value in (result.authenticate_token_us, result.authenticate_key_us,
                  result.post_open_ms, result.post_control_ms, result.post_keyed_ms,
                  result.front_open_ms, result.front_control_ms, result.front_keyed_ms):
        assert value > 0
    # the round trip at the client holds the front's own time
    assert result.post_keyed_ms > result.front_keyed_ms and result.post_open_ms > result.front_open_ms
    lines = tokencheck.lines(result)
    assert lines[0].startswith("token check, alone") and "front_ms" in lines[-1]


def test_bad_input_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "bench", "tokencheck", "--calls",
                           "1"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "--calls 5..5000" in proc.stderr
    assert "Traceback" not in proc.stderr
