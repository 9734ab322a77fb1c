"""How the edge launcher starts services side by side (scenarios/edge.py, ``Edge.side_by_side``):
real processes in a lab network namespace (root)."""
from __future__ import annotations

import sys

import pytest

from scenarios.edge import ClusterPlan, Edge, EdgePlan, Host
from scenarios.processes import ServiceError
from services.procfs import alive
from tests.conftest import lab_fixture

pytestmark = pytest.mark.shareable  # make test runs it beside another (pyproject)

lab = lab_fixture("vestart")
PORT = 47311


def _edge(lab, tmp_path) -> tuple[Edge, Host]:
    host = Host("lab", lab.name)
    public, other = lab.addresses
    return Edge(EdgePlan("port-per-session", (ClusterPlan("demo", 1, host, public=public,
                                                          internal=other),)), tmp_path), host


def _listens_after(flag) -> list[str]:
    """A process that listens on PORT once ``flag`` exists: ready only after whoever writes
    it has started."""
    return [sys.executable, "-c",
            "import os, socket, sys, time\n"
            f"while not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
            "s = socket.socket(); s.bind(('127.0.0.1', %d)); s.listen()\n"
            "time.sleep(60)\n" % PORT]


def test_services_started_side_by_side_are_waited_for_after_all_have_started(lab, tmp_path):
    """The first one's readiness needs the second one started: one at a time it never comes."""
    edge, host = _edge(lab, tmp_path)
    flag = tmp_path / "second-started"
    try:
        with edge.side_by_side():
            edge.start_external("first", host, _listens_after(flag), f"127.0.0.1:{PORT}")
            edge.start_external("second", host, ["sh", "-c", f"touch {flag}; sleep 60"])
        assert all(edge.services[n].process.alive() for n in ("first", "second"))
    finally:
        edge.stop()


def test_a_service_that_never_gets_ready_fails_the_start_and_the_others_are_stopped(lab, tmp_path):
    edge, host = _edge(lab, tmp_path)
    with pytest.raises(ServiceError, match="(?s)never exited.*no such option"):
        with edge.side_by_side():
            edge.start_external("steady", host, ["sleep", "60"])
            edge.start_external("never", host, ["sh", "-c", "echo no such option >&2; exit 3"],
                                "127.0.0.1:1")
    steady = edge.services["steady"].process
    assert steady.alive()        # started, and left for the edge's stop
    pid = steady.pid
    edge.stop()
    assert not alive(pid)
