"""helpers.moe_numpy (12.4.1, 12.4.2): the mixture-of-experts layer by hand, against a per-token loop,
finite differences and torch autograd; capacity and dropping in a worked example; the routing
statistics; the ValueErrors; the capacity and all-to-all closed forms of helpers.costs."""
import numpy as np
import pytest
import torch

from helpers import costs
from helpers import expert_parallel as epl
from helpers import moe_numpy as mn


def _per_token(P, top_k):
    """The layer without capacity, one token at a time, written out from the definition."""
    y = np.zeros_like(P["x"])
    for t, x in enumerate(P["x"]):
        s = 1 / (1 + np.exp(-(x @ P["router"])))
        chosen = sorted(range(len(s)), key=lambda e: -s[e])[:top_k]
        for e in chosen:
            a, b = x @ P["w1"][e], x @ P["w3"][e]
            y[t] += s[e] / sum(s[c] for c in chosen) * ((a / (1 + np.exp(-a)) * b) @ P["w2"][e])
    return y


def test_forward_equals_the_definition_token_by_token():
    P = mn.problem(12, 6, 5, 8, seed=4)
    y, cache = mn.moe_forward(P["x"], P, 3)
    assert np.allclose(y, _per_token(P, 3), rtol=1e-12, atol=1e-12)
    assert cache["keep"].all() and cache["capacity"] == 12
    assert np.allclose(cache["gates"].sum(axis=1), 1) and np.all(np.diff(np.take_along_axis(cache["scores"], cache["idx"], 1)) < 0)


def test_keep_mask_worked_example():
    # slot 0: t0, t1 fill expert 0 (capacity 2), t2 is dropped, t3 -> 1; slot 1: t0 -> 1 (its 2nd), t1 -> 2,
    # t2 -> 1 is dropped (full), t3 -> 0 is dropped (full)
    idx = np.array([[0, 1], [0, 2], [0, 1], [1, 0]])
    assert mn.keep_mask(idx, 3, 2).tolist() == [[True, True], [True, True], [False, False], [True, False]]
    # two groups of two tokens, capacity 1 per group
    assert mn.keep_mask(idx, 3, 1, groups=2).tolist() == [[True, True], [False, True], [True, False], [True, False]]
    assert mn.dispatch_counts(idx, mn.keep_mask(idx, 3, 1, groups=2), 3, 1).tolist() == [[5]]


def test_backward_against_finite_differences_with_drops():
    P = mn.problem(8, 4, 3, 4, seed=5, skew=2.0)
    y, cache = mn.moe_forward(P["x"], P, 2, 1.0, groups=2)
    assert 0 < mn.dropped_fraction(cache["keep"]) < 1
    g = mn.moe_backward(P["dy"], cache)
    eps = 1e-6
    for name in ("x", "router", "w1", "w3", "w2"):
        num = np.zeros_like(P[name])
        for i in np.ndindex(P[name].shape):
            vals = []
            for d in (eps, -eps):
                Q = {**P, name: P[name].copy()}
                Q[name][i] += d
                yq, cq = mn.moe_forward(Q["x"], Q, 2, 1.0, groups=2)
                assert np.array_equal(cq["keep"], cache["keep"])  # the step changes no routing decision
                vals.append(np.sum(yq * P["dy"]))
            num[i] = (vals[0] - vals[1]) / (2 * eps)
        assert np.allclose(num, g[name], rtol=1e-6, atol=1e-7), name


@pytest.mark.parametrize("cf", [None, 1.0, 0.5])
def test_backward_against_torch_autograd(cf):
    P = mn.problem(32, 6, 5, 8, seed=6, skew=1.5)
    y, cache = mn.moe_forward(P["x"], P, 2, cf, groups=4)
    g = mn.moe_backward(P["dy"], cache)
    T = {k: torch.tensor(P[k], requires_grad=True) for k in ("x", "router", "w1", "w3", "w2")}
    yt = epl.moe_single(T["x"], T, 2, cf, groups=4)
    (yt * torch.tensor(P["dy"])).sum().backward()
    assert np.allclose(yt.detach().numpy(), y, rtol=1e-12, atol=1e-13)
    for k in T:
        assert np.allclose(T[k].grad.numpy(), g[k], rtol=1e-11, atol=1e-12), k
    if cf == 0.5:
        assert mn.dropped_fraction(cache["keep"]) > 0.3


def test_routing_statistics():
    P = mn.problem(64, 8, 4, 8, seed=1, skew=3.0)
    r = mn.route(P["x"], P["router"], 2)
    keep = mn.keep_mask(r["idx"], 8, costs.expert_capacity(16, 8, 2, 1.0), groups=4)
    load = mn.expert_load(r["idx"], keep, 8)
    assert load["routed"].sum() == 128 and load["kept"].sum() == keep.sum() and np.all(load["kept"] <= 4 * 4)
    assert load["routed"].max() > 2 * load["routed"].mean()  # the skew makes some experts popular
    assert mn.rank_load(load["routed"], 4).tolist() == load["routed"].reshape(4, 2).sum(1).tolist()
    D = mn.dispatch_counts(r["idx"], keep, 8, 4)
    assert D.sum() == keep.sum() and D.sum(axis=1).tolist() == [keep[16 * g:16 * g + 16].sum() for g in range(4)]
    assert D.sum(axis=0).tolist() == mn.rank_load(load["kept"], 4).tolist()
    sweep = mn.capacity_sweep(P["x"], P["router"], 2, [0.25, 0.5, 1.0, 2.0, 4.0], groups=4)
    assert all(a >= b for a, b in zip(sweep, sweep[1:])) and sweep[0] > 0.5 and sweep[-1] == 0  # cf = E/k: capacity = all tokens


def test_costs_closed_forms():
    assert costs.expert_capacity(64, 8, 2, 1.0) == 16 and costs.expert_capacity(64, 8, 2, 1.25) == 20
    assert costs.expert_capacity(40, 4, 1, 1.1) == 11 and costs.expert_capacity(10, 4, 1, 1.0) == 3
    assert costs.expert_capacity(64, 8, 2) == 64
    # DeepSeek-V3 per MoE layer and 4096-token micro-batch: 4096 x 8 x 7168 BF16 values, 63/64 leave the GPU
    assert costs.moe_dispatch_bytes(4096, 8, 7168, 2) == 4096 * 8 * 7168 * 2
    assert costs.moe_all_to_all_sent(4096, 8, 7168, 64, 2) == 4096 * 8 * 7168 * 2 * 63 / 64
    assert costs.moe_all_to_all_sent(10, 2, 4, 4, 8, remote_share=0.5) == 320
    assert costs.moe_all_to_all_sent(10, 2, 4, 1, 8) == 0


def test_value_errors():
    with pytest.raises(ValueError, match="divisible by the 4 expert-parallel ranks"):
        mn.check_layout(6, 2, 4)
    with pytest.raises(ValueError, match="top_k .3. must be <= the number of experts .2."):
        mn.check_layout(2, 3)
    for cf in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="capacity_factor"):
            mn.check_layout(8, 2, 1, cf)
    P = mn.problem(10, 4, 3, 4)
    with pytest.raises(ValueError, match="10 tokens must be divisible by the 4 groups"):
        mn.moe_forward(P["x"], P, 2, 1.0, groups=4)
    with pytest.raises(ValueError, match="top_k"):
        mn.moe_forward(P["x"], P, 5)
    with pytest.raises(ValueError, match="capacity_factor"):
        costs.expert_capacity(8, 4, 1, 0)
    with pytest.raises(ValueError, match="top_k"):
        costs.expert_capacity(8, 4, 5, 1.0)
    with pytest.raises(ValueError, match="remote_share"):
        costs.moe_all_to_all_sent(8, 2, 4, 4, remote_share=1.5)


def test_deepseek_v3_expert_parallelism_read_back():
    from helpers import case_studies as cs

    r = cs.deepseek_ep()
    p, b = r["params"], r["bytes"]
    assert p["experts per GPU per MoE layer"] == 4  # 256 routed experts over EP 64
    assert p["one MoE layer on one GPU: routed experts"] == 4 * 3 * 7168 * 2048
    assert p["one MoE layer on one GPU: attention, shared expert, router"] > p["one MoE layer on one GPU: routed experts"]
    assert p["per GPU, 16 stages averaged: total"] == pytest.approx((653.9e9 / 64 + 17.1e9) / 16, rel=1e-3)
    # 4096 tokens x 8 copies x 7168 values, 63/64 of them to other GPUs: FP8 dispatch, BF16 combine
    assert b["EP 64 dispatch (FP8)"] == 4096 * 8 * 7168 * 63 / 64 == 231_211_008
    assert b["EP 64 combine (BF16)"] == 2 * 231_211_008
    # TP over the same 64-way split: every GPU all-reduces every token's output (2 x 63/64 x s h x 2 bytes)
    assert b["TP 64 over the experts, per micro-batch (shared by 64 GPUs)"] == 2 * 63 / 64 * 4096 * 7168 * 2
    assert b["TP 64 over the experts, same tokens per GPU as EP"] == 8 * b["EP 64 dispatch + combine, both BF16"]  # EP / top_k
