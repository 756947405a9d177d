"""Ring attention (P.10, 12.3.2): partitions, cost models, the tiled kernel, and the ring on real
ranks compared with one-process attention (outputs and gradients), bytes and memory measured."""
import math

import numpy as np
import pytest
import torch

from helpers import costs
from helpers import ring_attention as ra
from helpers.launcher import RankError, launch

# ---- partitions and padding ------------------------------------------------------------------

def test_partitions_hold_the_positions_the_sections_describe():
    c, st, z = (ra.partition_indices(16, 4, sch) for sch in ("contiguous", "striped", "zigzag"))
    assert [x.tolist() for x in c] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert [x.tolist() for x in st] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert [x.tolist() for x in z] == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    for parts in (c, st, z):
        assert sorted(np.concatenate(parts).tolist()) == list(range(16))


def test_a_length_that_does_not_divide_is_refused_or_padded():
    with pytest.raises(ValueError, match=r"s=10 is not divisible by p=4 .*pad it to 12"):
        ra.partition_indices(10, 4, "contiguous")
    with pytest.raises(ValueError, match=r"not divisible by 2p=8"):
        ra.partition_indices(12, 4, "zigzag")
    assert ra.padded_length(10, 4) == 12 and ra.padded_length(12, 4) == 12
    assert ra.padded_length(12, 4, "zigzag") == 16
    with pytest.raises(ValueError, match="unknown partition scheme"):
        ra.partition_indices(16, 4, "diagonal")
    with pytest.raises(ValueError, match="p must be an integer >= 1"):
        ra.partition_indices(16, 0)


def test_causal_work_per_rank_contiguous_vs_balanced():
    s, p = 64, 4
    n = s // p
    for scheme in ra.SCHEMES:
        w = ra.work_table(s, p, scheme)
        assert w["pairs"].sum() == s * (s + 1) // 2  # every visible pair once
    c = ra.work_table(s, p, "contiguous")["pairs"].sum(1)
    assert c.tolist() == [n * (n + 1) // 2 + r * n * n for r in range(p)]
    z = ra.work_table(s, p, "zigzag")["pairs"].sum(1)
    assert len(set(z.tolist())) == 1  # zigzag: exactly equal
    st = ra.work_table(s, p, "striped")["pairs"].sum(1)
    # striped: local query i of rank r sees the i*p + r + 1 keys at or before it
    assert st.tolist() == [p * n * (n - 1) // 2 + n * (r + 1) for r in range(p)]
    assert c.max() / c.mean() > 1.7 and st.max() / st.mean() < 1.05
    # skipping whole blocks: contiguous skips those above the diagonal, zigzag skips half of every block
    tiles = ra.work_table(s, p, "zigzag", tile=n // 2)["tiles"]
    assert tiles[:, 0].tolist() == [3] * p and tiles[:, 1:].flatten().tolist() == [2] * (p * (p - 1))
    assert ra.work_table(s, p, "contiguous")["tiles"].sum(1).tolist() == [1, 2, 3, 4]


def test_padding_keys_are_hidden():
    ok = ra.allowed(np.arange(4), np.arange(6), causal=False, valid_len=5)
    assert ok[:, :5].all() and not ok[:, 5].any()


# ---- the sections' numbers -------------------------------------------------------------------

def test_cost_models_reproduce_the_worked_examples():
    assert ra.score_matrix_bytes(128_000) == 32_768_000_000  # P.10: ~32.8 GB
    assert ra.kv_bytes(128_000, 8192) == 4_194_304_000  # 12.3.2 intro: ~4.2 GB
    per_layer = ra.kv_bytes(131_072, 8192)
    assert per_layer == 4_294_967_296 and ra.kv_bytes(131_072, 8192, layers=80) == 80 * per_layer  # ~343 GB
    assert ra.kv_bytes(131_072, 8192, layers=80, p=8) == pytest.approx(42.95e9, rel=1e-3)
    assert ra.kv_bytes(131_072, 8192, layers=80, p=8, t=8) == pytest.approx(5.37e9, rel=1e-3)
    ring = ra.ring_bytes_per_rank(131_072, 8, 64, 128)
    assert ring == 7 * 2 * 16_384 * 64 * 128 * 2 == 3_758_096_384
    assert ring / 600e9 == pytest.approx(6.26e-3, rel=1e-3)
    assert ra.allgather_kv_bytes_per_rank(131_072, 8, 64, 128) == ring
    assert ra.ulysses_bytes_per_rank(131_072, 8, 64, 128) == pytest.approx(ring * 2 / 8)
    assert ra.attention_flops(16_384, 131_072, 64, 128) == 4 * 16_384 * 131_072 * 8192
    with pytest.raises(ValueError, match="p=3 to divide n_heads=64"):
        ra.ulysses_bytes_per_rank(131_072, 3, 64, 128)
    with pytest.raises(ValueError, match="n must be a finite number >= 0"):
        ra.score_matrix_bytes(-1)


def test_ring_step_times_break_even_where_costs_says():
    # per step: 4 n^2 H d FLOPs (half if causal) against 2 n H_kv d x 2 bytes; equal at costs.ring_overlap_tokens
    F, B, p = 1e15, 5e11, 8
    for g, causal in [(1, False), (1, True), (8, True)]:
        n = costs.ring_overlap_tokens(F, B, g, causal)
        at = ra.ring_step_times(int(round(p * n)), p, 64, 128, F, B, kv_heads=64 // g, causal=causal)
        assert at["compute_s"] == pytest.approx(at["transfer_s"], rel=1e-3)
        twice = ra.ring_step_times(int(round(2 * p * n)), p, 64, 128, F, B, kv_heads=64 // g, causal=causal)
        assert twice["compute_s"] == pytest.approx(2 * twice["transfer_s"], rel=1e-3) and twice["hidden"]
    one = ra.ring_step_times(8 * 1024, 8, 2, 4, 1e12, 1e9)  # n = 1024: 4 n^2 x 8 FLOPs, 2 n x 8 x 2 bytes
    assert one == {"compute_s": 4 * 1024 ** 2 * 8 / 1e12, "transfer_s": 2 * 1024 * 8 * 2 / 1e9, "hidden": True}
    with pytest.raises(ValueError, match="a ring needs p >= 2"):
        ra.ring_step_times(1024, 1, 8, 64, 1e12, 1e9)
    with pytest.raises(ValueError, match="kv_heads=3 must divide n_heads=8"):
        ra.ring_step_times(1024, 4, 8, 64, 1e12, 1e9, kv_heads=3)


def test_tolerances_follow_the_dtype():
    assert ra.tolerance(torch.float64)[0] == 64 * 2.0 ** -52
    assert ra.tolerance(torch.bfloat16)[0] == 4 * 2.0 ** -7
    assert ra.acc_dtype(torch.bfloat16) == torch.float32 and ra.acc_dtype(torch.float64) == torch.float64
    with pytest.raises(ValueError, match="no tolerance defined"):
        ra.tolerance(torch.int64)


# ---- the tiled kernel on one process ----------------------------------------------------------

@pytest.mark.parametrize("scheme", ra.SCHEMES)
def test_block_kernel_merged_over_a_simulated_ring_equals_attention(scheme):
    s, p, heads, d = 32, 4, 2, 8
    q, k, v, dout = ra.make_inputs(s, heads, d, seed=3)
    ref_out, ref_dq, ref_dk, ref_dv = ra.reference_attention(q, k, v, dout, causal=True)
    parts = ra.partition_indices(s, p, scheme)
    scale = 1 / math.sqrt(d)
    table = ra.work_table(s, p, scheme, tile=4)["tiles"]
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for r in range(p):
        ir = torch.as_tensor(parts[r])
        out = torch.zeros(heads, s // p, d, dtype=q.dtype)
        lse = torch.full((heads, s // p), -math.inf, dtype=q.dtype)
        for j in range(p):  # rank r sees blocks r, r-1, ... as on the ring
            src = (r - j) % p
            plan = ra.tile_plan(parts[r], parts[src], True, None, 4)
            if plan:
                bo, bl, nt = ra.block_forward(q[:, ir], k[:, parts[src]], v[:, parts[src]], plan, scale)
                ra.merge_into(out, lse, bo, bl)
            else:
                nt = 0
            assert nt == table[r, j]
        assert torch.allclose(out, ref_out[:, ir], rtol=1e-12, atol=1e-14)
        delta = (dout[:, ir] * out).sum(-1)
        dq = torch.zeros(heads, s // p, d, dtype=q.dtype)
        for src in range(p):
            plan = ra.tile_plan(parts[r], parts[src], True, None, 4)
            if plan:
                bq, bk, bv, _ = ra.block_backward(q[:, ir], k[:, parts[src]], v[:, parts[src]], dout[:, ir], lse, delta, plan, scale)
                dq += bq
                dk[:, parts[src]] += bk
                dv[:, parts[src]] += bv
        assert torch.allclose(dq, ref_dq[:, ir], rtol=1e-12, atol=1e-14)
    assert torch.allclose(dk, ref_dk, rtol=1e-12, atol=1e-14)
    assert torch.allclose(dv, ref_dv, rtol=1e-12, atol=1e-14)


def test_buffer_meter_counts_until_a_tensor_is_freed():
    m = ra.BufferMeter()
    a = m.track(torch.zeros(10, dtype=torch.float64), "kv")
    b = m.track(torch.zeros(5, dtype=torch.float64), "kv")
    assert m.current["kv"] == 120 and m.peak["kv"] == 120
    del a
    assert m.current["kv"] == 40
    kept = [b]
    del b
    assert m.current["kv"] == 40  # still referenced from a list
    kept.clear()
    assert m.current["kv"] == 0 and m.peak["kv"] == 120


# ---- on real ranks ---------------------------------------------------------------------------

S, H, D = 64, 2, 8


@pytest.mark.parametrize("scheme", ra.SCHEMES)
def test_ring_forward_and_backward_equal_one_process_attention(scheme):
    run = launch(ra.ring_attention_worker, S, H, D, scheme=scheme, causal=True, tile=4, world_size=4, quiet=True)
    cmp = ra.compare_results(run.results, S, H, D, causal=True)
    assert cmp["ok"], cmp
    assert cmp["errors"]["dk"] > 0 or cmp["errors"]["dv"] > 0  # computed, not copied
    table = ra.work_table(S, 4, scheme, tile=4)["tiles"]
    for r, res in enumerate(run.results):
        assert res["stats"]["forward"]["tiles"] == table[r].tolist()
        assert res["stats"]["forward"]["src"] == [(r - j) % 4 for j in range(4)]


def test_bytes_sent_and_kv_held_per_rank_match_the_models():
    p = 4
    run = launch(ra.ring_attention_worker, S, H, D, world_size=p, quiet=True)
    fwd = ra.ring_bytes_per_rank(S, p, H, D, bytes_per=8)
    bwd = ra.ring_backward_bytes_per_rank(S, p, H, D, bytes_per=8)
    for r, res in enumerate(run.results):
        sends = [o for o in run.comm[r] if o.op == "send"]
        assert len(sends) == (p - 1) + (p - 1) + p
        assert run.bytes_sent(r) == fwd + bwd
        shard = res["shard_bytes"]
        assert shard == 2 * H * (S // p) * D * 8
        assert res["fwd_peak"]["kv"] == 3 * shard  # own shard + buffer being sent + buffer arriving
        assert res["bwd_peak"]["kv"] == 3 * shard and res["bwd_peak"]["dkv"] == 2 * shard
        # autograd keeps q, k, v, out of this rank's shard and the row log-sum-exp, nothing received
        assert res["saved_bytes"] == 2 * shard + H * (S // p) * 8


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lower_precision_stays_within_its_tolerance(dtype):
    run = launch(ra.ring_attention_worker, S, H, D, scheme="zigzag", causal=True, dtype=dtype, world_size=4, quiet=True)
    cmp = ra.compare_results(run.results, S, H, D, causal=True, dtype=dtype)
    assert cmp["ok"], cmp
    assert run.results[0]["out"].dtype == getattr(torch, dtype)


def test_padding_a_length_that_does_not_divide():
    run = launch(ra.ring_attention_worker, 61, H, D, scheme="zigzag", causal=True, pad=True, world_size=3, quiet=True)
    assert sum(len(r["idx"]) for r in run.results) == ra.padded_length(61, 3, "zigzag") == 66
    assert ra.compare_results(run.results, 61, H, D, causal=True)["ok"]
    run = launch(ra.ring_attention_worker, 61, H, D, scheme="contiguous", causal=False, pad=True, world_size=4, quiet=True)
    assert ra.compare_results(run.results, 61, H, D, causal=False)["ok"]  # padding keys masked


def test_two_ranks_and_no_overlap_give_the_same_result():
    run = launch(ra.ring_attention_worker, S, H, D, causal=True, overlap=False, backward=False, world_size=2, quiet=True)
    assert ra.compare_results(run.results, S, H, D, causal=True)["ok"]
    assert run.results[0]["fwd_peak"]["kv"] == 3 * run.results[0]["shard_bytes"]


def test_one_rank_is_plain_attention_and_sends_nothing():
    run = launch(ra.ring_attention_worker, 32, H, D, causal=True, world_size=1, quiet=True)
    assert ra.compare_results(run.results, 32, H, D, causal=True)["ok"]
    assert run.bytes_sent(0) == 0 == ra.ring_backward_bytes_per_rank(32, 1, H, D) + ra.ring_bytes_per_rank(32, 1, H, D)


def test_bf16_backward_sends_float32_accumulators():
    run = launch(ra.ring_attention_worker, S, H, D, dtype="bfloat16", world_size=4, quiet=True)
    model = ra.ring_bytes_per_rank(S, 4, H, D, 2) + ra.ring_backward_bytes_per_rank(S, 4, H, D, 2, grad_bytes_per=4)
    assert run.bytes_sent(0) == model


def test_ring_attention_rejects_bad_shapes_before_communicating():
    q = torch.zeros(2, 8, 4)
    with pytest.raises(ValueError, match="must be \\(heads, tokens, head_dim\\)"):
        ra.ring_attention(q, torch.zeros(2, 6, 4), torch.zeros(2, 6, 4))
    with pytest.raises(ValueError, match="unknown partition scheme"):
        ra.ring_attention(q, q, q, scheme="random")
    with pytest.raises(ValueError, match="zigzag needs an even local shard"):
        ra.ring_attention(q[:, :7], q[:, :7], q[:, :7], scheme="zigzag")


def test_ring_allgather_and_ulysses_agree_and_cost_what_the_models_say():
    p, heads = 4, 4
    run = launch(ra.designs_worker, S, heads, D, causal=True, world_size=p, quiet=True)
    q, k, v, _ = ra.make_inputs(S, heads, D, 0, torch.float32)
    ref = ra.reference_attention(q, k, v, causal=True)[0]
    rtol, atol = ra.tolerance(torch.float32)
    for design in ("ring", "allgather", "ulysses"):
        got = ra.assemble([{"idx": r["idx"], "out": r[design]["out"]} for r in run.results], "out", S)
        assert torch.allclose(got.double(), ref, rtol=rtol, atol=atol), design
    shard = run.results[0]["shard_bytes"]
    for res in run.results:
        assert res["ring"]["sent"] == ra.ring_bytes_per_rank(S, p, heads, D, 4)
        assert res["allgather"]["sent"] == ra.allgather_kv_bytes_per_rank(S, p, heads, D, 4)
        assert res["ulysses"]["sent"] == ra.ulysses_bytes_per_rank(S, p, heads, D, 4)
        assert (res["ring"]["kv_peak"], res["allgather"]["kv_peak"], res["ulysses"]["kv_peak"]) == (3 * shard, (1 + p) * shard, 2 * shard)


def test_causal_balance_worker_reports_per_step_work():
    run = launch(ra.causal_balance_worker, 128, 2, 8, tile=8, repeats=1, world_size=4, quiet=True)
    q, k, v, _ = ra.make_inputs(128, 2, 8, 0, torch.float32)
    ref = ra.reference_attention(q, k, v, causal=True)[0]
    for scheme in ra.SCHEMES:
        table = ra.work_table(128, 4, scheme, tile=8)["tiles"]
        assert [r[scheme]["tiles"] for r in run.results] == table.tolist()
        got = ra.assemble([{"idx": r[scheme]["idx"], "out": r[scheme]["out"]} for r in run.results], "out", 128)
        assert torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-5)
        assert all(len(r[scheme]["cpu_s"]) == 4 and min(r[scheme]["cpu_s"]) >= 0 for r in run.results)


def test_cp_ring_and_tp_all_reduce_run_on_their_own_groups():
    s, heads, d = 32, 4, 8
    run = launch(ra.cp_tp_worker, s, heads, d, cp=2, tp=2, world_size=4, quiet=True)
    q, k, v, _ = ra.make_inputs(s, heads, d, 0, torch.float64)
    y = ra.reference_attention(q, k, v, causal=True)[0].permute(1, 0, 2).reshape(s, heads * d) @ ra.output_projection(heads, d)
    for r, res in enumerate(run.results):
        assert res["coord"] == {"cp": r // 2, "tp": r % 2}
        assert res["groups"] == {"cp": [r % 2, r % 2 + 2], "tp": [r - r % 2, r - r % 2 + 1]}
        assert torch.allclose(res["y"], y[torch.as_tensor(res["idx"])], rtol=1e-12, atol=1e-12)
        ring = [o for o in run.comm[r] if o.op in ("send", "recv")]
        ar = [o for o in run.comm[r] if o.op == "all_reduce"]
        assert len(ring) == 2 and len(ar) == 1  # CP ring of 2: one step; one row-parallel sum
        assert all(o.group_ranks == tuple(res["groups"]["cp"]) for o in ring)
        assert ar[0].group_ranks == tuple(res["groups"]["tp"])


def test_overlap_on_and_off_compute_the_same_bits():
    run = launch(ra.overlap_worker, 48, 2, 8, repeats=1, world_size=3, quiet=True, record=False)
    q, k, v, _ = ra.make_inputs(48, 2, 8, 0, torch.float32)
    ref = ra.reference_attention(q, k, v)[0]
    for res in run.results:
        assert torch.equal(res["off"]["out"], res["on"]["out"])
        assert len(res["off"]["compute_s"]) == 3 and len(res["off"]["wait_s"]) == 2
        assert res["off"]["total_s"] > 0 and res["on"]["total_s"] > 0
    got = ra.assemble([r["on"] for r in run.results], "out", 48)
    assert torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-5)
    # only the overlapped run waits after computing ("wait" spans); both compute every step
    for spans in run.spans:
        assert [s.name for s in spans].count("wait") == 2 and [s.name for s in spans].count("attend") == 6


def test_without_padding_the_ranks_refuse_a_length_that_does_not_divide():
    # last in the file: a failed launch ends the worker processes, and the next launch restarts them
    with pytest.raises(RankError, match="not divisible by p=4"):
        launch(ra.ring_attention_worker, 61, H, D, world_size=4, quiet=True)
