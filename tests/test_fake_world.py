"""The fake world checked against reality: the same training step on real gloo ranks (real tensors)
and on a fake world (fake process group, fake tensors) gives the same bytes per category, the same
collectives and the same FLOPs; the scaled traces equal full ones; bad layouts are refused."""
import sys
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from helpers import fake_step
from helpers import fake_world as fw
from helpers.planner import Layout, Model

TINY = Model("tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
# the three layouts of the issue on 4 ranks: FSDP2 over DP4, TP2 x DP2 with sequence parallelism,
# a 2-stage pipeline x DP2 (ZeRO-2: weights kept for the step, gradients reduce-scattered); and interleaved
# 1F1B (issue 26): 2 ranks of 2 chunks x DP2 under ZeRO-2 (each chunk its own FSDP root; both directions
# between the two ranks carry activations and gradients), and 4 ranks of 2 chunks under ZeRO-1 with m = PP
# (Megatron's all-forwards-first warm-up; the last rank's chunk 0 feeds the first rank's chunk 1). Not
# ZeRO-3 interleaved: on gloo, under load, its gathers' and reduce-scatters' buffers outlived their last
# use on the backend's worker thread into rank 0's peak (65,792 bytes of temporaries more on the real
# ranks, once in a suite run on two loaded cores); the fake world's collectives hold nothing
LAYOUTS = [(TINY, Layout(dp=4, zero=3), 2), (TINY, Layout(dp=2, tp=2, zero=3), 2), (TINY, Layout(dp=2, pp=2, zero=2), 2),
           (replace(TINY, layers=4), Layout(dp=2, pp=2, v=2, zero=2), 4),
           (replace(TINY, layers=8), Layout(dp=1, pp=4, v=2, zero=1), 4)]


def _stages(model, lay):
    return [model.layers // (lay.pp * lay.v)] * (lay.pp * lay.v)


def _real_steps(layouts):
    """On every real rank: the measured step of each layout (one launch for all of them)."""
    out = []
    for model, lay, m in layouts:
        out.append(fake_step.worker(model, lay, _stages(model, lay), m))
    return out


def test_leaves_no_process_group_and_cleans_up_on_error():
    with pytest.raises(ZeroDivisionError):
        with fw.fake_world(8, 3):
            assert dist.get_world_size() == 8 and dist.get_rank() == 3
            1 / 0
    assert not dist.is_initialized()
    with fw.fake_world(4):
        with pytest.raises(RuntimeError, match="already initialised"):
            with fw.fake_world(4):
                pass
    assert not dist.is_initialized()


@pytest.fixture(scope="module")
def real():
    from helpers.launcher import launch

    fw.simulate(TINY, Layout(dp=2, zero=3), micro_batches=1)  # a fake world first: the launch must not mind
    assert not dist.is_initialized()
    return launch(_real_steps, LAYOUTS, world_size=4, record=False, quiet=True, timeout=150).results


@pytest.mark.parametrize("i", range(len(LAYOUTS)))
def test_fake_world_equals_real_ranks(real, i):
    model, lay, m = LAYOUTS[i]
    for rank in sorted({0, lay.devices - 1}):  # for the pipeline: the first and the last stage
        fake = fw.simulate(model, lay, micro_batches=m, rank=rank)
        mine = real[rank][i]
        assert fake.memory == mine["peak"], (lay.label(), rank)  # bytes at the peak, by category
        assert fake.held == mine["held"]  # parameters, gradients and optimizer state after the step
        assert fake.reserve == mine["reserve"]  # the same allocations and frees, through the allocator model
        assert fake.comm == fw.comm_rows(mine["ops"])  # every collective: kind, group, calls, bytes
        assert fake.flops == mine["flops"] > 0
        assert fake.memory["optimizer"] > 0 and fake.memory["activations"] > 0


def test_interleaved_hand_offs_go_to_the_right_ranks(real):
    """PP 4 x 2 chunks, 4 micro-batches: the last rank (3) holds virtual stages 3 and 7. Its chunk 0
    sends activations on to rank 0 (virtual stage 4) and receives gradients from it; every other
    hand-off is with rank 2 (virtual stages 2 and 6): by hand, 4 micro-batches each way per chunk."""
    from collections import Counter

    model, lay, m = LAYOUTS[4]
    with fw.fake_world(lay.devices, 3):
        fake = fake_step.measured_step(model, lay, _stages(model, lay), m, fake=True)
    assert Counter(fake["p2p"]) == {("send", 0): 4, ("recv", 0): 4, ("send", 2): 8, ("recv", 2): 8}
    assert fake["p2p"] == real[3][4]["p2p"]  # the same sends and receives, in the same order, as on gloo


def test_the_comparison_sees_a_difference(real):
    """The real-vs-fake comparison is not vacuous: another ZeRO stage or micro-batch count differs."""
    _, lay, m = LAYOUTS[0]
    mine = real[0][0]
    other = fw.simulate(TINY, Layout(dp=4, zero=2), micro_batches=m)
    assert other.memory != mine["peak"] and other.comm != fw.comm_rows(mine["ops"])
    more = fw.simulate(TINY, lay, micro_batches=m + 1)
    assert more.flops == mine["flops"] * (m + 1) // m
    # interleaving is not plain 1F1B: the same 4 layers on 2 ranks without chunks hold and send otherwise
    model, lay, m = LAYOUTS[3]
    plain = fw.simulate(model, replace(lay, v=1), micro_batches=m)
    assert plain.memory != real[0][3]["peak"] and plain.comm != fw.comm_rows(real[0][3]["ops"])


def test_counts_are_the_mechanisms():
    """FSDP2 over DP4, ZeRO-3, 2 micro-batches: each of the 3 FSDP units (2 blocks + the stage's
    embedding, norm and head) gathers its weights in forward and again in backward for every
    micro-batch (reshard_after_forward="always") and reduce-scatters its gradients; BF16 gathers,
    FP32 gradient reductions."""
    r = fw.simulate(TINY, Layout(dp=4, zero=3), micro_batches=2, reshard_after_forward="always")
    rows = {(c["kind"], c["axis"], c["group_size"]): c for c in r.comm}
    ag, rs = ("all_gather", "dp", 4), ("reduce_scatter", "dp", 4)
    assert set(rows) == {ag, rs}
    assert rows[ag]["calls"] == 3 * 2 * 2 and rows[rs]["calls"] == 3 * 2
    params = sum(p for p in _param_counts(TINY))
    assert rows[ag]["bytes"] == 2 * 2 * params * 2  # bf16, twice per micro-batch
    assert rows[rs]["bytes"] == 2 * params * 4  # fp32
    tensors = 9 * TINY.layers + 3  # AdamW keeps a 4-byte step counter per parameter tensor
    assert r.held["parameters"] == params * 4 // 4  # the FP32 shard: the master weights
    assert r.held["optimizer"] == 2 * params * 4 // 4 + 4 * tensors  # two FP32 moments, sharded


def _param_counts(m):
    h, hd = m.hidden, m.hd
    layer = h * m.heads * hd * 2 + 2 * h * m.kv * hd + 3 * h * m.ffn + 2 * h
    return [m.layers * layer, 2 * m.vocab * h + h]


def test_scaled_traces_equal_full_traces():
    """trace_layers=2 (traces of 2, 3 and 4 layers, scaled to 5; 3 of 4 micro-batches, 3 of 5 steady
    1F1B iterations) gives exactly the figures of a trace of everything."""
    five = Model("five", layers=5, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
    ten = replace(five, layers=10)
    for model, lay, m in [(five, Layout(dp=2, zero=3), 4), (ten, Layout(dp=1, pp=2, zero=2), 6)]:
        part = fw.simulate(model, lay, micro_batches=m, trace_layers=2, extrapolate="always")
        # three notes: layers scaled, steady 1F1B iterations added, the reserve's margin
        assert len(part.notes) == 3, "nothing was scaled: the test would not test the scaling"
        full = fw.simulate(model, lay, micro_batches=m, extrapolate=False)
        assert (part.memory, part.held, part.comm, part.flops) == (full.memory, full.held, full.comm, full.flops)


def test_a_peak_that_moves_within_a_phase_beyond_the_traced_layers_is_found():
    """The backward's peak moves from its end to its start as layers are added: with a large
    vocabulary and ZeRO-1, at 2-4 layers it is the end (the embedding's whole FP32 gradient),
    from about 8.4 layers on the start (the logits' gradient and every layer's activations, which
    grow faster). The backward's own peak was on a line at 2, 3 and 4 layers, and its line put a
    12-layer stage 447,360 bytes low (50,641,604 against 51,088,964 bytes; 12.4.1's 70B ZeRO-1
    layout: 83.90 GB against 84.03). Each part of a phase (before, in and after the stage's
    blocks) is put on its own line: exact."""
    m = Model("vocab-heavy", layers=12, hidden=128, heads=4, kv_heads=2, ffn=256, mlp_matrices=3, seq_len=32,
              vocab=8192)
    lay = Layout(dp=2, zero=1)
    part = fw.simulate(m, lay, micro_batches=3, trace_layers=2, extrapolate="always", timing=False)
    assert part.layers_traced == (3, 4)  # scaled from the first window: 2, 3 and 4 layers on a line
    full = fw.simulate(m, lay, micro_batches=3, extrapolate=False, timing=False)
    assert part.memory == full.memory and full.memory["total"] == 51_088_964


def test_a_long_warm_up_scaled_from_warm_ups_of_1_to_3_equals_its_whole_trace():
    """Stage 0 of PP 6 holds 5 micro-batches at the end of its 1F1B warm-up: traced as warm-ups of 1, 2
    and 3 and scaled, every figure and the step's op trace equal those of the whole warm-up (Llama 3
    405B's first stage, PP 16, is traced this way: 126 layer passes instead of 224)."""
    m = Model("six", layers=12, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
    for lay in (Layout(dp=2, pp=6, zero=2, tp=2),):
        part = fw.simulate(m, lay, micro_batches=6, extrapolate="always")
        assert any("warm-ups of 1 to 3" in n for n in part.notes), part.notes
        full = fw.simulate(m, lay, micro_batches=6, extrapolate=False)
        assert (part.memory, part.held, part.comm, part.flops) == (full.memory, full.held, full.comm, full.flops)
        assert [(p["kind"], p["i"], p["ops"], p["mem"], p["comm"]) for p in part.timing] == \
            [(p["kind"], p["i"], p["ops"], p["mem"], p["comm"]) for p in full.timing]
        assert fw.step_time(part).step_s == fw.step_time(full).step_s
        assert part.micro_batches_traced < full.micro_batches_traced


def test_a_units_gathered_weights_are_parameters_also_when_its_own_module_holds_them():
    """FSDP2 gathers a unit's weights in its pre-forward hook, after MemTracker's global hook on the
    unit's own module has filed that module's (still sharded) parameters: an embedding wrapped on its
    own (torchtitan's) left its gathered weight under activations. file_gathered_weights moves it."""
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from helpers.torch_private import FakeTensorMode

    with fw.fake_world(2):
        mesh = init_device_mesh("cpu", (2,))
        with torch.device("meta"):
            emb = nn.Embedding(1024, 64)
        fully_shard(emb, mesh=mesh, reshard_after_forward=False)
        with FakeTensorMode(allow_non_fake_inputs=True):
            emb.to_empty(device="cpu")
            tracker = fake_step.memtracker_class()()
            tracker.track_external(emb)
            with tracker:
                y = emb(torch.randint(0, 1024, (2, 8)))  # noqa: F841 (kept: an activation)
                before = fake_step._categories(tracker.get_tracker_snapshot("current"))
                tracker.file_gathered_weights(emb)
                after = fake_step._categories(tracker.get_tracker_snapshot("current"))
    gathered, out = 1024 * 64 * 4, 2 * 8 * 64 * 4  # the whole FP32 weight; the looked-up rows
    assert before["activations"] >= gathered + out  # the defect, as it was
    assert after["activations"] == before["activations"] - gathered
    assert after["parameters"] == before["parameters"] + gathered and after["total"] == before["total"]


def test_bad_layouts_are_refused_before_tracing():
    odd = Model("odd", layers=30, hidden=96, heads=6, kv_heads=2, ffn=192, seq_len=100, vocab=192)
    for lay, msg in [(Layout(dp=1, tp=4), "TP must divide the attention heads"),
                     (Layout(dp=1, tp=3), "TP must divide the KV heads"),
                     (Layout(dp=1, pp=4), "PP must divide the layers"),
                     (Layout(dp=1, cp=4), "2 x CP must divide the sequence")]:
        with pytest.raises(ValueError, match=msg):
            fw.simulate(odd, lay)
    with pytest.raises(ValueError, match=r"DP x TP x PP x CP = 2x1x1x1 = 2, not the world size 8"):
        fw.simulate(TINY, Layout(dp=2), world_size=8)
    with pytest.raises(ValueError, match="rank must be in"):
        fw.simulate(TINY, Layout(dp=2), rank=2)
    with pytest.raises(ValueError, match="stages must give PP = 2"):
        fw.simulate(TINY, Layout(dp=1, pp=2), stages=[1, 2])
    with pytest.raises(ValueError, match="cannot fill PP = 2"):
        fw.simulate(TINY, Layout(dp=1, pp=2), micro_batches=1)
    deep = Model("deep", layers=400, hidden=64, heads=4, ffn=128, seq_len=32)
    with pytest.raises(ValueError, match="trace_layers=2"):  # too long to trace: says how to proceed
        fw.simulate(deep, Layout(dp=2))
    with pytest.raises(ValueError, match="trace_layers must be an integer >= 2"):
        fw.simulate(TINY, Layout(dp=2), trace_layers=1)
    # interleaved 1F1B (v chunks per rank): its own constraints, by name
    four = replace(TINY, layers=4)
    with pytest.raises(ValueError, match=r"PP x V = 2 x 3 must divide the layers"):
        fw.simulate(four, Layout(dp=1, pp=2, v=3), micro_batches=4)
    with pytest.raises(ValueError, match=r"stages must give PP x V = 2 x 2 = 4 layer counts"):
        fw.simulate(four, Layout(dp=1, pp=2, v=2), micro_batches=4, stages=[2, 2])
    with pytest.raises(ValueError, match="multiple of PP = 2"):
        fw.simulate(four, Layout(dp=1, pp=2, v=2), micro_batches=3)
    with pytest.raises(ValueError, match="needs pipeline parallelism"):
        Layout(dp=2, v=2)
    assert not dist.is_initialized()


def test_llama3_uneven_stages():
    st = fw.uneven_stages(126, 16)
    assert st == [7] + [8] * 14 + [7] and sum(st) == 126
    with pytest.raises(ValueError, match="multiple of PP"):
        fw.uneven_stages(125, 16)


def test_private_import_guard_names_the_pinned_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.testing._internal.distributed.fake_pg", None)
    with pytest.raises(ImportError, match=r"torch 2\.13\.0"):
        fw.fake_store_class()


def test_flops_are_this_ranks_own():
    """A DTensor op has global shapes; the counter must count the local work: TP2 halves every
    matmul and attention (the norms and the loss count no FLOPs), DP does not change a rank's."""
    one = fw.simulate(TINY, Layout(dp=1, zero=3), micro_batches=1)
    assert fw.simulate(TINY, Layout(dp=1, tp=2, zero=3), micro_batches=1).flops * 2 == one.flops
    # forward + backward = 3 x the forward's matmuls: 6 FLOPs per weight per token (the blocks'
    # matrices and the output head; the embedding and the norms do no matmul), and attention as
    # PyTorch's counter defines it: 2 bmms of 2 b H s^2 d forward (sdpa_flop_count), 5 backward
    # (sdpa_backward_flop_count: the scores recomputed, then dV, dP, dQ, dK)
    m, h, tokens = TINY, TINY.hidden, TINY.seq_len
    matmul = m.layers * (h * m.heads * m.hd * 2 + 2 * h * m.kv * m.hd + 3 * h * m.ffn) + h * m.vocab
    attention = m.layers * (2 + 5) * 2 * m.heads * m.seq_len ** 2 * m.hd
    assert one.flops == 6 * tokens * matmul + attention


def test_norm_and_dropout_keep_what_the_gpu_kernels_keep():
    import torch

    from helpers.fake_world.llama_model import Dropout, RMSNorm

    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    norm = RMSNorm(8).double()
    with torch.no_grad():
        norm.weight.normal_()
    ref = torch.nn.functional.rms_norm(x, (8,), norm.weight, 1e-5)
    g = torch.randn_like(ref)
    ours = torch.autograd.grad(norm(x), (x, norm.weight), g)
    theirs = torch.autograd.grad(ref, (x, norm.weight), g)
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(ours, theirs))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.dtype, t.numel())) or t, lambda t: t):
        xb = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
        RMSNorm(8).to(torch.bfloat16)(xb)
        Dropout(0.1)(xb)
    assert (torch.bfloat16, 32) in saved and (torch.float32, 4) in saved and (torch.bool, 32) in saved
    assert (torch.float32, 32) not in saved  # no FP32 copy of the input, unlike the CPU decomposition


def test_recomputation_keeps_only_block_inputs():
    plain = fw.simulate(TINY, Layout(dp=2, zero=3), micro_batches=1)
    ac = fw.simulate(TINY, Layout(dp=2, zero=3, recompute="full"), micro_batches=1)
    assert ac.memory["activations"] < plain.memory["activations"] and ac.flops > plain.flops


def test_sequence_parallel_all_gathers_the_whole_activation():
    """Each all-gather of sequence parallelism (DTensor's functional collective, which receives
    its input shard) is recorded with the whole buffer it fills: b x s x h x 2 bytes, over TP."""
    r = fw.simulate(TINY, Layout(dp=1, tp=2, zero=3), micro_batches=1)
    ag = [c for c in r.comm if c["kind"] == "all_gather" and c["axis"] == "tp"]
    assert len(ag) == 1 and ag[0]["group_size"] == 2 and ag[0]["calls"] >= 4 * TINY.layers
    assert ag[0]["bytes"] == ag[0]["calls"] * TINY.seq_len * TINY.hidden * 2


def test_planner_activations_with_the_models_shapes_match_pytorch():
    """The planner's activation_model="pytorch" (the model's own FFN, gating and KV heads; PyTorch's
    SP keeping the gathered inputs) is what one layer of PyTorch's code keeps, to the FP32 scalars
    per token (norms' 1/rms, attention's log-sum-exp) it leaves out; the chapter's GPT-3 formula is
    far from it for a SwiGLU/GQA model with sequence parallelism."""
    from helpers.planner import Rules, stage_activation_bytes

    model = Model("swiglu", layers=5, hidden=64, heads=4, kv_heads=2, ffn=192, mlp_matrices=3, seq_len=512, vocab=256)
    lay = Layout(dp=1, tp=2, zero=3, micro_batch=4)  # activations dominate the peak
    measured = fw.simulate(model, lay, micro_batches=1, trace_layers=2, extrapolate="always").per_layer["activations"]
    per_layer = lambda am: stage_activation_bytes(model, lay, 1, Rules(dropout=False, activation_model=am))["per layer"]
    assert abs(measured / per_layer("pytorch") - 1) < 0.03
    assert measured / per_layer("korthikanti") > 1.3 and measured / per_layer("shapes") > 1.1
    with pytest.raises(ValueError, match="activation_model"):
        Rules(activation_model="guess")


def test_collective_counts_agree_with_commdebugmode():
    """PyTorch's own counter of collectives (CommDebugMode, c10d and functional) agrees with ours."""
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as cdm:
        r = fw.simulate(TINY, Layout(dp=2, tp=2, zero=3), micro_batches=1, extrapolate=False)
    theirs = {}
    for op, n in cdm.get_comm_counts().items():
        kind = next(k for k in ("all_gather", "reduce_scatter", "all_reduce") if k.replace("_", "") in str(op).replace("_", ""))
        theirs[kind] = theirs.get(kind, 0) + n
    assert theirs == {k: v["calls"] for k, v in r.comm_by_kind().items()} and len(theirs) == 3


def test_zero1_reduces_once_per_step_zero2_every_micro_batch():
    """FSDP2 over DP2, 4 micro-batches, 3 FSDP units (2 blocks + the stage's embedding, norm and
    head): under ZeRO-1 and ZeRO-2 the BF16 weights are gathered once per step (kept unsharded
    until the last backward); ZeRO-1 reduce-scatters the FP32 gradients once per step, after the
    last micro-batch, ZeRO-2 after every micro-batch. 3 of the 4 micro-batches are traced, the
    4th added from a measured steady one: it must not repeat the first one's weight gather (the
    figures equal a trace of everything)."""
    params, m = sum(_param_counts(TINY)), 4
    for zero, syncs in ((1, 1), (2, m)):
        lay = Layout(dp=2, zero=zero)
        part = fw.simulate(TINY, lay, micro_batches=m)
        assert part.notes, "nothing was extrapolated: the test would not test the extrapolation"
        rows = {(c["kind"], c["axis"], c["group_size"]): c for c in part.comm}
        assert set(rows) == {("all_gather", "dp", 2), ("reduce_scatter", "dp", 2)}
        ag, rs = rows["all_gather", "dp", 2], rows["reduce_scatter", "dp", 2]
        assert (ag["calls"], ag["bytes"]) == (3, 2 * params), zero
        assert (rs["calls"], rs["bytes"]) == (3 * syncs, 4 * params * syncs), zero
        full = fw.simulate(TINY, lay, micro_batches=m, extrapolate=False)
        assert (part.memory, part.held, part.comm, part.flops) == (full.memory, full.held, full.comm, full.flops)


def test_fsdp_shards_over_dp_times_cp():
    """CP ranks hold the same weights as their DP peers: ZeRO-3 shards, gathers and reduce-scatters
    over the DP x CP ranks (one group of dp * cp = 4), and each rank keeps a quarter of the FP32
    master weights and moments; the CP group of 2 carries only K and V. Every unit resharded after
    forward: each is gathered twice."""
    r = fw.simulate(TINY, Layout(dp=2, cp=2, zero=3), micro_batches=1, reshard_after_forward="always")
    params, tensors = sum(_param_counts(TINY)), 9 * TINY.layers + 3
    fsdp = {(c["kind"], c["axis"], c["group_size"]): c for c in r.comm if c["axis"] != "cp"}
    assert set(fsdp) == {("all_gather", "dp_cp", 4), ("reduce_scatter", "dp_cp", 4)}
    assert fsdp["all_gather", "dp_cp", 4]["calls"] == 3 * 2  # forward and backward, 3 FSDP units
    assert fsdp["all_gather", "dp_cp", 4]["bytes"] == 2 * 2 * params  # BF16, twice
    assert fsdp["reduce_scatter", "dp_cp", 4]["bytes"] == 4 * params  # FP32, once
    assert {c["group_size"] for c in r.comm if c["axis"] == "cp"} == {2}
    assert r.held["parameters"] == 4 * params // 4
    assert r.held["optimizer"] == 2 * 4 * params // 4 + 4 * tensors


def test_gpt_blocks_have_two_mlp_matrices_and_two_dropout_masks():
    """A GPT-style block (mlp_matrices=2, no vocabulary): Q, K, V, O of h x h, two h x ffn MLP
    matrices (no gate), two norms; with dropout after attention and after the MLP, each layer
    keeps two 1-byte masks of s x b x h more (b x s large enough that the peak is where backward
    starts, with every layer's activations held)."""
    gpt = Model("gpt", layers=2, hidden=64, heads=4, ffn=256, seq_len=128)
    lay, h, b = Layout(dp=1, zero=3, micro_batch=4), gpt.hidden, 4
    off, on = (fw.simulate(gpt, lay, micro_batches=1, dropout=d) for d in (False, True))
    params = gpt.layers * (4 * h * h + 2 * h * gpt.ffn + 2 * h) + h  # + the last stage's final norm
    assert off.held["parameters"] == on.held["parameters"] == 4 * params  # FP32 master weights
    assert on.memory["activations"] - off.memory["activations"] == gpt.layers * 2 * gpt.seq_len * b * h
