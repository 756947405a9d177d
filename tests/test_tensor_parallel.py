"""Tensor parallelism on ranks (P.8, 12.2.1): the f/g operators, the two layers, the Megatron block,
PyTorch's parallelize_module, the all-reduce count and bytes, and the cost model."""
import numpy as np
import pytest
import torch

from helpers import tensor_parallel as tp
from helpers import tp_block
from helpers import tp_numpy as tn
from helpers.launcher import RankError, launch


def _operators_worker():
    """Each conjugate operator's forward and backward, and a TP MLP from the two layers."""
    import torch
    import torch.distributed as dist

    from helpers import tensor_parallel as tp

    r = dist.get_rank()
    out = {}
    x = torch.full((4, 1, 2), float(r + 1), dtype=torch.float64, requires_grad=True)
    y = tp.copy_to_tp(x)
    y.backward(torch.full_like(y, 10.0 * (r + 1)))
    out["f"] = (y.detach(), x.grad.clone())
    x.grad = None
    y = tp.reduce_from_tp(x)
    y.backward(torch.full_like(y, 10.0 * (r + 1)))
    out["g"] = (y.detach(), x.grad.clone())
    x.grad = None
    y = tp.gather_from_sp(x)
    y.backward(torch.arange(y.numel(), dtype=torch.float64).reshape(y.shape) * (r + 1))
    out["gather"] = (y.detach(), x.grad.clone())
    x.grad = None
    y = tp.reduce_scatter_to_sp(x * torch.arange(4, dtype=torch.float64).reshape(4, 1, 1))
    y.backward(torch.full_like(y, float(r + 1)))
    out["reduce_scatter"] = (y.detach(), x.grad.clone())
    # the MLP of P.8 / 12.2.1 from the two layers, against numpy
    P = tn.random_problem(s=6, h=8, ffn=16, seed=2)
    X = torch.tensor(P["X"], requires_grad=True)
    col = tp.ColumnParallelLinear.from_full(torch.tensor(P["A"]))
    row = tp.RowParallelLinear.from_full(torch.tensor(P["B"]))
    Z = row(torch.nn.functional.gelu(col(X), approximate="tanh"))
    (Z * torch.tensor(P["dZ"])).sum().backward()
    out["mlp"] = {"Z": Z.detach(), "dX": X.grad, "dA": col.weight.grad, "dB": row.weight.grad}
    return out


def test_conjugate_operators_and_the_two_layers_on_two_ranks():
    run = launch(_operators_worker, world_size=2, quiet=True)
    P = tn.random_problem(s=6, h=8, ffn=16, seed=2)
    ref = tn.mlp_backward(P["X"], P["A"], P["B"], P["dZ"])
    for r, res in enumerate(run.results):
        y, gx = res["f"]  # identity forward, all-reduce backward: 10*1 + 10*2
        assert torch.equal(y, torch.full((4, 1, 2), r + 1.0)) and torch.equal(gx, torch.full((4, 1, 2), 30.0))
        y, gx = res["g"]  # all-reduce forward, identity backward
        assert torch.equal(y, torch.full((4, 1, 2), 3.0)) and torch.equal(gx, torch.full((4, 1, 2), 10.0 * (r + 1)))
        y, gx = res["gather"]  # all-gather on dim 0; backward = reduce-scatter of (1+2) x arange
        assert torch.equal(y[:, 0, 0], torch.tensor([1.0] * 4 + [2.0] * 4, dtype=torch.float64))
        expect = 3 * torch.arange(16, dtype=torch.float64).reshape(8, 1, 2)[4 * r:4 * r + 4]
        assert torch.equal(gx, expect)
        y, gx = res["reduce_scatter"]  # rows 2r, 2r+1 of (1+2) x arange(4); backward = all-gather
        assert torch.equal(y[:, 0, 0], 3.0 * torch.tensor([2.0 * r, 2.0 * r + 1], dtype=torch.float64))
        assert torch.equal(gx[:, 0, 0], torch.tensor([1.0, 1, 2, 2], dtype=torch.float64) * torch.arange(4))
        m = res["mlp"]
        assert np.allclose(m["Z"].numpy(), tn.mlp(P["X"], P["A"], P["B"]), rtol=0, atol=1e-13)
        assert np.allclose(m["dX"].numpy(), ref["dX"], rtol=0, atol=1e-13)
        assert np.allclose(m["dA"].numpy(), tn.column_split(ref["dA"], 2)[r], rtol=0, atol=1e-13)
        assert np.allclose(m["dB"].numpy(), tn.row_split(ref["dB"], 2)[r], rtol=0, atol=1e-13)
    # one all-reduce forward (g) and one backward (f) per MLP, plus the operators' own calls
    assert run.count("all_reduce") == 2 + 2 and run.count("all_gather") == 2 and run.count("reduce_scatter") == 2


def _max_diff(a, b):
    return (a - b).abs().max().item()


CFG = tp.BlockConfig(h=32, heads=4, ffn=64, p_drop=0.1, seed=5)
S, B = 8, 2


@pytest.fixture(scope="module")
def reference():
    return tp.reference_step(CFG, S, B)


def test_megatron_block_on_4_ranks_equals_one_process_and_counts_two_allreduces_each_way(reference):
    run = launch(tp.tp_block_worker, CFG, S, B, world_size=4, quiet=True)
    payload = S * B * CFG.h * 8  # one (s, b, h) float64 activation
    for r, res in enumerate(run.results):
        assert _max_diff(res["out"], reference["out"]) < 1e-12
        assert _max_diff(res["dx"], reference["dx"]) < 1e-12
        shards = tp.shard_block_params(reference["grads"], r, 4)
        for name, g in shards.items():
            assert g.shape == res["grads"][name].shape and _max_diff(res["grads"][name], g) < 1e-12, name
        assert res["forward"] == [("all_reduce", payload, 4)] * 2
        assert res["backward"] == [("all_reduce", payload, 4)] * 2
    op = run.comm[0][0]
    assert op.model_sent == pytest.approx(2 * 3 / 4 * payload)
    assert op.model_sent == pytest.approx(tp.allreduce_bytes_per_device(S, B, CFG.h, 4, bytes_per_element=8))


def test_megatron_block_on_8_ranks_equals_one_process():
    # t = 8: a bug that only bites at t = 8 (an index computed mod 4, say) would pass at t = 2 and 4
    cfg = tp.BlockConfig(h=32, heads=8, ffn=64, p_drop=0.1, seed=5)
    ref = tp.reference_step(cfg, S, B)
    run = launch(tp.tp_block_worker, cfg, S, B, world_size=8, quiet=True)
    payload = S * B * cfg.h * 8
    for r, res in enumerate(run.results):
        assert _max_diff(res["out"], ref["out"]) < 1e-12 and _max_diff(res["dx"], ref["dx"]) < 1e-12
        for name, g in tp.shard_block_params(ref["grads"], r, 8).items():
            assert g.shape == res["grads"][name].shape and _max_diff(res["grads"][name], g) < 1e-12, (r, name)
        assert res["forward"] == res["backward"] == [("all_reduce", payload, 8)] * 2
    # the shards tile the full weights: every column of w_fc1 and row of w_fc2 on exactly one rank
    fc1 = torch.cat([res["grads"]["w_fc1"] for res in run.results], dim=1)
    assert _max_diff(fc1, ref["grads"]["w_fc1"]) < 1e-12 and fc1.shape == ref["grads"]["w_fc1"].shape


def _numpy_block(x, P, cfg):
    """The block of tp_block.reference_block without dropout, in numpy, sharing no code with it."""
    x, P = x.numpy(), {k: v.detach().numpy() for k, v in P.items()}
    d = cfg.h // cfg.heads

    def ln(z, w, b):
        return (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + cfg.eps) * w + b

    out = np.empty_like(x)
    for j in range(x.shape[1]):  # batch elements
        X = x[:, j]
        q, k, v = np.split(ln(X, P["ln1_w"], P["ln1_b"]) @ P["w_qkv"] + P["b_qkv"], 3, axis=1)
        heads = []
        for i in range(cfg.heads):
            c = slice(i * d, (i + 1) * d)
            sc = q[:, c] @ k[:, c].T / np.sqrt(d)
            e = np.exp(sc - sc.max(1, keepdims=True))
            heads.append(e / e.sum(1, keepdims=True) @ v[:, c])
        h1 = X + np.concatenate(heads, axis=1) @ P["w_o"] + P["b_o"]
        z = ln(h1, P["ln2_w"], P["ln2_b"]) @ P["w_fc1"] + P["b_fc1"]
        gelu = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
        out[:, j] = h1 + gelu @ P["w_fc2"] + P["b_fc2"]
    return out


def test_reference_block_equals_an_independent_numpy_block():
    # every torch block (reference, parallel, parallelize_module) shares attention_core: check it once
    cfg = tp.BlockConfig(h=32, heads=4, ffn=64, p_drop=0.0)
    P = tp.make_block_params(cfg)
    x, _ = tp.block_inputs(cfg, S, B)
    assert np.allclose(tp_block.reference_block(x, P, cfg).numpy(), _numpy_block(x, P, cfg), rtol=0, atol=1e-12)


def _subgroup_worker(cfg, s, b, sequence_parallel):
    """Two TP groups of 2 inside a world of 4 (what a DP x TP layout does): each group is one block."""
    import torch.distributed as dist

    from helpers import tensor_parallel as tp
    from helpers.launcher.commlog import active_log

    r = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = groups[r // 2]
    P = tp.make_block_params(cfg)
    block = tp.ParallelBlock(P, cfg, group, sequence_parallel=sequence_parallel)
    x, R = tp.block_inputs(cfg, s, b)
    if sequence_parallel:
        x, R = tp.split_seq(x, group), tp.split_seq(R, group)
    x.requires_grad_()
    n0 = len(active_log().ops)
    out = block(x)
    (out * R).sum().backward()
    if sequence_parallel:
        tp.allreduce_replicated_grads(block)
    return {"out": out.detach(), "dx": x.grad, "grads": block.grads(), "ops": [o.op for o in active_log().ops[n0:]],
            "sizes": [o.group_size for o in active_log().ops[n0:]]}


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_the_block_runs_on_a_subgroup(reference, sequence_parallel):
    run = launch(_subgroup_worker, CFG, S, B, sequence_parallel, world_size=4, quiet=True)
    for pair in (run.results[:2], run.results[2:]):
        d = tp.max_differences(pair, reference, sequence_parallel=sequence_parallel)
        assert max(d.values()) < 1e-12, d
    assert all(res["sizes"] == [2] * len(res["sizes"]) for res in run.results)  # the TP group, not the world
    expect = 4 + 6 + 6 if sequence_parallel else 2 + 2  # SP: forward 4, backward 6 (regather), 6 replicated-grad sums
    assert all(len(res["ops"]) == expect for res in run.results), [res["ops"] for res in run.results]


def test_dropout_masks_make_a_difference_and_are_the_same_on_every_rank(reference):
    no_drop = tp.reference_step(tp.BlockConfig(h=32, heads=4, ffn=64, p_drop=0.0), S, B)
    assert _max_diff(no_drop["out"], reference["out"]) > 1e-2
    m1 = tp.position_dropout_mask(5, 2, range(8), 2, 3, 0.5)
    m2 = tp.position_dropout_mask(5, 2, range(4, 8), 2, 3, 0.5)
    assert torch.equal(m1[4:], m2) and 0 < m1.float().mean() < 1


def test_parallelize_module_colwise_rowwise_on_two_ranks_equals_one_process(reference):
    run = launch(tp.torch_tp_worker, CFG, S, B, world_size=2, quiet=True)
    for res in run.results:
        assert _max_diff(res["out"], reference["out"]) < 1e-12
        assert _max_diff(res["dx"], reference["dx"]) < 1e-12
        for name, g in reference["grads"].items():
            assert _max_diff(res["grads"][name], g) < 1e-12, name
        assert tp.count_ops(res["forward"]) == {"all_reduce": 2}
        assert tp.count_ops(res["backward"]) == {"all_reduce": 2}


def test_single_process_block_and_torch_block_equal_the_reference(reference):
    x, R = tp.block_inputs(CFG, S, B)
    blk = tp.ParallelBlock(tp.make_block_params(CFG), CFG)  # t = 1 without a process group
    assert _max_diff(blk(x), reference["out"]) < 1e-13
    assert _max_diff(tp.TorchBlock(tp.make_block_params(CFG), CFG)(x), reference["out"]) < 1e-13
    W = torch.arange(24.0).reshape(2, 12)
    assert torch.equal(tp_block._qkv_from_colwise(tp.qkv_for_colwise(W, 2), 2), W)
    assert tp.qkv_for_colwise(W, 2)[0, :6].tolist() == [0, 1, 4, 5, 8, 9]  # rank 0: its half of Q, K, V


def test_book_numbers_of_the_cost_model():
    # 12.2.1: s=2048, b=32, h=8192 in bf16, t=8
    assert tp.activation_tensor_bytes(2048, 32, 8192) == 1_073_741_824
    assert tp.allreduce_bytes_per_device(2048, 32, 8192, 8) == pytest.approx(1.879e9, rel=1e-3)
    # one GEMM on 1/8 of the FFN width: 3.85 TFLOP, not 30.7
    assert 2 * 32 * 2048 * 8192 * (28672 / 8) == pytest.approx(3.848e12, rel=1e-3)
    f1 = tp.per_rank_layer_flops(2048, 32, 8192, 28672, 1)
    assert tp.per_rank_layer_flops(2048, 32, 8192, 28672, 8) == pytest.approx(f1 / 8)
    assert f1 == 8 * 2048 * 32 * 8192**2 + 4 * 2048 * 32 * 8192 * 28672 + 4 * 32 * 2048**2 * 8192
    # P.8: 8192 tokens x 4096 x 2 bytes, T=4, 400 GB/s, 2 per layer x 32 layers
    row = tp.tp_layer_times(8192, 1, 4096, 4 * 4096, 4, 1e15, tp.P8_LINK_BPS)
    assert 32 * row["comm_s"] == pytest.approx(16.1e-3, rel=2e-3)
    assert tp.tp_layer_times(8, 1, 4, 16, 1, 1e9, 1e9)["comm_s"] == 0.0
    assert tp.book_link(8) == 600e9 and tp.book_link(16) == 25e9
    sweep = tp.tp_sweep(2048, 32, 8192, 28672, [1, 2, 4, 8, 16], tp.H100_BF16_FLOPS, tp.book_link)
    fr = [r["comm_fraction"] for r in sweep]
    assert fr[0] == 0 and all(a < b for a, b in zip(fr, fr[1:])) and fr[-1] > 0.9
    assert tp.measure_matmul_flops(n=64, repeats=2) > 0


@pytest.mark.parametrize("call, match", [
    (lambda: tp.check_tp_shapes(tp.BlockConfig(h=48, heads=6, ffn=64), 4), r"attention heads \(6\) must be divisible by the tensor-parallel degree t=4"),
    (lambda: tp.check_tp_shapes(tp.BlockConfig(h=32, heads=4, ffn=36), 8), r"attention heads \(4\)"),
    (lambda: tp.check_tp_shapes(tp.BlockConfig(h=32, heads=4, ffn=38), 4), r"FFN width \(38\)"),
    (lambda: tp.check_tp_shapes(tp.BlockConfig(), 4, seq_len=10), r"sequence length \(sequence parallelism\) \(10\)"),
    (lambda: tp.BlockConfig(h=30, heads=4), r"hidden size h \(30\)"),
    (lambda: tp.BlockConfig(p_drop=1.0), r"p_drop must be in \[0, 1\)"),
    (lambda: tp.column_shard(torch.ones(4, 6), 0, 4), r"output width of a column-parallel layer \(6\)"),
    (lambda: tp.row_shard(torch.ones(6, 4), 4, 4), r"rank must be an integer in \[0, 4\)"),
    (lambda: tp.position_dropout_mask(0, 0, range(2), 1, 1, -0.1), r"p must be in \[0, 1\)"),
    (lambda: tp.per_rank_layer_flops(8, 1, 8, 32, 2, mlp_matrices=4), "mlp_matrices must be 2"),
    (lambda: tp.tp_layer_times(8, 1, 8, 32, 2, 0, 1e9), "flops_per_s must be a finite number > 0"),
    (lambda: tp.allreduce_bytes_per_device(8, 1, 8, 0), "integer >= 1"),
])
def test_bad_input_is_rejected_with_the_constraint(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_block_whose_heads_do_not_divide_fails_on_the_ranks_with_the_constraint():
    # last in the file: a failed job ends the worker processes
    with pytest.raises(RankError, match=r"number of attention heads \(6\) must be divisible by the tensor-parallel degree t=4"):
        launch(tp.tp_block_worker, tp.BlockConfig(h=48, heads=6, ffn=64), 8, 2, world_size=4, quiet=True)
