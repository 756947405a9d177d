"""fake_world.timing.with_micro_batches: one trace extended to more micro-batches times as a trace of them."""
from dataclasses import replace

import pytest

from helpers import fake_world as fw
from helpers.fake_world import timing
from helpers.planner import Layout, Model

TINY = Model("tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
# interleaved: 4 layers on 2 ranks of 2 chunks; rank 0's warm-up is a round (PP x V = 4) long, so 4 PP = 8
# micro-batches hold a steady round between the first and the last, repeated twice for 12
CASES = {"1F1B on 2 stages": (TINY, Layout(dp=1, pp=2), 4, 9), "DP 2, ZeRO-1": (TINY, Layout(dp=2, zero=1), 3, 7),
         "interleaved, 2 x 2 chunks": (replace(TINY, layers=4), Layout(dp=1, pp=2, v=2), 8, 12)}


@pytest.fixture(scope="module")
def traces():
    return {name: (fw.simulate(model, lay, micro_batches=m0), fw.simulate(model, lay, micro_batches=m), m0, m)
            for name, (model, lay, m0, m) in CASES.items()}


@pytest.mark.parametrize("name", CASES)
def test_an_extended_trace_times_as_a_trace_of_that_many_micro_batches(traces, name):
    short, full, m0, m = traces[name]
    longer = timing.with_micro_batches(short, m)
    assert longer.micro_batches == m and longer.flops == pytest.approx(full.flops, rel=1e-12)
    assert [(p["kind"], p.get("c"), p["i"]) for p in longer.timing] == [(p["kind"], p.get("c"), p["i"]) for p in full.timing]
    a, b = fw.step_time(longer, planner=False), fw.step_time(full, planner=False)
    assert a.step_s == pytest.approx(b.step_s, rel=1e-12) and a.mfu == pytest.approx(b.mfu, rel=1e-12)
    assert a.breakdown == pytest.approx(b.breakdown, rel=1e-12, abs=1e-15)
    assert fw.step_time(short, planner=False).step_s < a.step_s
    assert timing.with_micro_batches(short, m0) is short


def test_phase_flops_add_up_to_the_steps_flops(traces):
    for short, full, _, _ in traces.values():
        for step in (short, full):
            assert sum(timing.phase_flops(p) for p in step.timing) == pytest.approx(step.flops, rel=1e-12)


def test_bad_requests_are_refused(traces):
    short = traces["1F1B on 2 stages"][0]  # 4 micro-batches; stage 0 warms up with 1 forward
    with pytest.raises(ValueError, match="extended, not cut"):
        timing.with_micro_batches(short, 3)
    with pytest.raises(ValueError, match="micro_batches"):
        timing.with_micro_batches(short, 5.5)
    cut = replace(short, micro_batches=3)  # fewer micro-batches than 1F1B's warm-up and one steady iteration
    with pytest.raises(ValueError, match="no steady iteration"):
        timing.with_micro_batches(cut, 5)
    with pytest.raises(ValueError, match="no op trace"):
        timing.with_micro_batches(replace(short, timing=None), 5)
    inter = traces["interleaved, 2 x 2 chunks"][0]  # 8 micro-batches on 2 ranks
    with pytest.raises(ValueError, match="multiple of PP = 2"):
        timing.with_micro_batches(inter, 9)
    few = fw.simulate(replace(TINY, layers=4), Layout(dp=1, pp=2, v=2), micro_batches=6)  # 3 PP: rank 0 needs 4
    with pytest.raises(ValueError, match="no steady round"):
        timing.with_micro_batches(few, 8)
