"""topology/capture.py and analysis/pcap/reader.py: a real tcpdump in a lab namespace, real datagrams on its lo."""
from __future__ import annotations

import os
import shutil
import socket
import time

import pytest

from analysis.pcap.reader import read_udp
from topology.capture import Capture, CaptureError
from tests.conftest import lab_fixture
from topology.netns import in_namespace

pytestmark = pytest.mark.skipif(shutil.which("tcpdump") is None, reason="needs tcpdump")
lab = lab_fixture("vewire")


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def _send(address: str, payloads: list[bytes]) -> tuple[int, list[float]]:
    """Send ``payloads`` to a socket of ``address``; the sender's port and send times."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind((address, 0))
    tx.bind((address, 0))
    sent = []
    for payload in payloads:
        sent.append(time.time())
        tx.sendto(payload, rx.getsockname())
        time.sleep(0.002)
    port = tx.getsockname()[1]
    rx.close()
    tx.close()
    return port, sent


def test_capture_in_namespace_reads_back(lab, tmp_path):
    path = tmp_path / "lo.pcap"
    payloads = [bytes([i]) * (10 + i) for i in range(50)] + [b"x" * 1000]
    address = lab.addresses[0]
    with Capture(path, netns=lab.name, bpf_filter="udp") as cap:
        pid = cap.pid
        port, sent = in_namespace(lab.name, _send, address, payloads)
    assert _gone(pid)
    assert cap.stats.captured == len(payloads) and cap.stats.dropped_by_kernel == 0
    got = [d for d in read_udp(path) if d.src_port == port]
    assert [d.payload for d in got[:-1]] == payloads[:-1]  # each datagram once, on lo
    assert got[-1].payload == b"x" * (256 - 14 - 20 - 8)  # cut at the snaplen
    assert all(d.src_ip == address == d.dst_ip for d in got)
    assert max(abs(d.timestamp_s - t) for d, t in zip(got, sent)) < 0.05
    gaps = [b.timestamp_s - a.timestamp_s for a, b in zip(got, got[1:])]
    assert min(gaps) > 0.0015  # the 2 ms spacing, at sub-millisecond resolution


def test_bpf_filter_and_no_process_left_on_error(lab, tmp_path):
    path = tmp_path / "f.pcap"
    with pytest.raises(RuntimeError, match="boom"):
        with Capture(path, netns=lab.name, bpf_filter="udp and not src port 1") as cap:
            pid = cap.pid
            in_namespace(lab.name, _send, lab.addresses[1], [b"a", b"b"])
            raise RuntimeError("boom")
    assert _gone(pid) and cap.stats is not None
    assert len(list(read_udp(path))) == 2
    with pytest.raises(CaptureError, match="tcpdump did not start"):
        Capture(tmp_path / "bad.pcap", netns=lab.name, bpf_filter="udp and nonsense").start()
    with pytest.raises(CaptureError):
        Capture(tmp_path / "bad.pcap", interface="nosuchdev0", netns=lab.name).start()


def test_cooked_v2_frames_say_their_interface_and_direction(lab, tmp_path):
    """tcpdump -i any -y LINUX_SLL2, as a world's capture points run it: every frame names its
    interface; on lo each datagram is seen once, as received."""
    path = tmp_path / "any.pcap"
    lo = in_namespace(lab.name, socket.if_nametoindex, "lo")
    with Capture(path, interface="any", netns=lab.name, link_type="LINUX_SLL2") as cap:
        port, _ = in_namespace(lab.name, _send, lab.addresses[0], [b"one", b"two"])
    assert cap.stats.captured == 2
    got = [d for d in read_udp(path) if d.src_port == port]
    assert [(d.payload, d.length, d.ifindex, d.outgoing) for d in got] == [
        (b"one", 3, lo, False), (b"two", 3, lo, False)]
    with Capture(tmp_path / "out.pcap", interface="any", netns=lab.name,
                 link_type="LINUX_SLL2", direction="out") as cap:
        in_namespace(lab.name, _send, lab.addresses[0], [b"three"])
    assert cap.stats.captured == 0  # lo's sent copies are dropped, its received ones filtered
