"""Tensor parallelism in numpy (P.8, 12.2.1): the splits, the MLP, attention by heads, backward."""
import numpy as np
import pytest

from helpers import tp_numpy as tn


def test_the_book_2x2_example_exactly():
    ex = tn.book_2x2()
    assert ex["Y"] == [7, 10]
    assert ex["column shards W_k"] == [[[1], [3]], [[2], [4]]]
    assert ex["column outputs Y_k"] == [[7], [10]] and ex["column result (concat)"] == [7, 10]
    assert ex["row shards W_k"] == [[[1, 2]], [[3, 4]]]
    assert ex["row partials P_k"] == [[1, 2], [6, 8]] and ex["row result (sum)"] == [7, 10]


@pytest.mark.parametrize("t", [1, 2, 3, 6])
def test_column_concat_and_row_sum_equal_the_product(t):
    rng = np.random.default_rng(t)
    X, W = rng.integers(-5, 5, (4, 6)), rng.integers(-5, 5, (6, 12))
    assert np.array_equal(np.concatenate(tn.column_parallel(X, W, t), axis=1), X @ W)  # integers: exact
    assert np.array_equal(sum(tn.row_parallel(X, W, t)), X @ W)


def test_mlp_column_then_row_equals_the_unsplit_mlp_and_row_first_would_not():
    P = tn.random_problem(s=5, h=8, ffn=16)
    X, A, B = P["X"], P["A"], P["B"]
    for t in (1, 2, 4, 8):
        out = tn.mlp_tensor_parallel(X, A, B, t)
        assert np.allclose(out["Z"], tn.mlp(X, A, B), rtol=0, atol=1e-13)
        assert np.allclose(np.concatenate(out["hidden"], axis=1), tn.gelu(X @ A), rtol=0, atol=1e-14)
    # splitting A by rows instead gives partial sums, and GeLU of a partial sum is not a partial of GeLU
    partial_sums = tn.row_parallel(X, A, 2)
    assert not np.allclose(sum(tn.gelu(p) for p in partial_sums), tn.gelu(X @ A))


def test_gelu_matches_torch_tanh_form_and_its_derivative_finite_differences():
    import torch

    x = np.linspace(-4, 4, 41)
    ref = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    assert np.allclose(tn.gelu(x), ref, rtol=0, atol=1e-15)
    fd = (tn.gelu(x + 1e-6) - tn.gelu(x - 1e-6)) / 2e-6
    assert np.allclose(tn.gelu_grad(x), fd, rtol=0, atol=1e-8)


def test_mlp_backward_against_finite_differences_and_the_split_backward():
    P = tn.random_problem(s=4, h=6, ffn=12, heads=2, seed=3)
    X, A, B, dZ = P["X"], P["A"], P["B"], P["dZ"]
    g = tn.mlp_backward(X, A, B, dZ)
    assert np.allclose(g["dX"], tn.numerical_grad(lambda x: (tn.mlp(x, A, B) * dZ).sum(), X), atol=1e-8)
    assert np.allclose(g["dA"], tn.numerical_grad(lambda a: (tn.mlp(X, a, B) * dZ).sum(), A), atol=1e-8)
    assert np.allclose(g["dB"], tn.numerical_grad(lambda b: (tn.mlp(X, A, b) * dZ).sum(), B), atol=1e-8)
    for t in (2, 3, 6):
        gt = tn.mlp_tensor_parallel_backward(X, A, B, dZ, t)
        assert np.allclose(np.concatenate(gt["dA"], axis=1), g["dA"], rtol=0, atol=1e-14)
        assert np.allclose(np.concatenate(gt["dB"], axis=0), g["dB"], rtol=0, atol=1e-14)
        assert np.allclose(gt["dX"], g["dX"], rtol=0, atol=1e-13)
        assert not np.allclose(gt["dX_partials"][0], g["dX"])  # one device alone has only a part


def test_attention_split_by_heads_forward_and_backward():
    P = tn.random_problem(s=5, h=8, ffn=8, heads=4, seed=1)
    W = [P[k] for k in ("Wq", "Wk", "Wv", "Wo")]
    X, dO = P["X"], P["dZ"]
    full = tn.attention(X, *W, 4)
    g = tn.attention_backward(X, *W, 4, dO)
    for i, name in enumerate(("dWq", "dWk", "dWv", "dWo")):
        def f(w, i=i):
            WW = list(W)
            WW[i] = w
            return (tn.attention(X, *WW, 4) * dO).sum()
        assert np.allclose(g[name], tn.numerical_grad(f, W[i]), atol=1e-8), name
    assert np.allclose(g["dX"], tn.numerical_grad(lambda x: (tn.attention(x, *W, 4) * dO).sum(), X), atol=1e-8)
    for t in (1, 2, 4):
        assert np.allclose(tn.attention_tensor_parallel(X, *W, 4, t)["out"], full, rtol=0, atol=1e-14)
        gt = tn.attention_tensor_parallel_backward(X, *W, 4, t, dO)
        for name, axis in (("dWq", 1), ("dWk", 1), ("dWv", 1), ("dWo", 0)):
            assert np.allclose(np.concatenate(gt[name], axis=axis), g[name], rtol=0, atol=1e-14)
        assert np.allclose(gt["dX"], g["dX"], rtol=0, atol=1e-13)


def test_head_columns_picks_whole_heads():
    assert tn.head_columns(h=12, heads=6, t=3, rank=1) == slice(4, 8)
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 3\)"):
        tn.head_columns(12, 6, 3, 3)


@pytest.mark.parametrize("call, match", [
    (lambda: tn.column_split(np.ones((2, 6)), 4), r"output columns \(6\) must be divisible by the tensor-parallel degree t=4"),
    (lambda: tn.row_split(np.ones((5, 2)), 2), r"input rows \(5\) must be divisible"),
    (lambda: tn.mlp_tensor_parallel(np.ones((2, 4)), np.ones((4, 6)), np.ones((6, 4)), 4), r"FFN width \(6\)"),
    (lambda: tn.attention_tensor_parallel(np.ones((2, 12)), *[np.eye(12)] * 4, heads=6, t=4), r"number of attention heads \(6\)"),
    (lambda: tn.column_split(np.ones((2, 4)), 0), "integer >= 1"),
    (lambda: tn.check_degree(2.0), "integer >= 1"),
    (lambda: tn.random_problem(h=10, heads=4), r"hidden size h \(10\)"),
])
def test_bad_shapes_are_rejected_with_the_constraint(call, match):
    with pytest.raises(ValueError, match=match):
        call()
