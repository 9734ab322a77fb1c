"""Preflight: can this machine build an emulated world (or a one-host lab)? One clear line if
not, before anything is built or written.

Checked, in this order: root (namespaces, iptables); the Python package ``mininet`` (Debian's,
seen through the virtualenv's system site-packages); the programs the world runs (Mininet's
``mnexec`` and ``ifconfig``, iproute2, ``sysctl`` on the routers, ``nsenter``, iptables for the
userspace backend, ``tc`` to ask the kernel for netem) and, for a scenario, ``redis-server``;
then which impairment backend the kernel supports, refusing ``netem`` where it has none. What
an architecture needs besides (coturn for TURN) it declares itself (``Architecture.requirements``,
scenarios/architectures/) and the scenario commands pass on as ``extra``.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass

from topology.impairment.backend import BACKENDS, ImpairmentError, detect
from voiceedge.errors import EnvironmentProblem


@dataclass(frozen=True)
class Requirement:
    """A program the world needs, the Debian package that ships it and what it is for.
    ``make_deps``: scripts/install-debian-deps.sh installs the package (else the message says
    ``apt-get install``: a package of every standard Debian system, or one mininet pulls in)."""

    program: str
    package: str
    purpose: str
    make_deps: bool = True

    def problem(self) -> str:
        how = ("`make deps` (which `make scenario` runs) installs it, as root"
               if self.make_deps else f"install it as root with `apt-get install {self.package}`")
        return (f"{self.program} is not installed (Debian package {self.package}, needed for "
                f"{self.purpose}): {how}")


WORLD = (
    Requirement("mnexec", "mininet", "the emulated hosts"),
    Requirement("ifconfig", "net-tools", "Mininet's interface set-up", make_deps=False),
    Requirement("ip", "iproute2", "links, addresses and routes", make_deps=False),
    Requirement("sysctl", "procps", "forwarding on the emulated routers", make_deps=False),
    Requirement("nsenter", "util-linux", "commands inside the hosts", make_deps=False),
)
USERSPACE = (Requirement("iptables", "iptables", "the userspace impairment backend"),)
NETEM_CHECK = (Requirement("tc", "iproute2", "asking the kernel for netem", make_deps=False),)
SERVICES = (Requirement("redis-server", "redis-server", "the relays' Redis flow cache"),)
CAPTURE = (Requirement("tcpdump", "tcpdump", "packet captures (--capture)"),)
BROWSERS = (Requirement("chromium", "chromium", "Chromium client sessions; `make browsers` "
                        "installs it too", make_deps=False),)


def required(backend: str | None, services: bool = False, capture: bool = False,
             browsers: bool = False,
             extra: tuple[Requirement, ...] = ()) -> tuple[Requirement, ...]:
    """What a world with ``backend`` (None: detect) needs; ``services``: and a scenario's;
    ``capture``: and its packet captures; ``browsers``: Chromium; ``extra``: what the
    scenario's architectures need besides."""
    return (WORLD + (USERSPACE if backend != "netem" else ())
            + (NETEM_CHECK if backend != "userspace" else ()) + (SERVICES if services else ())
            + (CAPTURE if capture else ()) + tuple(extra)
            + (BROWSERS if browsers else ()))


def _check(needs: tuple[Requirement, ...], euid: int | None, path: str | None) -> None:
    if (os.geteuid() if euid is None else euid) != 0:
        raise EnvironmentProblem("needs root (network namespaces, iptables): run it as root, "
                                 "e.g. with sudo")
    _check_programs(needs, path)


def check_client_prerequisites(*, browsers: bool = False, path: str | None = None) -> None:
    """What a scenario's clients alone need, run from this host against a deployment (no
    world, no root): Chromium for browser sessions. ``EnvironmentProblem`` (one line)."""
    _check_programs(BROWSERS if browsers else (), path)


def _check_programs(needs: tuple[Requirement, ...], path: str | None) -> None:
    search = os.environ.get("PATH", os.defpath) if path is None else path
    for need in needs:
        if shutil.which(need.program, path=search) is None:
            raise EnvironmentProblem(need.problem())


def check_programs(*names: str) -> None:
    """Raise ``EnvironmentProblem`` (one line) unless this is root and the world's programs
    ``names`` (``"nsenter"``, ``"ip"``: see ``WORLD``) are installed: for commands that use a
    world already built."""
    _check(tuple(r for r in WORLD if r.program in names), None, None)


def check_world_prerequisites(backend: str | None = None, *, services: bool = False,
                              capture: bool = False, browsers: bool = False,
                              extra: tuple[Requirement, ...] = (),
                              euid: int | None = None, path: str | None = None) -> str:
    """Return the impairment backend a world will use (``backend``, or what the kernel supports
    when None) or raise ``EnvironmentProblem`` with one line saying what is missing and how to
    get it. ``services``: also what a scenario's services need; ``capture``: tcpdump;
    ``browsers``: Chromium; ``extra``: what its architectures need (coturn for TURN). ``euid`` and ``path`` (a PATH string) replace the
    process's own, for tests."""
    if backend is not None and backend not in BACKENDS:
        raise EnvironmentProblem(f"unknown impairment backend {backend!r} "
                                 f"(choose from {', '.join(BACKENDS)})")
    _check((), euid, path)
    if importlib.util.find_spec("mininet") is None:
        raise EnvironmentProblem(
            "the Python package mininet is not importable (Debian package mininet, seen through "
            "a virtualenv made with --system-site-packages): `make deps` and `make venv` set "
            "this up, as root")
    _check(required(backend, services, capture, browsers, extra), euid, path)
    if backend == "userspace":
        return backend
    try:
        found = detect()
    except ImpairmentError as exc:
        raise EnvironmentProblem(str(exc)) from None
    if backend == "netem" and found.name != "netem":
        raise EnvironmentProblem(f"--backend netem was asked for, but {found.reason}: use "
                                 f"--backend userspace (or auto)")
    return found.name


def check_lab_prerequisites(*, services: bool = False, euid: int | None = None,
                            path: str | None = None) -> None:
    """Raise ``EnvironmentProblem`` (one line) unless this machine can run the one-host labs
    (topology/netns.py, topology/impairment/lab.py) and the userspace impairment engine in
    them; ``services``: and the services' Redis. No Mininet needed."""
    needs = (Requirement("ip", "iproute2", "the lab namespaces", make_deps=False),
             Requirement("nsenter", "util-linux", "commands inside them", make_deps=False))
    _check(needs + USERSPACE + (SERVICES if services else ()), euid, path)
