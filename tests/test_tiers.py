"""The test tiers' guard (tests/conftest.py): a test marked neither ``world`` nor ``netns`` that
makes a network namespace fails loudly, naming the marker, whether it makes it in its own process
or in a process it starts, and even when it swallows the error. One real pytest run of a small
test file with the project's conftest holds the cases; the guard refuses before anything is
made, so this needs no root and leaves nothing behind."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO
from topology.netns import FORBIDDEN_ENV, FORBIDDEN_LOG_ENV

CASES = f"""
    import os
    import subprocess
    import sys

    import pytest

    from tests.conftest import needs
    from topology.netns import NetnsError, add_netns, lab_namespace, refuse_if_forbidden


    def test_makes_a_lab():
        with lab_namespace("veguard"):
            pass


    def test_swallows_the_refusal():
        try:
            add_netns("veguard-swallowed")
        except NetnsError:
            pass


    def test_a_child_makes_one():  # as `voiceedge scenario` started by a test would
        subprocess.run([sys.executable, "-c",
                        "from topology.netns import add_netns; add_netns('veguard-child')"])


    def test_ip_netns_add():
        try:
            subprocess.run(["ip", "netns", "add", "veguard-ip"])
        finally:  # only were the guard broken would there be one to delete
            subprocess.run(["ip", "netns", "delete", "veguard-ip"], capture_output=True)


    def test_mnexec():
        subprocess.run(["mnexec", "-cdn", "true"])


    def test_other_commands_run():
        assert {FORBIDDEN_ENV!r} in os.environ
        assert subprocess.run(["ip", "-V"], capture_output=True).returncode == 0


    @pytest.mark.netns
    def test_marked():
        assert {FORBIDDEN_ENV!r} not in os.environ
        refuse_if_forbidden("network namespace x")  # allowed: raises nothing


    @pytest.fixture
    @needs("netns")
    def lab():
        return "lab"


    @pytest.fixture
    def edge(lab):
        return lab


    def test_through_a_fixture(edge):
        pass
"""


def run_pytest(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """pytest (with ``args``) on CASES, with the project's conftest and markers."""
    path = tmp_path / "test_cases.py"
    path.write_text(textwrap.dedent(CASES))
    # This test is itself unmarked: its guard must not reach the inner run's own.
    env = {k: v for k, v in os.environ.items() if k not in (FORBIDDEN_ENV, FORBIDDEN_LOG_ENV)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-rA", *args, str(path)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory) -> tuple[dict[str, str], dict[str, str], str]:
    """({test: PASSED/FAILED/SKIPPED}, {failed test: its failure's text}, the whole output)."""
    proc = run_pytest(tmp_path_factory.mktemp("tiers"), "-v")
    out = proc.stdout
    status = dict(re.findall(r"^\S*::(test_\w+) (PASSED|FAILED|SKIPPED|ERROR)", out, re.M))
    sections = re.split(r"^_{3,} (test_\w+) _{3,}$", out, flags=re.M)
    failures = dict(zip(sections[1::2], sections[2::2]))
    return status, failures, out


MESSAGE = ("is marked neither world nor netns but makes a network namespace or a Mininet world: "
           "mark it (`pytestmark = pytest.mark.netns`, or `pytest.mark.world`")


@pytest.mark.parametrize("test, refused", [
    ("test_makes_a_lab", "lab namespace veguard-"),
    ("test_swallows_the_refusal", "network namespace veguard-swallowed"),
    ("test_a_child_makes_one", "network namespace veguard-child"),
    ("test_ip_netns_add", "ip netns add"),
    ("test_mnexec", "mnexec (Mininet)"),
])
def test_an_unmarked_test_that_makes_a_namespace_fails_naming_the_marker(outcome, test, refused):
    status, failures, out = outcome
    assert status.get(test) == "FAILED", out
    text = " ".join(failures[test].split())
    assert f"test_cases.py::{test} {MESSAGE}" in text, text
    assert f"Refused: {refused}" in text, text


def test_nothing_was_made(outcome):
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "veguard" not in names


def test_other_commands_and_marked_tests_are_left_alone(outcome):
    status, _, out = outcome
    assert status.get("test_other_commands_run") == "PASSED", out
    # marked netns: not guarded; skipped by the conftest when not root
    assert status.get("test_marked") == ("PASSED" if os.geteuid() == 0 else "SKIPPED"), out


def test_a_fixture_says_what_its_tests_need(tmp_path):
    """A test that uses a fixture under ``@needs("netns")`` (as the lab fixture is), directly or
    through another fixture, is marked netns, so ``-m "not netns"`` (make check) leaves it out."""
    proc = run_pytest(tmp_path, "--collect-only", "-q", "-m", "netns")
    assert proc.returncode == 0, proc.stdout
    selected = re.findall(r"::(test_\w+)", proc.stdout)
    assert selected == ["test_marked", "test_through_a_fixture"], proc.stdout
