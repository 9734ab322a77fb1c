"""Preflight (topology/preflight.py): one clear line, before anything is built, when the machine
cannot run a world: not root, a missing program, netem asked for on a kernel without it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from topology.preflight import (SERVICES, Requirement, check_lab_prerequisites,
                                check_world_prerequisites, required)
from scenarios.architectures import get
from voiceedge.errors import EnvironmentProblem
from tests.conftest import REPO
from tests.netem_kernel import kernel, netem, no_netem  # noqa: F401 (fixtures)

TURN = get("turn").requirements  # the turn architecture's coturn
ALL = tuple(dict.fromkeys(required(None, services=True, extra=TURN, browsers=True)
                          + required("netem")))


def fake_path(tmp_path: Path, without: str) -> str:
    """A PATH of one folder with every required program (links to the real ones) but one."""
    folder = tmp_path / f"bin-without-{without}"
    folder.mkdir()
    for need in ALL:
        real = shutil.which(need.program)
        if need.program != without and real is not None:
            (folder / need.program).symlink_to(real)
    return str(folder)


@pytest.mark.parametrize("need", ALL, ids=lambda n: n.program)
def test_a_missing_program_names_its_package_and_how_to_get_it(tmp_path, need: Requirement):
    with pytest.raises(EnvironmentProblem) as err:
        check_world_prerequisites(None, services=True, extra=TURN, browsers=True, euid=0,
                                  path=fake_path(tmp_path, need.program))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{need.program} is not installed (Debian package {need.package}")
    if need.make_deps:
        assert "`make deps`" in message and "`make scenario`" in message
    else:
        assert f"`apt-get install {need.package}`" in message


def test_what_is_required_depends_on_the_backend_and_the_services():
    programs = lambda *a, **k: {n.program for n in required(*a, **k)}  # noqa: E731
    assert {"mnexec", "ip", "iptables", "tc"} <= programs(None)
    assert "tc" not in programs("userspace") and "iptables" not in programs("netem")
    assert "redis-server" not in programs(None)
    assert "redis-server" in programs(None, services=True)
    # a world without redis-server is fine when no services are asked for
    assert SERVICES[0] not in required("userspace")
    # coturn and Chromium only for scenarios that ask for them
    assert not {"turnserver", "chromium"} & programs(None, services=True)
    assert {"turnserver", "chromium"} <= programs(None, services=True, extra=TURN, browsers=True)


def test_packages_said_to_come_with_make_deps_do():
    script = (REPO / "scripts" / "install-debian-deps.sh").read_text()
    listed = set(re.search(r"packages=\(([^)]*)\)", script).group(1).split())
    for need in ALL:
        if need.make_deps:
            assert need.package in listed, need


def test_not_root_is_one_line():
    for check in (lambda: check_world_prerequisites(None, euid=65534),
                  lambda: check_lab_prerequisites(euid=65534)):
        with pytest.raises(EnvironmentProblem, match=r"^needs root [^\n]*$"):
            check()


def test_lab_prerequisites_need_no_mininet(tmp_path):
    check_lab_prerequisites(euid=0, path=fake_path(tmp_path, "mnexec"))
    with pytest.raises(EnvironmentProblem, match="^iptables is not installed"):
        check_lab_prerequisites(euid=0, path=fake_path(tmp_path, "iptables"))


def test_an_unknown_backend_is_refused():
    with pytest.raises(EnvironmentProblem, match="unknown impairment backend 'tbf'"):
        check_world_prerequisites("tbf", euid=0)


def test_on_this_machine_it_says_the_backend_the_kernel_supports(kernel):
    assert check_world_prerequisites(None) == kernel.backend
    assert check_world_prerequisites("userspace", services=True) == "userspace"


def test_netem_asked_for_on_a_kernel_without_it_is_one_line(no_netem):
    with pytest.raises(EnvironmentProblem) as err:
        check_world_prerequisites("netem")
    message = str(err.value)
    assert "\n" not in message and "no sch_netem" in message and no_netem.answer in message
    assert "--backend userspace" in message


def test_netem_asked_for_on_a_kernel_with_it(netem):
    assert check_world_prerequisites("netem") == "netem"


VOICEEDGE = [sys.executable, "-m", "voiceedge"]


def _one_line_exit_2(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("voiceedge calibrate: ")
    return lines[0]


def test_calibrate_as_nobody_exits_2_with_one_line(tmp_path, as_nobody):
    proc = subprocess.run(
        [*as_nobody, *VOICEEDGE,
         "calibrate", "--regions", "apac-se"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env={"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path)})
    line = _one_line_exit_2(proc)
    assert "needs root" in line
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.root  # gets past the root check
def test_calibrate_without_mnexec_exits_2_naming_mininet(tmp_path):
    proc = subprocess.run([*VOICEEDGE, "calibrate", "--regions", "apac-se"], capture_output=True,
                          text=True, cwd=REPO, timeout=60,
                          env={**os.environ, "PATH": fake_path(tmp_path, "mnexec")})
    line = _one_line_exit_2(proc)
    assert "mnexec is not installed (Debian package mininet" in line and "make deps" in line
