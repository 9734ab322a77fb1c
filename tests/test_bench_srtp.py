"""bench/srtp_floor: the SRTP crypto microbenchmark builds, round-trips its packets and
reports every case; bad arguments are refused without a trace."""
from __future__ import annotations


import pytest

from bench import srtp_floor
from voiceedge.cli import main



def test_every_case_round_trips_and_costs_something():
    # The binary fails a round when a packet does not unprotect (libsrtp) or a GCM tag does
    # not verify (OpenSSL), so numbers at all mean every packet came back.
    result = srtp_floor.run(packets=300, rounds=3, payload=160)
    assert (result["packets"], result["rounds"], result["payload_bytes"]) == (300, 3, 160)
    for key, _ in srtp_floor.CASES:
        assert 0 < result[key]["protect_us"] < 1000 and 0 < result[key]["unprotect_us"] < 1000
    text = "\n".join(srtp_floor.lines(result))
    assert "AEAD_AES_256_GCM" in text and "OpenSSL" in text


@pytest.mark.parametrize("argv", [["--packets", "0"], ["--rounds", "100"], ["--payload", "2000"]])
def test_bad_arguments_are_a_message(argv, capsys):
    assert main(["bench", "srtp", *argv]) != 0
    err = capsys.readouterr().err
    assert "--packets 1..60000" in err and "Traceback" not in err
