"""An option the fake world accepts changes the trace, or is refused by name (issue 26, defect 1:
``recompute="selective"`` was traced exactly as ``"none"``)."""
import pytest

from helpers import fake_world as fw
from helpers.planner import Layout, Model

TINY = Model("tiny", layers=2, hidden=64, heads=4, ffn=128, seq_len=32)


def test_selective_recomputation_is_traced_not_as_none():
    """recompute="selective" without checkpoint_every is per-op selective checkpointing (torchtitan's
    "op" policy; tests/test_fake_world_recipes.py checks what it saves): never traced as "none"."""
    none, sel = (fw.simulate(TINY, Layout(dp=2, recompute=r), micro_batches=1) for r in ("none", "selective"))
    assert sel.flops > none.flops  # some of the forward runs again in the backward


def test_full_recomputation_changes_the_trace():
    none, full = (fw.simulate(TINY, Layout(dp=2, recompute=r)) for r in ("none", "full"))
    assert full.flops > none.flops  # the forward runs again in the backward
    assert full.memory != none.memory


# ---- the tests of issue 26's defects 2-4: each failed before its fix -------------------------------------

VOCAB = Model("tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)


def _params(m):
    """Parameters of a Llama-style model: per block Q and O (h x H d), K and V (h x kv d), three
    SwiGLU matrices, two norms; the root: embedding and output head (vocab x h), the final norm."""
    h, d = m.hidden, m.hd
    block = 2 * h * m.heads * d + 2 * h * m.kv * d + 3 * h * m.ffn + 2 * h
    return block, 2 * m.vocab * h + h


def _rows(step):
    return {(c["kind"], c["axis"], c["group_size"]): (c["calls"], c["bytes"]) for c in step.comm}


@pytest.mark.parametrize("dp", [1, 2])
def test_kv_gathers_are_labelled_cp_and_fsdp_dp_cp(dp):
    """Defect 2: with DP = 1 FSDP's DP x CP group spans the CP ranks, and the K/V all-gathers (and
    their backward reduce-scatters) were labelled dp_cp. Each collective carries its issuer's axis:
    the model's K/V traffic cp, FSDP2's parameter gathers and gradient reduce-scatters dp_cp.
    ZeRO-3 resharding every unit, 1 micro-batch: per layer one gather of K and one of V, each
    filling b x kv x s x d BF16 (the whole sequence), and their reduce-scatters; FSDP gathers each
    of the 3 units twice (BF16) and reduce-scatters it once (FP32)."""
    m, cp = VOCAB, 2
    step = fw.simulate(m, Layout(dp=dp, cp=cp, zero=3), micro_batches=1, reshard_after_forward="always")
    block, root = _params(m)
    p = m.layers * block + root
    kv = 2 * m.layers, 2 * m.layers * m.kv * m.seq_len * m.hd * 2
    assert _rows(step) == {("all_gather", "cp", cp): kv, ("reduce_scatter", "cp", cp): kv,
                           ("all_gather", "dp_cp", dp * cp): (3 * 2, 2 * 2 * p),
                           ("reduce_scatter", "dp_cp", dp * cp): (3, 4 * p)}


def test_accumulated_fp32_gradients_are_gradients():
    """Defect 3: FSDP2's FP32 gradients accumulated over micro-batches without a reduction (ZeRO-1,
    and replicate's ZeRO-0) were counted as temporaries (12.4.1's 70B: gradients 0.0 GiB). From the
    second micro-batch on, every parameter's accumulated gradient is held whole: 4 bytes x P; in a
    forward nothing else is a gradient or a temporary, so the forward's peak holds exactly 4P
    bytes of gradients. The step's peak (the last backward) holds them all too."""
    from helpers.fake_world import step as fake_step

    block, root = _params(VOCAB)
    p = VOCAB.layers * block + root
    for zero in (0, 1):
        lay = Layout(dp=2, zero=zero)
        with fw.fake_world(2):
            r = fake_step.measured_step(VOCAB, lay, [VOCAB.layers], 3, fake=True)
        forward = r["phases"]["forward"]
        assert (forward["gradients"], forward["temporaries"]) == (4 * p, 0), zero
        step = fw.simulate(VOCAB, lay, micro_batches=3, extrapolate=False)
        assert step.memory["gradients"] >= 4 * p > step.memory["temporaries"], zero
        assert step.held["gradients"] == 4 * p // (2 if zero else 1)  # FP32, sharded over DP2 under ZeRO-1


def test_checkpointed_block_inputs_are_activations():
    """Defect 3, recompute="full": what a forward keeps for backward is each block's input, one
    b x s x h BF16 tensor, filed as activations (not temporaries): one more layer adds exactly
    2 b s h bytes of activations to the forward's peak; without recomputation a layer keeps far
    more. (12.4.1's "activations 0.0 GiB" with full recomputation is right: that step's peak is the
    end of the backward, where no activation is left; see the report of issue 26.)"""
    from dataclasses import replace

    from helpers.fake_world import step as fake_step

    m, b = Model("h", layers=3, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=64), 2
    per_layer = {}
    for recompute in ("full", "none"):
        lay = Layout(dp=1, zero=3, recompute=recompute, micro_batch=b)
        fwd = []
        for layers in (3, 4):
            with fw.fake_world(1):
                r = fake_step.measured_step(replace(m, layers=layers), lay, [layers], 1, fake=True)
            fwd.append(r["phases"]["forward"])
        assert fwd[0]["temporaries"] == fwd[1]["temporaries"] == 0
        per_layer[recompute] = fwd[1]["activations"] - fwd[0]["activations"]
    assert per_layer["full"] == 2 * b * m.seq_len * m.hidden
    assert per_layer["none"] > 10 * per_layer["full"]


def test_reshard_policy_changes_the_gathers():
    """Defect 4: which fully_shard units keep their weights from forward to backward (ZeRO-3, DP2,
    2 micro-batches, units: 2 blocks and the root). A kept unit is gathered once per micro-batch,
    a resharded one twice (forward, backward); the gradients are reduce-scattered alike."""
    block, root = _params(VOCAB)
    m = 2
    kept = {"always": 0, "root": root, "default": root + block}
    for policy, kept_params in kept.items():
        gathered = 3 if policy == "always" else 2 if policy == "root" else 1  # units gathered twice
        step = fw.simulate(VOCAB, Layout(dp=2, zero=3), micro_batches=m, reshard_after_forward=policy)
        rows = _rows(step)
        p = VOCAB.layers * block + root
        assert rows["all_gather", "dp", 2] == (m * (2 * gathered + 3 - gathered), m * 2 * (2 * p - kept_params))
        assert rows["reduce_scatter", "dp", 2] == (m * 3, m * 4 * p)
    assert fw.simulate(VOCAB, Layout(dp=2, zero=3), micro_batches=m).comm == \
        fw.simulate(VOCAB, Layout(dp=2, zero=3), micro_batches=m, reshard_after_forward="default").comm


def test_reshard_policy_is_validated():
    with pytest.raises(ValueError, match=r"reshard_after_forward must be one of .* got 'never'"):
        fw.simulate(VOCAB, Layout(dp=2, zero=3), reshard_after_forward="never")
    with pytest.raises(ValueError, match=r"reshard_after_forward='always' needs ZeRO-3"):
        fw.simulate(VOCAB, Layout(dp=2, zero=2), reshard_after_forward="always")


def test_per_layer_selective_recomputation():
    """recompute="selective" with checkpoint_every=2: the 2nd and 4th of 4 identical blocks are
    checkpointed (torchtitan's selective_ac_option="2"), so the backward reruns the forward of
    exactly half the blocks that full recomputation reruns: FLOPs none + (full - none) / 2; the
    activations kept lie between those of none and full."""
    m = Model("four", layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=64)
    run = lambda recompute, **kw: fw.simulate(m, Layout(dp=1, zero=3, recompute=recompute, micro_batch=2),
                                              micro_batches=1, extrapolate=False, **kw)
    none, full, half = run("none"), run("full"), run("selective", checkpoint_every=2)
    assert full.flops > none.flops and 2 * (half.flops - none.flops) == full.flops - none.flops
    assert none.memory["activations"] > half.memory["activations"] > full.memory["activations"]
    assert run("selective", checkpoint_every=1).flops == full.flops  # every block: full recomputation
    with pytest.raises(ValueError, match="checkpoint_every needs recompute='selective'"):
        run("full", checkpoint_every=2)
    with pytest.raises(ValueError, match="checkpoint_every must be an integer >= 1"):
        run("selective", checkpoint_every=0)
