"""The embedded demo runs, and its customer keeps her points across a deactivation."""

from __future__ import annotations

import pytest

from samples import demo


async def test_demo_keeps_state_across_a_deactivation(capsys: pytest.CaptureFixture[str]) -> None:
    await demo.main(seconds=0.1)
    out = capsys.readouterr().out
    assert "ann has 10 points" in out
    assert "activated customer ann: 10 points loaded" in out
    assert "ann has 15 points: her state outlived the activation" in out
    assert out.rstrip().endswith("silo stopped cleanly")
