"""Wait for a silo child process's ``READY <address> <gateway port>`` line."""

from __future__ import annotations

import subprocess
import time


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
