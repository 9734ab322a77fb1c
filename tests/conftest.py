"""Shared fixtures: real processes (redis-server, relays) on loopback, cleaned up afterwards."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# A shell that starts a command in the background without job control (`make test &` in a
# script, `nohup ... &`) starts it with SIGINT ignored, and an ignored signal stays ignored
# across exec: every command the tests start would then shrug off the Ctrl-C the stop tests
# send it (4 of them failed so, 2026-12-05). A handled signal is reset to its default at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The worlds the tests build draw their losses and delays from seeded streams: each of the ~30
# calibrations a run of the suite makes is judged against bands that a correct world leaves by
# chance in up to 0.2% of runs (topology/calibrate.py), and an unseeded suite did, once (23 of
# 100 probes lost in Gilbert-Elliott bursts on a path whose band ends near 20). Tests that set
# their own seed, or clear it to test the unseeded engine, still can.
os.environ.setdefault("VOICEEDGE_IMPAIRMENT_SEED", "20261206")


# ------------------------------------------------------------------ tiers (docs/contributing.md)
# Every test is marked by what it needs (pyproject's markers): `world` and `netns` need root
# and make namespaces, `browser` starts Chromium, `docker` needs dockerd, `slow` is none of
# those but long. `make check` runs the tests with none of world/netns/browser/docker. A
# marker comes from the module's `pytestmark`, a test's decorator, or a fixture the test uses
# that says what it needs (`needs` below: a test that uses the `lab` fixture is `netns`).

NEEDS_ROOT = ("world", "netns", "root")
MAKES_NAMESPACES = ("world", "netns")


def scenario_file(tmp_path: Path, text: str):
    """The scenario a YAML file of ``text`` in ``tmp_path`` loads as (ScenarioError if bad)."""
    from scenarios.spec import Scenario

    path = tmp_path / "s.yaml"
    path.write_text(text)
    return Scenario.load(path)


def needs(*markers: str):
    """Put under ``@pytest.fixture``: every test that uses the fixture, directly or through
    another fixture, gets ``markers`` (e.g. ``@needs("netns")`` on a lab fixture)."""

    def mark(fn):
        fn.voiceedge_needs = markers
        return fn

    return mark


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by markers
def pytest_collection_modifyitems(items) -> None:
    for item in items:
        have = {m.name for m in item.iter_markers()}
        for defs in item._fixtureinfo.name2fixturedefs.values():
            for marker in getattr(defs[-1].func, "voiceedge_needs", ()):
                if marker not in have:
                    item.add_marker(marker)
                    have.add(marker)


# The loud failure for a test that makes namespaces without saying so. For a test marked
# neither world nor netns, setup and call run with topology.netns.FORBIDDEN_ENV set: the
# project's namespace and Mininet creators refuse (also in the processes the test starts) and
# log each refusal; and an audit hook refuses this process's own `ip netns add`, `unshare -n`
# and `mnexec` (Mininet's namespace maker) whoever calls them. Any refusal fails the test.
_guard: dict = {"message": None, "log": None}


def _namespace_command(args) -> str | None:
    """The namespace-making command ``args`` is, or None."""
    argv = [os.path.basename(str(a)) if i == 0 else str(a)
            for i, a in enumerate(args if isinstance(args, (list, tuple)) else [args])]
    if not argv:
        return None
    if argv[0] == "ip" and "netns" in argv and "add" in argv[argv.index("netns"):]:
        return "ip netns add"
    if argv[0] == "unshare" and any(a == "--net" or a.startswith("--net=") or (
            a.startswith("-") and not a.startswith("--") and "n" in a) for a in argv[1:]):
        return "unshare --net"
    if argv[0] == "mnexec":
        return "mnexec (Mininet)"
    return None


def _audit(event: str, args) -> None:
    if _guard["message"] is None or event not in ("subprocess.Popen", "os.posix_spawn",
                                                    "os.exec"):
        return
    what = _namespace_command(args[1])
    if what is not None:
        with open(_guard["log"], "a") as f:
            f.write(f"{what} (pid {os.getpid()})\n")
        raise RuntimeError(f"{what} refused: {_guard['message']}")


sys.addaudithook(_audit)


@contextlib.contextmanager
def _guarded(item):
    """One phase (setup or call) of a test marked neither world nor netns: the guard is on,
    and afterwards the test fails, naming the marker, if anything tried to make a namespace."""
    from topology.netns import FORBIDDEN_ENV, FORBIDDEN_LOG_ENV

    fd, log = tempfile.mkstemp(prefix="voiceedge-netns-refused-", suffix=".log")
    os.close(fd)
    message = (f"{item.nodeid} is marked neither world nor netns but makes a network namespace "
               "or a Mininet world: mark it (`pytestmark = pytest.mark.netns`, or "
               "`pytest.mark.world` for a world, scenario or sweep; docs/contributing.md)")
    saved = {k: os.environ.get(k) for k in (FORBIDDEN_ENV, FORBIDDEN_LOG_ENV)}
    os.environ[FORBIDDEN_ENV], os.environ[FORBIDDEN_LOG_ENV] = message, log
    _guard.update(message=message, log=log)
    try:
        yield
    finally:
        _guard.update(message=None, log=None)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        refused = Path(log).read_text().splitlines()
        os.unlink(log)
        if refused:
            pytest.fail(f"{message}. Refused: {'; '.join(refused)}", pytrace=False)


def _unmarked(item) -> bool:
    return not any(item.get_closest_marker(m) for m in MAKES_NAMESPACES)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    if os.geteuid() != 0:
        marked = [m for m in NEEDS_ROOT if item.get_closest_marker(m)]
        if marked:
            pytest.skip(f"needs root (marked {', '.join(marked)}); run the tests as root, as "
                        "`make test` and CI do")
    if not _unmarked(item):
        return (yield)
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not _unmarked(item):
        return (yield)
    with _guarded(item):
        return (yield)


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
@needs("root")
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
    @needs("netns")
    def lab():
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


def write_architectures(directory: Path, names, baseline: str = "port-per-session") -> None:
    """``architectures.json`` for a hand-made results folder, as the runner writes it: the
    registered architectures' own facts (scenarios/architectures/)."""
    import json

    from scenarios import architectures
    (directory / "architectures.json").write_text(json.dumps({
        "baseline": baseline,
        "architectures": {n: architectures.get(n).facts() for n in names}}))


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
        # unpinned unless the test's own args say otherwise (they come after)
        cmd = [sys.executable, "-m", "voiceedge", "relay", "--cpus", "none", *self.args,
               "--metrics", f"127.0.0.1:{self.metrics_port}"]
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
    """One run of ``scenarios/<name>.yaml`` for clients in ``region`` (root: Mininet; the
    fixture that calls it says ``@needs("world")``)."""
    return run_scenario(REPO / "scenarios" / f"{name}.yaml", region,
                        tmp_path_factory.mktemp(f"{name}-results"), args=args)


@pytest.fixture(scope="session")
@needs("world")
def ci_results(tmp_path_factory):
    """One run of the compact CI scenario (scenarios/ci.yaml), shared by the tests that read it;
    with packet captures (tests/test_wire_world.py reads them; tcpdump's cost on this run is
    in its report's capture table)."""
    return shipped_scenario(tmp_path_factory, "ci", "apac-se", ("--capture",))
