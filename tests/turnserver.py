"""A real coturn for tests: Debian's turnserver on a free port, started and stopped around a
test (optionally inside a namespace), configured by services/turn/coturn.py."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from services.turn import coturn, credentials
from tests.conftest import free_port
from topology.netns import in_namespace


class Coturn:
    """``with Coturn(tmp, "127.0.0.1", peers=(...)) as turn:`` a running TURN server;
    ``turn.secret``, ``turn.port``, ``turn.config``, ``turn.log()``."""

    def __init__(self, workdir: Path, address: str, peers: tuple[str, ...] = (),
                 netns: str | None = None, relay_ports: tuple[int, int] = (42000, 42099)) -> None:
        if shutil.which("turnserver") is None:
            pytest.fail("turnserver is not installed: run `make test`, which installs coturn")
        self.secret = credentials.new_secret()
        self.netns = netns
        secret_file = credentials.write_secret(workdir / "turn.secret", self.secret)
        self.port = in_namespace(netns, free_port) if netns else free_port()
        self.config = coturn.TurnServerConfig(address, secret_file, workdir, port=self.port,
                                              relay_ports=relay_ports, peers=peers)
        self.out = workdir / "turn.out"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Coturn":
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                prefix + coturn.turnserver_cmd(coturn.write_config(self.config)),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 10
        ask = lambda: coturn.answers_binding(self.config.address, self.port, 0.2)  # noqa: E731
        while not (in_namespace(self.netns, ask) if self.netns else ask()):
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, "coturn did not answer in 10 s:\n" + self.log()
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.out.read_text(errors="replace")
