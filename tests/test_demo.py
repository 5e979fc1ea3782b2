"""The embedded demo runs, and its customer keeps her points across a deactivation.

It runs in a process of its own: importing the demo here would register its
grain classes (and their declared reminders) in every later silo of the session.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_keeps_state_across_a_deactivation() -> None:
    code = "from samples import demo; from orleanspy import run; run(demo.main(seconds=0.1))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ann has 10 points" in out
    assert "activated customer ann: 10 points loaded" in out
    assert "ann has 15 points: her state outlived the activation" in out
    assert out.rstrip().endswith("silo stopped cleanly")
