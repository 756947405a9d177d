"""Sequence parallelism (12.3.1): equal to TP alone, the collectives it issues, the activation bytes
autograd keeps per rank against Korthikanti et al. 2022, and the section's worked example."""
import pytest
import torch

from helpers import sequence_parallel as sp
from helpers import tensor_parallel as tp
from helpers.launcher import launch

CFG = tp.BlockConfig(h=32, heads=4, ffn=64, p_drop=0.1, seed=7)
S, B, T = 8, 2, 4


@pytest.fixture(scope="module")
def reference():
    return tp.reference_step(CFG, S, B)


def _diff(a, b):
    return (a - b).abs().max().item()


def _rows(x, r, t=T):
    n = x.shape[0] // t
    return x[r * n:(r + 1) * n]


@pytest.mark.parametrize("regather", [True, False])
def test_sp_block_equals_one_process_on_its_rows_and_issues_rs_and_ag(reference, regather):
    run = launch(tp.tp_block_worker, CFG, S, B, sequence_parallel=True, regather_input=regather, world_size=T, quiet=True)
    S_bytes = S * B * CFG.h * 8
    for r, res in enumerate(run.results):
        assert res["out"].shape == (S // T, B, CFG.h)
        assert _diff(res["out"], _rows(reference["out"], r)) < 1e-12
        assert _diff(res["dx"], _rows(reference["dx"], r)) < 1e-12
        for name, g in tp.shard_block_params(reference["grads"], r, T).items():
            assert _diff(res["grads"][name], g) < 1e-12, name
        assert tp.count_ops(res["forward"]) == {"all_gather": 2, "reduce_scatter": 2}
        assert tp.count_ops(res["backward"]) == {"all_gather": 4 if regather else 2, "reduce_scatter": 2}
        assert all(nbytes == S_bytes for _, nbytes, _ in res["forward"] + res["backward"])
        assert res["n_grad_sync"] == 6 and all(op == "all_reduce" for op, *_ in res["grad_sync"])
        # ring bytes per step: TP's 4 all-reduces exactly, plus one all-gather per column layer if regathering
        tp_step = 4 * 2 * (T - 1) / T * S_bytes
        extra = 2 * (T - 1) / T * S_bytes if regather else 0
        assert sp.ring_bytes(res["forward"] + res["backward"]) == pytest.approx(tp_step + extra)


def test_replicated_gradients_are_partial_under_sp_until_summed(reference):
    run = launch(tp.tp_block_worker, CFG, S, B, sequence_parallel=True, sync_replicated=False, world_size=T, quiet=True)
    for name in tp.REPLICATED:
        parts = [res["grads"][name] for res in run.results]
        assert _diff(parts[0], reference["grads"][name]) > 1e-6, name  # one rank saw only s/t rows
        assert _diff(sum(parts), reference["grads"][name]) < 1e-12, name


def test_torch_sequence_parallel_plan_equals_one_process(reference):
    run = launch(tp.torch_tp_worker, CFG, S, B, sequence_parallel=True, world_size=T, quiet=True)
    for r, res in enumerate(run.results):
        assert _diff(res["out"], _rows(reference["out"], r)) < 1e-12
        assert _diff(res["dx"], _rows(reference["dx"], r)) < 1e-12
        for name, g in reference["grads"].items():
            assert _diff(res["grads"][name], g) < 1e-12, name
        assert tp.count_ops(res["forward"]) == {"all_gather": 2, "reduce_scatter": 2}


MEM = tp.BlockConfig(h=32, heads=4, ffn=128, p_drop=0.1)  # FFN = 4h as the formula assumes
MS, MB = 16, 2


def test_saved_activation_bytes_on_one_process_equal_sbh_34_plus_5as_over_h():
    m = sp.measure_block_activations(MEM, MS, MB)
    assert m["activations"] == sp.activation_bytes_per_layer(MS, MB, 32, 4) == MS * MB * 32 * (34 + 5 * 4 * MS / 32)
    assert m["layernorm_stats"] == 4 * MS * MB * 2  # mean and rstd per token, two LayerNorms, bf16
    inventory = sp.korthikanti_inventory(MS, MB, 32, 4)
    assert sum(v for _, v in inventory) == m["activations"]


@pytest.mark.parametrize("mode", ["tp", "sp", "sp-keep-gathered"])
def test_saved_activation_bytes_per_rank_equal_the_formulas(mode):
    seq, regather = mode != "tp", mode == "sp"
    run = launch(sp.activation_memory_worker, MEM, MS, MB, sequence_parallel=seq, regather_input=regather,
                 world_size=T, quiet=True)
    sbh = MS * MB * 32
    expect = sp.activation_bytes_per_layer(MS, MB, 32, 4, T, sequence_parallel=seq)
    if mode == "sp-keep-gathered":  # the two gathered inputs kept whole: 2 x 2sbh instead of 2 x 2sbh/t
        expect += 4 * sbh * (1 - 1 / T)
    for res in run.results:
        assert res["activations"] == expect


def test_formulas_and_the_books_versions():
    s, b, h, a = 4096, 4, 5120, 80
    sbh = s * b * h
    assert sp.activation_bytes_per_layer(s, b, h, a, 1) == sp.activation_bytes_per_layer(s, b, h, a, 1, True)
    assert sp.activation_bytes_per_layer(s, b, h, a, 8, attention_scores=False) == sbh * (10 + 3)
    assert sp.activation_bytes_per_layer(s, b, h, a, 8, True, attention_scores=False) == sbh * 34 / 8
    # the book's "sbh x 34/t + sbh x 10" is not 34 sbh at t = 1
    assert sp.book_tp_formula(s, b, h, 1) == 44 * sbh
    ex = sp.book_12_3_1()
    assert ex["stranded over layers, GB"] == pytest.approx(33.55, abs=0.01)
    assert ex["with SP over layers, GB"] == pytest.approx(4.19, abs=0.01)
    assert ex["saved by SP, GB"] == pytest.approx(29.36, abs=0.01)
    assert ex["book's per-layer figure (sbh x 10 x 2 bytes), GiB"] == pytest.approx(1.5625)
    assert ex["all-reduce sent per device, GB"] == ex["reduce-scatter + all-gather sent per device, GB"]


def test_one_process_needs_no_divisibility_and_bad_sizes_are_rejected():
    assert tp.split_seq(torch.ones(10, 1, 2)).shape == (10, 1, 2)  # t = 1 without a group
    assert sp.measure_block_activations(MEM, 10, 1, sequence_parallel=True)["s_local"] == 10
    with pytest.raises(ValueError, match="integer >= 1"):
        sp.activation_bytes_per_layer(8, 1, 8, 2, 0)
    with pytest.raises(ValueError, match="s must be an integer >= 1"):
        sp.activation_bytes_per_layer(0, 1, 8, 2, 1)


def _uneven_sequence_worker():
    from helpers import tensor_parallel as tp

    return tp.split_seq(torch.ones(10, 1, 2))


def test_a_sequence_that_does_not_divide_by_t_is_rejected_on_the_ranks():
    from helpers.launcher import RankError

    with pytest.raises(RankError, match=r"sequence length \(10\) must be divisible by the tensor-parallel degree t=4"):
        launch(_uneven_sequence_worker, world_size=4, quiet=True)
