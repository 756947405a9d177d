"""helpers.recompute (and the recomputation formulas of helpers.costs, the planner's policies):
bytes kept, FLOPs and gradients of a block under checkpoint, against Korthikanti et al.'s count."""
import pytest
import torch

from helpers import costs
from helpers import planner as pl
from helpers import recompute as rc
from helpers import tp_block as tb

CFG = tb.BlockConfig(h=32, heads=4, ffn=128, p_drop=0.1)
S, B = 16, 2


@pytest.fixture(scope="module")
def rows():
    return {r["policy"]: r for r in rc.compare(CFG, S, B)}


# ---- the formulas, by hand ---------------------------------------------------------------------

def test_formulas_by_policy():
    s, b, h, a = 4096, 4, 5120, 80
    sbh, as2b = s * b * h, a * s * s * b
    assert costs.recompute_kept_bytes("none", s, b, h, a) == 34 * sbh + 5 * as2b
    assert costs.recompute_kept_bytes("selective", s, b, h, a) == 34 * sbh
    assert costs.recompute_kept_bytes("full", s, b, h, a) == 2 * sbh
    assert costs.recompute_kept_bytes("selective", s, b, h, a, 8, True) == 34 * sbh / 8
    assert costs.recompute_kept_bytes("full", s, b, h, a, 8, True) == 2 * sbh / 8
    # FlashAttention already drops the scores: selective keeps what none keeps
    assert costs.recompute_kept_bytes("none", s, b, h, a, attention_scores=False) == 34 * sbh
    assert costs.recompute_rematerialised_bytes("none", s, b, h, a) == 0
    assert costs.recompute_rematerialised_bytes("selective", s, b, h, a) == 5 * as2b
    assert costs.recompute_rematerialised_bytes("selective", s, b, h, a, attention_scores=False) == 0
    assert costs.recompute_rematerialised_bytes("full", s, b, h, a) == 34 * sbh + 5 * as2b
    tokens, ffn = s * b, 4 * h
    assert costs.recompute_forward_flops("selective", tokens, h, ffn, s) == 4 * b * s * s * h
    assert costs.recompute_forward_flops("full", tokens, h, ffn, s) == 24 * s * b * h * h + 4 * b * s * s * h
    N, L = 13e9, 40
    assert costs.recompute_flops_per_token("full", N, L, s, h) == pytest.approx((6 * N + 12 * L * s * h) / 3)
    assert costs.recompute_flops_per_token("selective", N, L, s, h) == 4 * L * s * h
    assert costs.recompute_flops_per_token("none", N, L, s, h) == 0


# ---- measured against the formulas -----------------------------------------------------------------

def test_saved_bytes_equal_the_formula(rows):
    sbh = S * B * CFG.h
    assert [rows[p]["measured"] for p in rc.POLICIES] == [44 * sbh, 34 * sbh, 2 * sbh]  # 5as/h = 10 here
    for p in rc.POLICIES:
        assert rows[p]["measured"] == costs.recompute_kept_bytes(p, S, B, CFG.h, CFG.heads)
    # the documented gap: LayerNorm's mean and 1/std, 2 per LayerNorm, (s, b, 1) in bf16; none under full
    assert [rows[p]["layernorm_stats"] for p in rc.POLICIES] == [8 * S * B, 8 * S * B, 0]
    # selective keeps the attention core's input, the (s, b, 3h) qkv, in place of the Q, K, V copies
    shapes = [e[0] for e in rows["selective"]["run"]["entries"]]
    assert (S, B, 3 * CFG.h) in shapes and not any(len(sh) == 4 for sh in shapes)


def test_saved_bytes_at_another_shape():
    cfg = tb.BlockConfig(h=16, heads=2, ffn=64, p_drop=0.2, seed=3)
    for p in rc.POLICIES:
        got = rc.measure(cfg, 8, 3, p)
        assert got["activations"] == costs.recompute_kept_bytes(p, 8, 3, 16, 2)


def test_flops_per_policy(rows):
    F = costs.layer_forward_flops(S * B, CFG.h, CFG.ffn, S)
    step = {p: rows[p]["step_flops"] for p in rc.POLICIES}
    assert rows["none"]["run"]["forward_flops"] == F and step["none"] == 3 * F
    assert step["full"] == 4 * F and rows["full"]["flops_ratio"] == pytest.approx(4 / 3, abs=0)
    # PyTorch's early stop skips the last product (x V), whose output backward does not need
    assert step["selective"] == 3 * F + 2 * B * S * S * CFG.h
    lazy = rc.measure(CFG, S, B, "selective", early_stop=False)
    assert lazy["forward_flops"] + lazy["backward_flops"] == rc.modelled(CFG, S, B, "selective")["step_flops"]
    # without dropout the last saved tensor is fc2's input: early stop skips fc2 itself
    nodrop = tb.BlockConfig(h=32, heads=4, ffn=128)
    full = rc.measure(nodrop, S, B, "full")
    assert full["forward_flops"] + full["backward_flops"] == 4 * F - 2 * S * B * CFG.h * CFG.ffn


def test_gradients_equal_the_block_without_checkpoint(rows):
    assert all(rows[p]["grad_diff"] == 0.0 for p in rc.POLICIES)  # bf16, bitwise
    # float64, against the functional reference block (no checkpoint, no nn.Module)
    cfg = tb.BlockConfig(h=16, heads=2, ffn=64, p_drop=0.3, seed=5)
    P = {k: v.clone().requires_grad_() for k, v in tb.make_block_params(cfg, 0, torch.float64).items()}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 2, 16, generator=g, dtype=torch.float64).requires_grad_()
    up = torch.randn(8, 2, 16, generator=g, dtype=torch.float64)
    tb.reference_block(x, P, cfg).backward(up)
    for p in rc.POLICIES:
        got = rc.measure(cfg, 8, 2, p, torch.float64)
        assert torch.allclose(got["grads"]["x"], x.grad, rtol=0, atol=1e-12)
        assert all(torch.allclose(got["grads"][k], P[k].grad, rtol=0, atol=1e-12) for k in P)


def test_rng_state_is_what_keeps_global_rng_dropout_right():
    for p in ("selective", "full"):
        d = rc.rng_check(CFG, S, B, p)
        assert d[True] == 0.0 and d[False] > 1e-2


def test_peak_grows_by_the_kept_bytes_per_layer():
    cfg = tb.BlockConfig(h=8, heads=2, ffn=32, p_drop=0.1)  # weight gradients (1.7 sbh) < kept input (2 sbh)
    s, b = 64, 2
    for p in rc.POLICIES:
        stats = 0 if p == "full" else 8 * s * b
        assert rc.peak_growth(cfg, s, b, p, layers=(1, 2)) == costs.recompute_kept_bytes(p, s, b, 8, 2) + stats


# ---- the planner's policies against the measurement ----------------------------------------------------

def test_planner_policies_match_the_measured_block(rows):
    model = pl.Model("block", layers=1, hidden=CFG.h, heads=CFG.heads, ffn=CFG.ffn, seq_len=S)
    one, rules = pl.h100_cluster(1), pl.Rules(flash_attention=False)
    assert model.flops_per_token() * S * B == rows["none"]["step_flops"]
    compute = {}
    for p in rc.POLICIES:
        lay = pl.Layout(dp=1, micro_batch=B, recompute=p)
        assert pl.stage_activation_bytes(model, lay, 1, rules)["kept per layer"] == rows[p]["measured"]
        compute[p] = pl.step_time_breakdown(model, one, B, lay, 1, rules)["compute"]
    assert compute["full"] / compute["none"] == pytest.approx(rows["full"]["flops_ratio"], rel=1e-12)
    assert compute["selective"] / compute["none"] == pytest.approx(rows["selective"]["model_ratio"], rel=1e-12)


def test_planner_selective_on_the_70b_example():
    m, c = pl.book_70b(), pl.h100_cluster(256)
    lay = {p: pl.Layout(dp=32, tp=8, zero=1, recompute=p) for p in rc.POLICIES}
    no_flash = {p: pl.assess(m, c, 2048, lay[p], pl.Rules(flash_attention=False)) for p in rc.POLICIES}
    assert not no_flash["none"].ok and no_flash["selective"].ok and no_flash["full"].ok
    assert no_flash["none"].step_s < no_flash["selective"].step_s < no_flash["full"].step_s
    flash = {p: pl.assess(m, c, 2048, lay[p]) for p in ("none", "selective")}
    assert flash["none"].memory["total"] == flash["selective"].memory["total"]
    assert lay["selective"].label().endswith("sel-recompute") and pl.RECOMPUTE == ("none", "full")


# ---- bad input ------------------------------------------------------------------------------------

def test_bad_input_is_rejected():
    P = tb.make_block_params(CFG, 0, torch.bfloat16)
    with pytest.raises(ValueError, match="recomputation policy must be one of"):
        rc.RecomputeBlock(P, CFG, "partial")
    with pytest.raises(ValueError, match="recomputation policy must be one of"):
        costs.recompute_kept_bytes("attention", 8, 1, 8, 2)
    with pytest.raises(ValueError, match="recompute must be one of"):
        pl.Layout(dp=1, recompute="Selective")
    with pytest.raises(ValueError, match="FFN width 4h"):
        rc.compare(tb.BlockConfig(h=32, heads=4, ffn=96, p_drop=0.1), S, B)
    with pytest.raises(ValueError, match="p_drop > 0"):
        rc.modelled(tb.BlockConfig(h=32, heads=4, ffn=128), S, B, "none")
    with pytest.raises(ValueError, match="sequence length s"):
        rc.measure(CFG, 0, B, "none")
    with pytest.raises(ValueError, match="p_drop > 0"):
        rc.rng_check(tb.BlockConfig(h=32, heads=4, ffn=128), S, B, "full")
    with pytest.raises(ValueError, match="two increasing stack depths"):
        rc.peak_growth(CFG, S, B, "none", layers=(3, 1))
    with pytest.raises(TypeError, match="TorchBlock"):
        rc.measure_block(torch.nn.Linear(4, 4), S, B)


# ---- 12.3.1's exercise 4: the check sees how the recomputation was done ------------------------------

def test_exercise_check_tells_selective_from_full_and_none(capsys):
    from torch.utils.checkpoint import checkpoint

    from helpers.course.exercises import c12_3_1

    class Selective(tb.TorchBlock):
        def attention(self, qkv):
            return checkpoint(super().attention, qkv, use_reentrant=False)

    class Full(tb.TorchBlock):
        def forward(self, x):
            return checkpoint(super().forward, x, use_reentrant=False)

    class Wide(tb.TorchBlock):  # recomputes the QKV projection too
        def attention(self, qkv):
            return super().attention(qkv)

        def forward(self, x):
            ctx = checkpoint(lambda z: self.attention(self.qkv(self.ln1(z))), x, use_reentrant=False)
            h1 = x + self.o(ctx)
            return h1 + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(h1)), approximate="tanh"))

    c12_3_1.ex4(Selective)
    assert capsys.readouterr().out.count("correct:") == 3
    for wrong, says in ((Full, "full recomputation"), (tb.TorchBlock, "nothing is recomputed"), (Wide, "34 sbh"), (None, "not answered")):
        with pytest.raises(AssertionError, match=says):
            c12_3_1.ex4(wrong)
