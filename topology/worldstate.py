"""A world that stays up: its lock, its state file, the reap of a dead holder's world, and
``WorldHold``, which keeps a built world up until SIGINT, SIGTERM or SIGHUP.

One held world at a time on a machine. Its holder has an exclusive ``flock`` on
``/run/voiceedge/world.lock`` and describes the world in ``/run/voiceedge/world.json``: holder
pid, start time, regions, clusters, backend, and per host its namespace file, shell pid, role,
region and IPv4 addresses; plus "extra pids", processes to kill if the holder dies (the
impairment engine, a scenario's services). Every pid is recorded with its start time (field 22
of /proc/PID/stat), and nothing is ever killed unless it is still that process: a recycled pid
is left alone. The holder removes the state file, then releases the lock; so a free lock with a
state file means the holder died (SIGKILL), and ``reap`` cleans up what it left.

``voiceedge world up / exec / down`` (topology/worldcli.py) are built on this module.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from voiceedge.errors import UserError
from voiceedge.watchdog import start_ticks, stat_fields

STATE_DIR = Path("/run/voiceedge")
LOCK_NAME = "world.lock"
STATE_NAME = "world.json"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# host name prefix -> role, in the order the hosts table lists a region's hosts
ROLES = {"client": "client", "pub": "public router", "edge": "edge: ingress relay + signaling "
         "front", "bb": "backbone router", "cluster": "cluster"}
_HOST = re.compile(r"^(client|pub|bb|edge|cluster)(\d+)$")


class WorldBusy(UserError):
    """Another process holds the world lock; the message says whose world and what to do."""


# ------------------------------------------------------------------ processes


def same_process(pid: int, ticks: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``ticks`` (not a recycled pid)."""
    return ticks is not None and start_ticks(pid) == ticks


def process_record(pid: int, what: str) -> dict | None:
    """How the state file records a process (None if it is already gone). ``group``: it leads
    its own process group (a service started with start_new_session, a host's shell), so the
    whole group is signalled, workers included."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return {"pid": pid, "start_ticks": int(fields[19]), "group": int(fields[2]) == pid,
            "what": what}


def _signal(record: dict, sig: int) -> bool:
    """Send ``sig`` to a recorded process (its group if it leads one) if it is still that
    process; whether it was."""
    if not same_process(record["pid"], record["start_ticks"]):
        return False
    try:
        if record.get("group"):
            os.killpg(record["pid"], sig)
        else:
            os.kill(record["pid"], sig)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(records: list[dict], timeout: float) -> list[dict]:
    """Wait until the recorded processes are gone; return those still there."""
    deadline = time.monotonic() + timeout
    while True:
        left = [r for r in records if same_process(r["pid"], r["start_ticks"])]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


# ------------------------------------------------------------------ the state file


def host_names(regions: Iterable[str], clusters: Iterable[str]) -> list[str]:
    """The hosts a world of ``regions`` has (topology/world.py names them)."""
    clusters = set(clusters)
    names = []
    for i, region in enumerate(regions, 1):
        names += [f"{role}{i}" for role in ROLES if role != "cluster" or region in clusters]
    return names


def _sort_key(name: str) -> tuple:
    m = _HOST.match(name)
    return (int(m.group(2)), list(ROLES).index(m.group(1))) if m else (10**6, name)


def host_addresses(ns_path: str) -> list[dict]:
    """IPv4 addresses inside a namespace (``ip -j -4 addr``), loopback's 127.0.0.0/8 left out:
    ``[{"interface": "client1-eth0", "address": "10.1.1.2/24"}, ...]``."""
    proc = subprocess.run(["nsenter", f"--net={ns_path}", "ip", "-j", "-4", "addr"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ip addr in {ns_path}: {proc.stderr.strip()}")
    out = []
    for link in json.loads(proc.stdout or "[]"):
        for addr in link.get("addr_info", []):
            if addr.get("family", "inet") == "inet" and not addr["local"].startswith("127."):
                out.append({"interface": link["ifname"],
                            "address": f"{addr['local']}/{addr['prefixlen']}"})
    return out


def read_state(state_dir: Path) -> dict | None:
    """The state file, or None if there is none."""
    path = Path(state_dir) / STATE_NAME
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(f"unreadable world state {path} ({exc}): remove it if no world is "
                        f"up") from None


def _write_state(state_dir: Path, state: dict) -> None:
    path = Path(state_dir) / STATE_NAME
    tmp = path.with_name(f".{STATE_NAME}.{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, path)  # readers never see half a file


def holder_alive(state: dict) -> bool:
    holder = state.get("holder", {})
    return same_process(holder.get("pid", -1), holder.get("start_ticks"))


def describe(state: dict) -> str:
    """``pid 1234, regions apac-se,na-east; since 02:40:11``."""
    started = state.get("started", 0)
    fmt = "%H:%M:%S" if time.localtime(started)[:3] == time.localtime()[:3] else \
        "%Y-%m-%d %H:%M:%S"
    return (f"pid {state.get('holder', {}).get('pid', '?')}, regions "
            f"{','.join(state.get('regions', [])) or '?'}; since "
            f"{time.strftime(fmt, time.localtime(started))}")


def _busy_message(state_dir: Path) -> str:
    state = None
    for _ in range(10):  # the holder writes the state right after taking the lock
        state = read_state(state_dir)
        if state is not None:
            break
        time.sleep(0.1)
    if state is None or not holder_alive(state):
        return ("another voiceedge world command holds the world lock (a stale world is being "
                "reaped, or one is starting): try again in a moment")
    if state.get("phase") == "building":
        return (f"a world is being built ({describe(state)}): wait for it and use it with "
                f"voiceedge world exec, or stop it with voiceedge world down")
    return (f"a world is already up ({describe(state)}): use it with voiceedge world exec, or "
            f"stop it with voiceedge world down")


class _Lock:
    """The exclusive flock on ``state_dir/world.lock`` (close-on-exec: no child inherits it)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / LOCK_NAME
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


# ------------------------------------------------------------------ reap and stop


def _root_interfaces() -> list[str]:
    proc = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True)
    return [link["ifname"] for link in json.loads(proc.stdout or "[]")]


def reap(state_dir: Path, state: dict) -> str:
    """Clean up the world of a dead holder: kill its recorded extra pids (SIGTERM, then SIGKILL
    after 3 s) and host shells (SIGKILL), each only if it is still the recorded process, so its
    namespaces, with their interfaces and iptables rules, vanish; delete interfaces of its hosts
    left in the root namespace (``client1-eth0``: a build killed half-way); remove the state
    file. The caller holds the lock. Returns one line saying what was done."""
    hosts = state.get("hosts", {})
    shells = [{"pid": h["pid"], "start_ticks": h["start_ticks"], "group": h.get("group", True),
               "what": f"host {name}"} for name, h in hosts.items()]
    # services may want to flush on SIGTERM; an interactive shell ignores it
    signalled = [r for r in state.get("extra_pids", []) if _signal(r, signal.SIGTERM)]
    signalled += [r for r in shells if _signal(r, signal.SIGKILL)]
    left = _wait_gone(signalled, 3.0)
    for r in left:
        _signal(r, signal.SIGKILL)
    left = _wait_gone(left, 2.0)
    names = set(hosts) | set(host_names(state.get("regions", []), state.get("clusters", [])))
    pattern = re.compile(r"^(%s)-eth\d+$" % "|".join(map(re.escape, sorted(names)))) \
        if names else None
    removed = []
    for ifname in _root_interfaces() if pattern else []:
        if pattern.match(ifname):
            subprocess.run(["ip", "link", "del", ifname], capture_output=True)
            removed.append(ifname)
    remaining = [i for i in _root_interfaces() if pattern and pattern.match(i)]
    (Path(state_dir) / STATE_NAME).unlink(missing_ok=True)
    line = (f"reaped a stale world ({describe(state)}; its holder is gone): "
            f"{len(signalled)} process{'es' if len(signalled) != 1 else ''} killed, "
            f"{len(removed)} leftover interface{'s' if len(removed) != 1 else ''} removed")
    if left:
        line += f"; still running: {', '.join(str(r['pid']) for r in left)}"
    if remaining:
        line += f"; interfaces left: {', '.join(remaining)}"
    return line


def reap_if_stale(state_dir: Path) -> str | None:
    """With the lock held: reap a stale world if there is one; its line, else None."""
    state = read_state(state_dir)
    if state is None:
        return None
    if holder_alive(state):  # not ours to reap, although it does not hold the lock
        raise UserError(f"{Path(state_dir) / STATE_NAME} names a live holder ({describe(state)}) "
                        f"that does not hold the world lock: stop it, or remove the file")
    return reap(state_dir, state)


def stop_world(state_dir: Path = STATE_DIR, timeout: float = 30.0) -> str:
    """``voiceedge world down``: ask the holder to tear its world down (SIGTERM) and wait for
    it, up to ``timeout`` s; or reap the world of a dead holder. Returns one line; raises
    ``UserError`` when there is no world, and ``TimeoutError`` when the holder did not finish
    in time."""
    lock = _Lock(state_dir)
    if lock.try_acquire():
        try:
            line = reap_if_stale(state_dir)
        finally:
            lock.release()
        if line is None:
            raise UserError("no world is up (nothing to tear down)")
        return line
    state = read_state(state_dir)
    if state is None or not holder_alive(state):
        raise UserError(_busy_message(state_dir))
    holder = state["holder"]
    started = time.monotonic()
    _signal({"pid": holder["pid"], "start_ticks": holder["start_ticks"]}, signal.SIGTERM)
    if _wait_gone([holder], timeout):
        raise TimeoutError(f"the holder ({describe(state)}) is still tearing down after "
                           f"{timeout:g} s: wait, or kill -9 {holder['pid']} and run voiceedge "
                           f"world down again to reap what it leaves")
    line = f"torn down ({describe(state)}) in {time.monotonic() - started:.1f} s"
    if lock.try_acquire():  # it died instead of tearing down (the state file is still there)
        try:
            reaped = reap_if_stale(state_dir)
        finally:
            lock.release()
        if reaped:
            line = f"its holder exited without tearing down: {reaped}"
    return line


# ------------------------------------------------------------------ the hold


class WorldHold:
    """Keep a built world up for inspection: take the world lock, write the state file, print
    the hosts table, and ``wait()`` for SIGINT, SIGTERM or SIGHUP. A scenario's
    ``--keep-world`` uses it after its last architecture, services still running::

        with WorldHold(world, extra_pids=[s.pid for s in services],
                       lines=["signaling: http://203.0.113.20:8080/v1/calls"]) as hold:
            hold.wait()
            ...  # stop the services, tear the world down (inside the block, best: the state
                 # file stays until then, so a SIGKILL meanwhile can still be reaped)

    ``world``: a built ``topology.world.World`` (or None, then ``publish(world)`` it once built,
    as ``voiceedge world up`` does so that a second one is refused before building anything).
    ``extra_pids``: processes to kill if this process dies holding the world (a whole process
    group when the pid leads one, as ``ServiceProcess`` starts them); the impairment engine is
    added by itself; ``add_pids`` adds more later. ``lines``: printed after the hosts table,
    before the ready line. ``spec``: the ``WorldSpec`` being built when ``world`` is None
    (recorded, so that a build killed half-way can be reaped). ``say``: where one-line notes
    go (default: stderr), such as the reap of a stale world found on entry; ``file``: where the
    table goes (default: stdout). ``state_dir``: for tests.

    Entering raises ``WorldBusy`` (a ``UserError``: one line, exit 2 on the command line)
    when another process holds the lock. Between entering and ``wait()``, SIGTERM and SIGHUP
    raise ``KeyboardInterrupt`` as Ctrl-C does, so the block unwinds and tears down; after the
    first stop signal, later ones are ignored until the block is left (a second Ctrl-C does not
    interrupt the teardown). Exiting removes the state file, releases the lock and puts the
    previous signal handlers back. Use it from the main thread.
    """

    def __init__(self, world=None, *, extra_pids: Iterable[int] = (),
                 lines: Iterable[str] = (), spec=None, say: Callable[[str], None] | None = None,
                 file=None, state_dir: Path = STATE_DIR) -> None:
        self.world = world
        self.spec = spec if spec is not None or world is None else world.spec
        self.lines = list(lines)
        self.state_dir = Path(state_dir)
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.file = file
        self.state: dict | None = None
        self.stop_signal: str | None = None
        self._extra = list(extra_pids)
        self._lock = _Lock(self.state_dir)
        self._saved: dict[int, object] = {}
        self._waiting = False

    # -------------------------------------------------------- lifecycle

    def __enter__(self) -> "WorldHold":
        if not self._lock.try_acquire():
            raise WorldBusy(_busy_message(self.state_dir))
        try:
            line = reap_if_stale(self.state_dir)
            if line:
                self.say(line)
            me = process_record(os.getpid(), "holder")
            spec = self.spec
            self.state = {"version": 1, "phase": "building",
                          "holder": {"pid": me["pid"], "start_ticks": me["start_ticks"]},
                          "started": time.time(),
                          "regions": list(spec.regions) if spec else [],
                          "clusters": list(spec.clusters) if spec else [],
                          "backend": None, "hosts": {}, "extra_pids": []}
            self.add_pids(*self._extra)
            self._install_signals()
            if self.world is not None:
                self.publish(self.world)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._saved:  # nothing interrupts the last steps
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
        try:
            if self.state is not None:  # ours: written with the lock held
                (self.state_dir / STATE_NAME).unlink(missing_ok=True)
            self._lock.release()
        finally:
            for sig, handler in self._saved.items():
                signal.signal(sig, handler)
            self._saved.clear()

    # -------------------------------------------------------- what is recorded

    def publish(self, world, lines: Iterable[str] = ()) -> None:
        """Record the built ``world`` in the state file (hosts, addresses, the engine's pid) and
        print the hosts table, ``self.lines`` + ``lines`` and the ready line."""
        self.world = world
        spec = world.spec
        hosts = {}
        for host in world.net.hosts:
            rec = process_record(host.pid, f"host {host.name}")
            if rec is None:
                raise RuntimeError(f"host {host.name}'s shell (pid {host.pid}) is gone")
            role, region = world.role_of(host.name)
            ns_path = world.node(host.name).ns_path
            hosts[host.name] = {"ns_path": ns_path, "pid": host.pid,
                                "start_ticks": rec["start_ticks"], "group": rec["group"],
                                "role": ROLES[role], "region": region,
                                "addresses": host_addresses(ns_path)}
        self.state.update(phase="up", regions=list(spec.regions), clusters=list(spec.clusters),
                          backend=world.backend.name,
                          hosts={n: hosts[n] for n in sorted(hosts, key=_sort_key)})
        engine = getattr(world.backend, "engine_pid", None)
        if engine is not None:
            self.add_pids(engine, what="impairment engine")
        else:
            _write_state(self.state_dir, self.state)
        self.print_hosts(self.lines + list(lines))

    def add_pids(self, *pids: int, what: str = "service") -> None:
        """Add processes to kill if this process dies holding the world; pids already gone
        or already recorded are skipped."""
        if self.state is None:  # not entered yet: recorded on entry
            self._extra += pids
            return
        known = {r["pid"] for r in self.state["extra_pids"]}
        for pid in pids:
            rec = process_record(pid, what)
            if rec is not None and pid not in known:
                self.state["extra_pids"].append(rec)
                known.add(pid)
        _write_state(self.state_dir, self.state)

    def print_hosts(self, lines: Iterable[str] = ()) -> None:
        """The hosts table, ``lines``, then the ready line."""
        from rich.console import Console
        from rich.table import Table

        file = self.file or sys.stdout
        console = Console(file=file, width=max(Console(file=file).width, 110))
        state = self.state
        table = Table(title=f"world: {', '.join(state['regions'])} (clusters "
                            f"{', '.join(state['clusters']) or 'none'}; {state['backend']} "
                            f"impairment)")
        for col in ("host", "role", "region", "IPv4 addresses"):
            table.add_column(col)
        for name, host in state["hosts"].items():
            table.add_row(name, host["role"], host["region"],
                          "\n".join(f"{a['interface']} {a['address']}"
                                    for a in host["addresses"]))
        console.print(table)
        for line in lines:
            print(line, file=file)
        print(f"world up: {len(state['hosts'])} hosts; run commands with: voiceedge world exec "
              f"HOST -- CMD; Ctrl-C (or voiceedge world down) tears it down", file=file,
              flush=True)

    # -------------------------------------------------------- signals

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("WorldHold handles signals: use it from the main thread")
        for sig in STOP_SIGNALS:
            self._saved[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        # No lock here (an Event's set takes one): the handler runs in the main thread, which
        # may be holding that very lock inside wait() when the signal lands; the world's
        # holder then deadlocked, deaf to every further signal (seen once in make test).
        self.stop_signal = signal.Signals(signum).name
        if not self._waiting:
            raise KeyboardInterrupt

    def wait(self) -> str:
        """Block until SIGINT, SIGTERM or SIGHUP; return its name (e.g. "SIGINT")."""
        self._waiting = True
        try:
            while self.stop_signal is None:
                time.sleep(0.2)  # a signal's handler runs within it, then the loop sees it
        finally:
            self._waiting = False
        return self.stop_signal
