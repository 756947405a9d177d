"""An option the fake world accepts changes the trace, or is refused by name (issue 26, defect 1:
``recompute="selective"`` was traced exactly as ``"none"``)."""
import pytest

from helpers import fake_world as fw
from helpers.planner import Layout, Model

TINY = Model("tiny", layers=2, hidden=64, heads=4, ffn=128, seq_len=32)


def test_selective_recomputation_is_refused_by_name_not_traced_as_none():
    with pytest.raises(ValueError, match=r"recompute='selective' is not traced"):
        fw.simulate(TINY, Layout(dp=2, recompute="selective"))
    with pytest.raises(ValueError, match=r"recompute='selective' is not traced"):
        fw.check(TINY, Layout(dp=2, recompute="selective"))  # before any tracing


def test_full_recomputation_changes_the_trace():
    none, full = (fw.simulate(TINY, Layout(dp=2, recompute=r)) for r in ("none", "full"))
    assert full.flops > none.flops  # the forward runs again in the backward
    assert full.memory != none.memory
