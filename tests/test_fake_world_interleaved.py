"""The fake world's interleaved 1F1B traces extrapolated (helpers.fake_world, issue 26): traces of fewer
layers per chunk and fewer rounds of steady iterations, scaled, equal a trace of everything. (Its
equality with real gloo ranks is in tests/test_fake_world.py, its timing in test_fake_world_timing.py.)"""
from helpers import fake_world as fw
from helpers.planner import Layout, Model

UNEVEN = Model("uneven", layers=22, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)


def _key(step):
    """Every phase of the timing trace (the optimizer's phase keeps the traced micro-batch count as its
    i, as in a shortened 1F1B trace)."""
    return [(p["kind"], p.get("c"), p["i"] if p["kind"] in ("F", "B") else None, p["ops"], p["mem"], p["comm"])
            for p in step.timing]


def _same(part, full):
    assert (part.memory, part.held, part.comm, part.flops) == (full.memory, full.held, full.comm, full.flops)
    assert part.peak_bytes == full.peak_bytes and _key(part) == _key(full)


def test_scaled_interleaved_trace_equals_the_full_trace():
    """2 ranks of 2 chunks of uneven layers ([5, 6, 6, 5]: rank 0 holds 5 and 6), 10 micro-batches,
    ZeRO-1 (gradients reduced in each chunk's last backward): with trace_layers=3 rank 0's chunks are
    traced with 2-3, 3-4 and 4-5 layers, and with 8 micro-batches (its warm-up, 4 forwards, is a round
    of PP x V = 4 long: 4 PP are traced), the round not traced added from the second; every figure, and
    the timing trace phase by phase, equals a trace of everything."""
    lay, stages, m = Layout(dp=1, pp=2, v=2, zero=1), [5, 6, 6, 5], 10
    part = fw.simulate(UNEVEN, lay, micro_batches=m, stages=stages, trace_layers=3, extrapolate="always",
                       max_layer_passes=400)
    assert part.layers_traced == (4, 5) and part.micro_batches_traced == 8
    assert len(part.notes) == 3, "nothing was scaled: the test would not test the scaling"
    full = fw.simulate(UNEVEN, lay, micro_batches=m, stages=stages, extrapolate=False)
    assert full.micro_batches_traced == m and full.stage_layers == part.stage_layers == 11
    _same(part, full)


def test_rounds_extrapolated_after_a_short_warm_up():
    """Rank 1 (warm-up 2 forwards, shorter than a round): 3 PP = 6 of 8 micro-batches traced, every layer,
    ZeRO-2 over DP 2 (weights gathered once per step, gradients reduce-scattered every micro-batch)."""
    model, lay, m = Model("even", layers=12, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32,
                          vocab=256), Layout(dp=2, pp=2, v=2, zero=2), 8
    part = fw.simulate(model, lay, micro_batches=m, rank=3, extrapolate="always")
    assert part.layers_traced == (3,) and part.micro_batches_traced == 6
    assert any("steady interleaved 1F1B iterations" in n for n in part.notes)
    _same(part, fw.simulate(model, lay, micro_batches=m, rank=3, extrapolate=False))
