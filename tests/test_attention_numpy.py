"""Softmax attention and the online-softmax merge (P.10, 12.3.2): exact in real arithmetic,
order-dependent in the last bits."""
import itertools

import numpy as np
import pytest

from helpers import attention_numpy as an


def qkv(n_q=8, n_k=32, d=4, heads=2, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(heads, n, d)).astype(dtype) for n in (n_q, n_k, n_k)]


def loop_attention(q, k, v, mask=None):
    """The definition, one query row at a time (no vectorisation to share bugs with)."""
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for h in range(q.shape[0]):
        for i in range(q.shape[1]):
            s = np.array([q[h, i] @ k[h, j] / np.sqrt(q.shape[-1]) for j in range(k.shape[1])])
            w = np.exp(s - s.max())
            if mask is not None:
                w = np.where(mask[i], np.exp(s - s[mask[i]].max()), 0.0)
            out[h, i] = (w[:, None] * v[h]).sum(0) / w.sum()
    return out


def test_attention_matches_the_definition():
    q, k, v = qkv()
    out, lse = an.attention(q, k, v)
    assert np.allclose(out, loop_attention(q, k, v), rtol=1e-13, atol=1e-14)
    s = an.scores(q, k)
    assert np.allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-14)


def test_causal_mask_matches_the_definition():
    q, k, v = qkv(n_q=6, n_k=6)
    mask = an.causal_mask(6)
    assert mask.sum() == 21 and mask[0].sum() == 1 and mask[5].all()
    assert np.allclose(an.attention(q, k, v, mask)[0], loop_attention(q, k, v, mask), rtol=1e-13, atol=1e-14)


def test_merging_two_blocks_equals_attention_over_both():
    q, k, v = qkv()
    a = an.block_partial(q, k[:, :12], v[:, :12])
    b = an.block_partial(q, k[:, 12:], v[:, 12:])
    out, lse = an.attention(q, k, v)
    m = an.merge(a, b)
    assert np.allclose(m.output(), out, rtol=1e-13, atol=1e-15)
    assert np.allclose(m.lse(), lse, rtol=1e-14)
    assert np.array_equal(m.m, np.maximum(a.m, b.m))


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
def test_every_block_order_gives_the_same_attention_up_to_rounding(dtype, tol):
    q, k, v = qkv(dtype=dtype)
    direct, lse = an.attention(q, k, v)
    for order in itertools.permutations(range(4)):
        out, l2 = an.online_attention(q, k, v, 4, order)
        assert out.dtype == dtype
        assert np.allclose(out, direct, rtol=tol, atol=tol), order
        assert np.allclose(l2, lse, rtol=tol, atol=tol)
    assert np.allclose(an.tree_attention(q, k, v, 4)[0], direct, rtol=tol, atol=tol)


def test_blocks_with_fully_masked_rows_merge_correctly():
    # causal queries at positions 0..7 over keys 0..31: blocks 1..3 are invisible to every query
    q, k, v = qkv(n_q=8, n_k=32)
    mask = an.causal_mask(8, 32)
    direct, _ = an.attention(q, k, v, mask)
    part = an.block_partial(q, k[:, 8:16], v[:, 8:16], mask[:, 8:16])
    assert np.all(part.m == -np.inf) and np.all(part.l == 0)
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        out, _ = an.online_attention(q, k, v, 4, order, mask)
        assert np.all(np.isfinite(out))
        assert np.allclose(out, direct, rtol=1e-13, atol=1e-15)
    empty = an.merge(part, part)
    assert np.all(empty.output() == 0) and np.all(empty.lse() == -np.inf)


def test_one_merge_is_commutative_bit_for_bit():
    q, k, v = qkv()
    for seed in range(5):
        rng = np.random.default_rng(seed)
        idx = rng.permutation(32)
        a = an.block_partial(q, k[:, idx[:10]], v[:, idx[:10]])
        b = an.block_partial(q, k[:, idx[10:]], v[:, idx[10:]])
        assert an.merge_is_commutative(a, b)


def test_merge_chains_are_not_associative_in_floating_point():
    q, k, v = qkv()
    parts = [an.block_partial(q, k[:, i], v[:, i]) for i in an.split_blocks(32, 4)]
    results = [an.merge_is_associative(*trio) for trio in itertools.permutations(parts, 3)]
    assert not all(results)  # some regrouping changes some bits
    a, b, c = parts[:3]
    x, y = an.merge(an.merge(a, b), c), an.merge(a, an.merge(b, c))
    assert np.allclose(x.output(), y.output(), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_order_study_finds_last_bit_differences_only(dtype):
    q, k, v = qkv(n_q=16, n_k=64, d=8, dtype=dtype)
    r = an.order_study(q, k, v, 4)
    assert r["orders"] == 24
    # merge(a, b) == merge(b, a) bitwise, so swapping the first two blocks never matters: <= 12
    assert 1 < r["distinct"] <= 12
    assert r["frac_bits_differ_vs_direct"] > 0.1  # not bit-identical to one-process attention
    assert r["max_err_in_eps"] < 16  # but within a few eps on the output's scale


def test_ulp_distance_counts_representable_numbers():
    one = np.array([1.0])
    assert an.ulp_distance(one, np.nextafter(one, 2)).tolist() == [1]
    assert an.ulp_distance(one, one).tolist() == [0]
    assert an.ulp_distance(np.array([-0.0]), np.array([0.0])).tolist() == [0]
    tiny = np.array([5e-324])
    assert an.ulp_distance(-tiny, tiny).tolist() == [2]
    f = np.array([1.0], dtype=np.float32)
    assert an.ulp_distance(f, np.nextafter(f, np.float32(0))).tolist() == [1]
    with pytest.raises(ValueError, match="share dtype and shape"):
        an.ulp_distance(one, f)
    with pytest.raises(ValueError, match="undefined for NaN"):
        an.ulp_distance(np.array([np.nan]), one)


def test_ring_order():
    assert an.ring_order(0, 4) == [0, 3, 2, 1]
    assert an.ring_order(2, 4) == [2, 1, 0, 3]
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 4\)"):
        an.ring_order(4, 4)


def test_bad_input_is_rejected():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="do not divide 32 keys"):
        an.online_attention(q, k, v, 5)
    with pytest.raises(ValueError, match="permutation"):
        an.online_attention(q, k, v, 4, [0, 0, 1, 2])
    with pytest.raises(ValueError, match="feature size"):
        an.attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="same number of tokens"):
        an.attention(q, k, v[:, :5])
    with pytest.raises(ValueError, match="same query rows"):
        an.merge(an.block_partial(q, k, v), an.block_partial(q[:, :3], k, v))
