"""Shared fixtures: real processes (redis-server, relays) on loopback, cleaned up afterwards."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def as_nobody() -> list[str]:
    """The command prefix that runs a command as user nobody, for tests of the not-root paths.

    Skips when this cannot run: without root or setpriv, or when the checkout itself is not
    readable by other users (e.g. a clone inside a 0700 directory), so that nobody cannot
    even import the project: there the test would measure the checkout's permissions.
    """
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("switching to user nobody needs root and setpriv (util-linux)")
    probe = subprocess.run([*AS_NOBODY, sys.executable, "-c", "import voiceedge"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot import the project from {REPO} (a directory on the "
                    "way is not readable by other users); clone it somewhere readable")
    return list(AS_NOBODY)


def lab_fixture(prefix: str):
    """A module-scoped ``lab`` fixture: a one-host lab namespace named after ``prefix``
    (topology/netns.py), which needs root. Use as ``lab = lab_fixture("vexyz")``."""

    @pytest.fixture(scope="module")
    def lab():
        if os.geteuid() != 0:
            pytest.skip("needs root for a network namespace")
        from topology.netns import lab_namespace

        with lab_namespace(prefix) as ns:
            yield ns

    return lab


async def until(predicate, timeout: float = 10.0) -> None:
    """Poll ``predicate()`` every 20 ms in the running loop until it holds (else fail)."""
    import asyncio

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A real redis-server on a free loopback port, without persistence."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: run `make test`, which installs it")
        self.binary, self.workdir = binary, workdir
        self.port = free_port(socket.SOCK_STREAM)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RedisServer":
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=5)
            self.proc = None


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


class RelayProcess:
    """``voiceedge relay`` as a child process, with its Prometheus counters readable."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self.metrics_port = free_port(socket.SOCK_STREAM)
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RelayProcess":
        cmd = [sys.executable, "-m", "voiceedge", "relay", *self.args,
               "--metrics", f"127.0.0.1:{self.metrics_port}", "--cpus", "none"]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=REPO)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"relay exited: {self.log_path.read_text()}")
            try:
                self.metrics()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("relay did not start")

    def metrics_by_worker(self) -> dict[str, dict[str, float]]:
        """{counter: {worker: value}}, names without the voiceedge_relay_ prefix and _total."""
        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=2).read().decode()
        out: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.startswith("voiceedge_relay_") or "worker" not in sample.labels:
                    continue
                if sample.name.endswith("_created"):  # the client library's creation stamps
                    continue
                name = sample.name.removeprefix("voiceedge_relay_").removesuffix("_total")
                out.setdefault(name, {})[sample.labels["worker"]] = sample.value
        return out

    def metrics(self) -> dict[str, float]:
        """Counters summed over workers."""
        return {name: sum(v.values()) for name, v in self.metrics_by_worker().items()}

    def wait_for(self, predicate, timeout: float = 5.0) -> dict[str, float]:
        """Poll the counters until ``predicate(counters)`` holds; return them."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if predicate(m):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"counters never matched: {m}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the relay and its workers: a crash, nothing flushed."""
        if self.proc is not None:
            subprocess.run(["pkill", "-KILL", "-P", str(self.proc.pid)], check=False)
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
            self.proc = None

    def log(self) -> str:
        return self.log_path.read_text()


@pytest.fixture
def relay_factory(tmp_path):
    started: list[RelayProcess] = []

    def make(args: list[str]) -> RelayProcess:
        relay = RelayProcess(args, tmp_path / f"relay-{len(started)}.log")
        started.append(relay)
        return relay.start()

    yield make
    for relay in started:
        relay.stop()


def run_scenario(path: Path, region: str, out: Path, env: dict | None = None,
                 timeout: float = 600, args: tuple[str, ...] = ()) -> tuple[dict, Path]:
    """``voiceedge scenario`` as a child process (with ``args`` added); returns (summary,
    results folder)."""
    import json
    import os

    proc = subprocess.run([sys.executable, "-m", "voiceedge", "scenario", str(path), "--region",
                           region, "--results", str(out), "--json", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    [directory] = list(out.iterdir())
    return json.loads(proc.stdout), directory


def shipped_scenario(tmp_path_factory, name: str, region: str,
                     args: tuple[str, ...] = ()) -> tuple[dict, Path]:
    """One run of ``scenarios/<name>.yaml`` for clients in ``region`` (root: Mininet)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (Mininet)")
    return run_scenario(REPO / "scenarios" / f"{name}.yaml", region,
                        tmp_path_factory.mktemp(f"{name}-results"), args=args)


@pytest.fixture(scope="session")
def ci_results(tmp_path_factory):
    """One run of the compact CI scenario (scenarios/ci.yaml), shared by the tests that read it;
    with packet captures (tests/test_wire_world.py reads them; tcpdump's cost on this run is
    in its report's capture table)."""
    return shipped_scenario(tmp_path_factory, "ci", "apac-se", ("--capture",))
