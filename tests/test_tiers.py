"""The test tiers' guard (tests/conftest.py): a test marked neither ``world`` nor ``netns`` that
makes a network namespace fails loudly, naming the marker, whether it makes it in its own process
or in a process it starts, and even when it swallows the error. Each case is a real pytest run
of a small test file with the project's conftest; the guard refuses before anything is made, so
this needs no root and leaves nothing behind."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import REPO
from topology.netns import FORBIDDEN_ENV, FORBIDDEN_LOG_ENV


def run_pytest(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    """pytest (with ``args``) on one test file holding ``source``, with the project's conftest
    and markers."""
    path = tmp_path / "test_tiny.py"
    path.write_text(textwrap.dedent(source))
    # This test is itself unmarked: its guard must not reach the inner run's own.
    env = {k: v for k, v in os.environ.items() if k not in (FORBIDDEN_ENV, FORBIDDEN_LOG_ENV)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-q", "-p", "no:cacheprovider", *args, str(path)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


def failures(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("FAILED ")]


def test_an_unmarked_test_that_makes_a_lab_namespace_fails_naming_the_marker(tmp_path):
    proc = run_pytest(tmp_path, """
        from topology.netns import lab_namespace

        def test_makes_a_lab():
            with lab_namespace("veguard"):
                pass
    """)
    assert proc.returncode == 1, proc.stdout
    [failed] = failures(proc)
    assert "test_makes_a_lab" in failed
    assert "marked neither world nor netns" in proc.stdout
    assert "pytest.mark.netns" in proc.stdout and "pytest.mark.world" in proc.stdout
    assert "lab namespace veguard-" in proc.stdout


def test_a_swallowed_refusal_still_fails_the_test(tmp_path):
    proc = run_pytest(tmp_path, """
        from topology.netns import NetnsError, add_netns

        def test_swallows():
            try:
                add_netns("veguard-swallowed")
            except NetnsError:
                pass
    """)
    assert proc.returncode == 1, proc.stdout
    assert "test_swallows" in failures(proc)[0]
    assert "network namespace veguard-swallowed" in proc.stdout


def test_a_namespace_made_by_a_child_process_fails_the_test(tmp_path):
    """The child (as `voiceedge scenario` would be) inherits the guard and refuses."""
    proc = run_pytest(tmp_path, """
        import subprocess, sys

        def test_child_makes_one():
            subprocess.run([sys.executable, "-c",
                            "from topology.netns import add_netns; add_netns('veguard-child')"])
    """)
    assert proc.returncode == 1, proc.stdout
    assert "test_child_makes_one" in failures(proc)[0]
    assert "network namespace veguard-child" in proc.stdout


def test_ip_netns_add_and_mininet_s_mnexec_are_refused_whoever_runs_them(tmp_path):
    proc = run_pytest(tmp_path, """
        import subprocess

        def test_ip_netns_add():
            try:
                subprocess.run(["ip", "netns", "add", "veguard-ip"])
            finally:  # only were the guard broken would there be one to delete
                subprocess.run(["ip", "netns", "delete", "veguard-ip"], capture_output=True)

        def test_mnexec():
            subprocess.run(["mnexec", "-cdn", "true"])

        def test_other_commands_run():
            assert subprocess.run(["ip", "-V"], capture_output=True).returncode == 0
    """)
    assert proc.returncode == 1, proc.stdout
    failed = failures(proc)
    assert len(failed) == 2 and "test_ip_netns_add" in failed[0] and "test_mnexec" in failed[1]
    assert "ip netns add refused" in proc.stdout and "mnexec (Mininet) refused" in proc.stdout
    assert "1 passed" in proc.stdout
    assert "veguard-ip" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                              text=True).stdout


def test_a_marked_test_is_not_guarded_and_is_skipped_without_root(tmp_path):
    proc = run_pytest(tmp_path, f"""
        import os
        import pytest
        from topology.netns import refuse_if_forbidden

        @pytest.mark.netns
        def test_marked():
            assert {FORBIDDEN_ENV!r} not in os.environ
            refuse_if_forbidden("network namespace x")  # allowed: raises nothing

        def test_unmarked_may_do_anything_else():
            assert {FORBIDDEN_ENV!r} in os.environ
    """)
    assert proc.returncode == 0, proc.stdout
    if os.geteuid() == 0:
        assert "2 passed" in proc.stdout
    else:
        assert "1 passed, 1 skipped" in proc.stdout


def test_a_fixture_says_what_its_tests_need(tmp_path):
    """A test that uses a fixture under ``@needs("netns")`` (as the lab fixture is), directly or
    through another fixture, is marked netns, so ``-m "not netns"`` (make check) leaves it out."""
    proc = run_pytest(tmp_path, """
        import pytest
        from tests.conftest import needs

        @pytest.fixture
        @needs("netns")
        def lab():
            return "lab"

        @pytest.fixture
        def edge(lab):
            return lab

        def test_through_another_fixture(edge):
            pass

        def test_without():
            pass
    """, "--collect-only", "-m", "not netns")
    assert proc.returncode == 0, proc.stdout
    assert "test_without" in proc.stdout and "test_through_another_fixture" not in proc.stdout
    assert "1/2 tests collected (1 deselected)" in proc.stdout
