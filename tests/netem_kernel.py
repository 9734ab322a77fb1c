"""Does this kernel have netem? Asked here on its own, not through the code under test, so
tests can check ``detect()`` against it and run (or skip) the tests that need netem.

Import the fixtures into a test module: ``from tests.netem_kernel import kernel, netem, no_netem``.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

import pytest

from tests.conftest import needs


@dataclass(frozen=True)
class KernelNetem:
    has_netem: bool
    answer: str  # tc's error message when it refused, "" when it made the qdisc

    @property
    def backend(self) -> str:
        return "netem" if self.has_netem else "userspace"


def ask_kernel() -> KernelNetem:
    """Make a netem qdisc on lo in a throwaway namespace of our own (needs root)."""
    name = f"vetest-netem-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        tc = subprocess.run(["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "netem",
                             "delay", "1ms"], capture_output=True, text=True)
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True, capture_output=True)
    return KernelNetem(tc.returncode == 0, " ".join(tc.stderr.split()))


@pytest.fixture(scope="session")
@needs("netns")
def kernel() -> KernelNetem:
    return ask_kernel()


@pytest.fixture
def netem(kernel: KernelNetem) -> KernelNetem:
    """For tests that need netem: skipped only where the kernel has none."""
    if not kernel.has_netem:
        pytest.skip(f"needs netem; this kernel has no sch_netem (tc: {kernel.answer})")
    return kernel


@pytest.fixture
def no_netem(kernel: KernelNetem) -> KernelNetem:
    """For tests of what happens on a kernel without netem: skipped where it has netem."""
    if kernel.has_netem:
        pytest.skip("this kernel has netem; the test is about kernels without it")
    return kernel
