"""Silo child processes of the tests: wait for their ``READY <address> <gateway
port>`` line, and stop them."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence


def read_ready(proc: subprocess.Popen[str], timeout: float = 30) -> list[str]:
    """The fields after ``READY`` on the child's stdout (blocking: the silos of a
    test start in parallel, each read in turn); ``RuntimeError`` if the child exits
    or prints other lines past ``timeout``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if line.startswith("READY "):
            return line.split()[1:]
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"silo process exited or never got ready (rc={proc.poll()})")


def stop_processes(procs: Sequence[subprocess.Popen[str]], timeout: float) -> None:
    """SIGTERM every child still running, then wait up to ``timeout`` for each
    (SIGKILL past it) and close its stdout."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
        if p.stdout is not None:
            p.stdout.close()
