"""Real training recipes in the fake world (helpers.fake_world.recipes; issue 26, "Real recipes"):
per-op selective activation checkpointing, the loss on FP32-upcast logits, AdamW's implementation.
Each figure is derived from the model's shapes and checked exactly."""
from dataclasses import replace

import pytest
import torch

from helpers import fake_world as fw
from helpers.fake_world import recipes
from helpers.fake_world import step as fake_step
from helpers.planner import Layout, Model

# 4 heads of 16, 2 KV heads, SwiGLU 128; b 2 x s 512 tokens: activations dominate the forward
M = Model("sac", layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=512, vocab=256)
B = 2
S = replace(M, layers=2, seq_len=64)  # where activations need not dominate


def _step(model, layout, m=1, **kw):
    with fw.fake_world(layout.devices):
        return fake_step.measured_step(model, layout, [model.layers], m, fake=True, **kw)


def _saved_per_block(m, b):
    """Bytes torchtitan's per-op policy saves per block and micro-batch, besides the block's input:
    the BF16 outputs of wq, wv, w1, w2 (the 1st, 3rd, 5th, 7th of the block's 7 matmuls: wq, wk,
    wv, wo, w1, w3, w2), and attention's BF16 output and FP32 log-sum-exp."""
    t, d = b * m.seq_len, m.hd
    mm = 2 * t * (m.heads * d + m.kv * d + m.ffn + m.hidden)
    return mm + 2 * t * m.heads * d + 4 * b * m.heads * m.seq_len


def test_per_op_policy_saves_what_torchtitan_saves():
    """The policy's decisions on one real Llama block's forward: of the 7 matmuls the odd ones
    are saved, and attention's output; every other op is recomputed."""
    from helpers.fake_world.llama_model import Block, rope_tables
    from helpers.torch_private import checkpoint_wrapper

    log = []
    blk = checkpoint_wrapper(Block(M), preserve_rng_state=False, context_fn=recipes.op_sac_context_fn(log))
    x = torch.randn(1, 8, M.hidden, requires_grad=True)
    cos, sin = rope_tables(torch.arange(8), M.hd, x.dtype)
    blk(x, cos, sin).sum().backward()
    mm = torch.ops.aten.mm.default
    saved = [str(op) for op, s in log if s]
    assert [s for op, s in log if op == mm] == [True, False, True, False, True, False, True]
    assert saved == ["aten.mm.default"] * 2 + ["aten._scaled_dot_product_flash_attention_for_cpu.default"] + \
        ["aten.mm.default"] * 2
    assert sum(1 for _, s in log if not s) > 10  # norms, rotary, SwiGLU, ... recomputed


def test_per_op_selective_memory_and_flops_between_none_and_full():
    """Per-op selective checkpointing (recompute="selective" without checkpoint_every): the forward
    keeps, per block, exactly the saved outputs more than full recomputation (which keeps only the
    block's input), and the backward reruns exactly the forwards of the recomputed matmuls (wk, wo,
    w3: 2 x tokens x (h x kv d + H d x h + h x ffn) FLOPs per block)."""
    runs = {r: _step(M, Layout(dp=2, recompute=r, micro_batch=B)) for r in ("none", "selective", "full")}
    act = {r: x["phases"]["forward"]["activations"] for r, x in runs.items()}
    assert act["none"] > act["selective"] > act["full"]
    assert act["selective"] - act["full"] == M.layers * _saved_per_block(M, B)
    flops = {r: x["flops"] for r, x in runs.items()}
    assert flops["none"] < flops["selective"] < flops["full"]
    t, d = B * M.seq_len, M.hd
    assert flops["selective"] - flops["none"] == M.layers * 2 * t * (M.hidden * M.kv * d + M.heads * d * M.hidden
                                                                     + M.hidden * M.ffn)
    peaks = {r: max(p["total"] for p in x["phases"].values()) for r, x in runs.items()}
    assert peaks["none"] > peaks["selective"] > peaks["full"]


def test_per_op_selective_with_sequence_parallelism_saves_the_reduce_scatters():
    """Under TP 2 with sequence parallelism the policy also saves the functional reduce-scatters of
    the row-parallel outputs (wo, w2), so the recompute issues no collective: the step's collectives
    are those of no recomputation, while full recomputation repeats the forward's."""
    lay = lambda r: Layout(dp=1, tp=2, sequence_parallel=True, recompute=r)
    calls = {r: sum(1 for op in _step(S, lay(r))["ops"] if op[0] == "reduce_scatter" and op[3] == "tp")
             for r in ("none", "selective", "full")}
    assert calls["selective"] == calls["none"] < calls["full"]


def test_fp32_loss_grows_the_peak_by_the_upcast_logits():
    """loss_dtype="float32" (torchtitan's cross_entropy(logits.float())): inside the loss the BF16
    logits, their FP32 copy and the FP32 log-softmax are alive at once (2 + 4 + 4 bytes a logit)
    where the BF16 loss holds the logits and a BF16 log-softmax (2 + 2): 6 bytes per logit more at
    the forward's peak and at the step's (a large vocabulary: the loss is the peak), plus a few
    bytes of FP32 scalars."""
    m = Model("vocab", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=256, vocab=8192)
    lay = Layout(dp=2)
    r = {d: _step(m, lay, loss_dtype=d) for d in ("float32", "bfloat16")}
    logits = m.seq_len * m.vocab
    for ph in ("forward", "backward"):
        extra = r["float32"]["phases"][ph]["total"] - r["bfloat16"]["phases"][ph]["total"]
        assert 0 <= extra - 6 * logits <= 16, ph
    steps = {d: fw.simulate(m, lay, micro_batches=1, loss_dtype=d) for d in ("float32", "bfloat16")}
    assert 0 <= steps["float32"].peak_bytes - steps["bfloat16"].peak_bytes - 6 * logits <= 16
    assert fw.simulate(m, lay, micro_batches=1).memory == steps["float32"].memory  # the default


def test_optimizer_implementations_and_their_temporaries():
    """AdamW's step (ZeRO-3, DP 2 x TP 2: every parameter sharded). Fused updates in place: the
    optimizer phase's peak is the state alone; foreach's multi-tensor step allocates the square
    roots of all the second moments at once, one FP32 copy of the rank's parameter shards; the
    per-parameter loop one parameter's temporaries at a time, more than none and less than foreach."""
    lay = Layout(dp=2, tp=2, zero=3)
    r = {o: _step(S, lay, optimizer=o) for o in recipes.OPTIMIZERS}
    opt = {o: x["phases"]["optimizer"]["optimizer"] for o, x in r.items()}
    moments = r["fused"]["held"]["optimizer"]  # exp_avg and exp_avg_sq (FP32) and the step counters
    shards = r["fused"]["held"]["parameters"]  # the FP32 parameter shards
    assert opt["fused"] == moments
    assert opt["foreach"] - moments == shards
    assert 0 < opt["for-loop"] - moments < shards
    assert r["for-loop"]["phases"] == _step(S, lay)["phases"]  # the default


def test_recipe_options_are_refused_by_name():
    for kw, name in ((dict(loss_dtype="float16"), "loss_dtype"), (dict(optimizer="adam"), "optimizer"),
                     (dict(optimizer=True), "optimizer")):
        with pytest.raises(ValueError, match=name):
            fw.simulate(S, Layout(dp=2), **kw)


def test_per_op_selective_extrapolates_exactly():
    """trace_layers with per-op selective: the scaled figures equal a trace of every layer."""
    m = replace(S, layers=5)
    lay = Layout(dp=2, recompute="selective")
    full = fw.simulate(m, lay, micro_batches=2, extrapolate=False)
    scaled = fw.simulate(m, lay, micro_batches=2, trace_layers=2, extrapolate="always")
    assert (scaled.memory, scaled.flops, scaled.comm) == (full.memory, full.flops, full.comm)
