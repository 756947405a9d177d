"""Tensor parallelism in numpy (P.8, 12.2.1): column and row splits, the MLP, attention by heads.

Everything here runs on one process and checks itself exactly: a "device" is an index into a list
of shards. The forward of each split is compared with the unsplit product, and each split's
backward (derived by hand below) with the unsplit gradient and with finite differences.

Shapes: ``X`` is (s, h) (one sequence of s tokens; a batch only adds a leading axis), the MLP is
``Z = GeLU(X A) B`` with ``A`` (h, F) and ``B`` (F, h); attention has ``Wq, Wk, Wv, Wo`` (h, h) and
``heads`` heads of width d = h / heads, head j owning columns j*d:(j+1)*d of Wq, Wk, Wv and the
same rows of Wo. GeLU is the tanh form (PyTorch's ``gelu(approximate="tanh")``).
"""
from __future__ import annotations

import numpy as np

from .validate import equal_parts, index_below, integer_at_least

# ---- constraints ---------------------------------------------------------------------------------

def check_degree(t) -> int:
    """A tensor-parallel degree must be an integer >= 1."""
    integer_at_least(t, "the tensor-parallel degree t")
    return int(t)


def check_divides(what: str, size: int, t: int) -> int:
    """``size // t``; ValueError naming ``what`` unless t divides it (12.2.1: heads, FFN width...)."""
    parts = equal_parts(size, check_degree(t), what + " ({n}) must be divisible by the tensor-parallel degree t={k} ({n} % {k} = {r})")
    return len(parts[0])


# ---- the two splits (P.8's 2x2 example) ----------------------------------------------------------

def column_split(W: np.ndarray, t: int) -> list[np.ndarray]:
    """W cut into t blocks of output columns: device k holds W[:, k*n/t:(k+1)*n/t]."""
    W = np.asarray(W)
    check_divides("the number of output columns", W.shape[1], t)
    return np.split(W, t, axis=1)


def row_split(W: np.ndarray, t: int) -> list[np.ndarray]:
    """W cut into t blocks of input rows: device k holds W[k*m/t:(k+1)*m/t, :]."""
    W = np.asarray(W)
    check_divides("the number of input rows", W.shape[0], t)
    return np.split(W, t, axis=0)


def column_parallel(X: np.ndarray, W: np.ndarray, t: int) -> list[np.ndarray]:
    """Each device's Y_k = X W_k (X replicated): concatenating them along columns gives X W."""
    return [np.asarray(X) @ Wk for Wk in column_split(W, t)]


def row_parallel(X: np.ndarray, W: np.ndarray, t: int) -> list[np.ndarray]:
    """Each device's partial P_k = X_k W_k (X split by columns to match): their sum is X W."""
    X = np.asarray(X)
    check_divides("the inner dimension of X", X.shape[-1], t)
    return [Xk @ Wk for Xk, Wk in zip(np.split(X, t, axis=-1), row_split(W, t))]


def book_2x2() -> dict:
    """P.8's example Y = X W with X = [1, 2], W = [[1, 2], [3, 4]], both splits on 2 devices."""
    X = np.array([[1, 2]])
    W = np.array([[1, 2], [3, 4]])
    col = column_parallel(X, W, 2)
    row = row_parallel(X, W, 2)
    return {
        "Y": (X @ W)[0].tolist(),
        "column shards W_k": [Wk.tolist() for Wk in column_split(W, 2)],
        "column outputs Y_k": [c[0].tolist() for c in col],
        "column result (concat)": np.concatenate(col, axis=1)[0].tolist(),
        "row shards W_k": [Wk.tolist() for Wk in row_split(W, 2)],
        "row partials P_k": [p[0].tolist() for p in row],
        "row result (sum)": sum(row)[0].tolist(),
    }


# ---- GeLU --------------------------------------------------------------------------------------------

_C = np.sqrt(2.0 / np.pi)


def gelu(x):
    """GeLU, tanh form: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi)."""
    x = np.asarray(x, dtype=float)
    return 0.5 * x * (1.0 + np.tanh(_C * (x + 0.044715 * x**3)))


def gelu_grad(x):
    """d GeLU / dx for the tanh form (elementwise, so it needs no communication under TP)."""
    x = np.asarray(x, dtype=float)
    u = _C * (x + 0.044715 * x**3)
    th = np.tanh(u)
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th**2) * _C * (1.0 + 3 * 0.044715 * x**2)


# ---- the MLP: column split of A, row split of B -----------------------------------------------

def mlp(X, A, B):
    """Z = GeLU(X A) B (12.2.1's MLP without dropout)."""
    return gelu(X @ A) @ B


def mlp_backward(X, A, B, dZ) -> dict:
    """Gradients of sum(Z * dZ) for Z = GeLU(X A) B: dX, dA, dB (derived by the chain rule).

    With U = X A and Y = GeLU(U): dB = Y^T dZ, dY = dZ B^T, dU = dY * GeLU'(U), dA = X^T dU,
    dX = dU A^T.
    """
    U = X @ A
    Y = gelu(U)
    dY = dZ @ B.T
    dU = dY * gelu_grad(U)
    return {"dX": dU @ A.T, "dA": X.T @ dU, "dB": Y.T @ dZ}


def mlp_tensor_parallel(X, A, B, t: int) -> dict:
    """The Megatron MLP on t devices: A by columns, B by rows, one sum (all-reduce) at the end.

    Device k computes Y_k = GeLU(X A_k) locally (GeLU is elementwise: the column slice of GeLU(XA)
    is GeLU of the column slice) and the partial Z_k = Y_k B_k. Returns the local hidden slices,
    the partials and their sum.
    """
    check_divides("the FFN width", np.shape(A)[1], t)
    if np.shape(B)[0] != np.shape(A)[1]:
        raise ValueError(f"B must have as many rows as A has columns, got {np.shape(B)[0]} and {np.shape(A)[1]}")
    hidden = [gelu(X @ Ak) for Ak in column_split(A, t)]
    partials = [Yk @ Bk for Yk, Bk in zip(hidden, row_split(B, t))]
    return {"hidden": hidden, "partials": partials, "Z": sum(partials)}


def mlp_tensor_parallel_backward(X, A, B, dZ, t: int) -> dict:
    """The backward of the split MLP, device by device.

    The output gradient dZ is the same on every device (the forward all-reduce's backward is the
    identity). Device k gets its own dA_k and dB_k with no communication; its input gradient
    dX_k = dU_k A_k^T is only a partial sum over its FFN columns, so the full dX needs one
    all-reduce (the backward of the identity "f" in front of the column-parallel layer).
    """
    out = {"dA": [], "dB": [], "dX_partials": []}
    for Ak, Bk in zip(column_split(A, t), row_split(B, t)):
        g = mlp_backward(X, Ak, Bk, dZ)  # the same formulas on the shard: nothing crosses devices
        out["dA"].append(g["dA"])
        out["dB"].append(g["dB"])
        out["dX_partials"].append(g["dX"])
    out["dX"] = sum(out["dX_partials"])
    return out


# ---- multi-head attention, split by heads ---------------------------------------------------------

def _softmax(S):
    S = S - S.max(axis=-1, keepdims=True)
    E = np.exp(S)
    return E / E.sum(axis=-1, keepdims=True)


def head_columns(h: int, heads: int, t: int, rank: int) -> slice:
    """The columns of Wq/Wk/Wv (and rows of Wo) that rank ``rank`` holds: its heads' block."""
    check_divides("the hidden size h", h, heads)
    per = check_divides("the number of attention heads", heads, t)
    index_below(rank, "rank", t)
    d = h // heads
    return slice(rank * per * d, (rank + 1) * per * d)


def attention(X, Wq, Wk, Wv, Wo, heads: int):
    """Multi-head self-attention (no mask, no biases): concat_j softmax(Q_j K_j^T / sqrt d) V_j, then Wo."""
    return _attention_cache(X, Wq, Wk, Wv, Wo, heads)["out"]


def _attention_cache(X, Wq, Wk, Wv, Wo, heads: int) -> dict:
    s, h = X.shape
    if Wq.shape[1] % heads:
        raise ValueError(f"the projection width ({Wq.shape[1]}) must be divisible by the number of heads ({heads})")
    d = Wq.shape[1] // heads
    Q, K, V = (X @ W for W in (Wq, Wk, Wv))
    split = lambda M: M.reshape(s, heads, d).transpose(1, 0, 2)  # (heads, s, d)
    q, k, v = split(Q), split(K), split(V)
    scale = 1.0 / np.sqrt(d)
    P = _softmax(q @ k.transpose(0, 2, 1) * scale)  # (heads, s, s)
    C = (P @ v).transpose(1, 0, 2).reshape(s, heads * d)  # heads concatenated
    return {"q": q, "k": k, "v": v, "P": P, "C": C, "scale": scale, "out": C @ Wo, "d": d}


def attention_backward(X, Wq, Wk, Wv, Wo, heads: int, dOut) -> dict:
    """Gradients of sum(out * dOut) for :func:`attention`, derived by hand.

    dWo = C^T dOut, dC = dOut Wo^T; per head: dV = P^T dC_j, dP = dC_j V^T,
    dS = P * (dP - rowsum(dP * P)) (softmax), dq = dS k * scale, dk = dS^T q * scale;
    then dWq = X^T dQ (and likewise K, V) and dX = dQ Wq^T + dK Wk^T + dV Wv^T.
    """
    c = _attention_cache(X, Wq, Wk, Wv, Wo, heads)
    s = X.shape[0]
    merge = lambda m: m.transpose(1, 0, 2).reshape(s, -1)
    dC = dOut @ Wo.T
    dc = dC.reshape(s, heads, c["d"]).transpose(1, 0, 2)
    dv = c["P"].transpose(0, 2, 1) @ dc
    dP = dc @ c["v"].transpose(0, 2, 1)
    dS = c["P"] * (dP - (dP * c["P"]).sum(axis=-1, keepdims=True))
    dq = dS @ c["k"] * c["scale"]
    dk = dS.transpose(0, 2, 1) @ c["q"] * c["scale"]
    dQ, dK, dV = merge(dq), merge(dk), merge(dv)
    return {
        "dX": dQ @ Wq.T + dK @ Wk.T + dV @ Wv.T,
        "dWq": X.T @ dQ, "dWk": X.T @ dK, "dWv": X.T @ dV, "dWo": c["C"].T @ dOut,
    }


def attention_tensor_parallel(X, Wq, Wk, Wv, Wo, heads: int, t: int) -> dict:
    """Attention on t devices: device k runs its heads/t heads (columns of Wq, Wk, Wv) and its rows
    of Wo, giving a partial output; the sum of the partials (one all-reduce) is the full output."""
    h = Wq.shape[1]
    per = check_divides("the number of attention heads", heads, t)
    partials = []
    for k in range(t):
        cols = head_columns(h, heads, t, k)
        partials.append(attention(X, Wq[:, cols], Wk[:, cols], Wv[:, cols], Wo[cols, :], per))
    return {"partials": partials, "out": sum(partials)}


def attention_tensor_parallel_backward(X, Wq, Wk, Wv, Wo, heads: int, t: int, dOut) -> dict:
    """Per device: the gradients of its own weight shards (no communication) and a partial dX
    (summed by the backward all-reduce)."""
    h = Wq.shape[1]
    per = check_divides("the number of attention heads", heads, t)
    out = {"dWq": [], "dWk": [], "dWv": [], "dWo": [], "dX_partials": []}
    for k in range(t):
        cols = head_columns(h, heads, t, k)
        g = attention_backward(X, Wq[:, cols], Wk[:, cols], Wv[:, cols], Wo[cols, :], per, dOut)
        for name in ("dWq", "dWk", "dWv", "dWo"):
            out[name].append(g[name])
        out["dX_partials"].append(g["dX"])
    out["dX"] = sum(out["dX_partials"])
    return out


# ---- finite differences ----------------------------------------------------------------------------

def numerical_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of the scalar function f at x (float64; for small checks)."""
    x = np.array(x, dtype=float)
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        fp = f(x)
        x[i] = old - eps
        fm = f(x)
        x[i] = old
        g[i] = (fp - fm) / (2 * eps)
    return g


def random_problem(s: int = 6, h: int = 8, ffn: int = 16, heads: int = 4, seed: int = 0) -> dict:
    """Random X, MLP weights A, B and attention weights (float64) for the checks."""
    for name, v in (("s", s), ("h", h), ("ffn", ffn), ("heads", heads)):
        integer_at_least(v, name)
    check_divides("the hidden size h", h, heads)
    rng = np.random.default_rng(seed)
    n = lambda *shape, scale=1.0: rng.normal(size=shape) * scale
    return {
        "X": n(s, h), "A": n(h, ffn, scale=h**-0.5), "B": n(ffn, h, scale=ffn**-0.5),
        "Wq": n(h, h, scale=h**-0.5), "Wk": n(h, h, scale=h**-0.5), "Wv": n(h, h, scale=h**-0.5),
        "Wo": n(h, h, scale=h**-0.5), "dZ": n(s, h), "heads": heads,
    }
