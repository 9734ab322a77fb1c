"""SIGTERM and SIGHUP end a command the way Ctrl-C does.

Python's default for SIGTERM and SIGHUP is to die on the spot: no ``finally``, no context
manager's exit, so every service, namespace and folder a command started stays behind. Inside
``stop_signals()`` both raise ``KeyboardInterrupt`` instead (through whatever SIGINT handler is
current, so inside ``asyncio.run`` they cancel the main task exactly as Ctrl-C does), and the
command unwinds through the cleanup it already has for Ctrl-C. Only the first stop signal
interrupts: later SIGTERM and SIGHUP are ignored while the command cleans up (a second Ctrl-C
still interrupts, as always; the reaper, voiceedge/reaper.py, catches what that leaves).

The exit status says which signal ended the command: 128 + its number (SIGINT 130, SIGTERM
143, SIGHUP 129), as a shell reports a process killed by it.
"""
from __future__ import annotations

import signal
import subprocess
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_REDIRECTED = (signal.SIGTERM, signal.SIGHUP)


def exit_status(signum: int) -> int:
    """The exit status of a command ended by ``signum`` (128 + its number)."""
    return 128 + int(signum)


class stop_signals:
    """Context manager (main thread only): SIGTERM and SIGHUP raise ``KeyboardInterrupt`` as
    SIGINT does. ``received``: the first SIGTERM or SIGHUP seen, or None (Ctrl-C, or no
    signal). Exiting puts the previous handlers back."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._saved: dict[int, object] = {}

    def __enter__(self) -> "stop_signals":
        if threading.current_thread() is not threading.main_thread():
            return self  # signals are delivered to the main thread only: nothing to do
        for sig in _REDIRECTED:
            self._saved[sig] = signal.signal(sig, self._on_stop)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()

    def status(self) -> int:
        """The exit status for an interrupted command: 128 + the first stop signal (130 for
        Ctrl-C)."""
        return exit_status(self.received or signal.SIGINT)

    def _on_stop(self, signum, frame) -> None:
        if self.received is not None:
            return  # already unwinding: let the cleanup finish
        self.received = signal.Signals(signum)
        # Through the current SIGINT handler (SIGINT itself is left alone): inside asyncio.run
        # that is asyncio's, which cancels the main task as on Ctrl-C; elsewhere Python's.
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # SIGINT ignored (a background job of a shell script)
            raise KeyboardInterrupt


def run_child(cmd: list[str], *, stop_timeout: float = 120.0, **popen) -> \
        subprocess.CompletedProcess:
    """``subprocess.run(cmd, **popen)`` for a child that cleans up on SIGTERM (a voiceedge
    command): when this process is interrupted, the child gets SIGTERM and up to
    ``stop_timeout`` s to unwind (``subprocess.run`` would SIGKILL it, leaving its services
    behind), then SIGKILL; the interrupt is then raised again."""
    capture = popen.pop("capture_output", False)
    if capture:
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("stderr", subprocess.PIPE)
    with subprocess.Popen(cmd, **popen) as proc:
        try:
            out, err = proc.communicate()
        except BaseException:
            proc.terminate()
            try:
                proc.communicate(timeout=stop_timeout)
            except BaseException:
                proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
