"""A mixture-of-experts layer in numpy, forward and backward by hand (12.4.1's fourth dimension, 12.4.2).

The single-process reference that :mod:`helpers.expert_parallel` (the same layer spread over
ranks with all-to-all) is checked against. For tokens ``x`` of shape (T, h) and E experts:

* **router**: DeepSeek-V3's gate (technical report, Section 2.1.2, eqs. 12-13): affinities
  ``s = sigmoid(x W_r)`` with ``W_r`` (h, E); each token takes the ``top_k`` experts of highest
  affinity (slot 0 the highest) and weights them by their affinities divided by the sum of the
  chosen ones (the weights add to 1). Switch Transformer and GShard use a softmax instead; expert
  parallelism moves the tokens the same way whichever gate chose them.
* **capacity**: the tokens are cut into ``groups`` equal contiguous groups (under expert
  parallelism a group is one rank's tokens, so each rank drops before it sends). Within a group
  expert e accepts at most C = :func:`helpers.costs.expert_capacity` (T/groups, E, k, cf) copies,
  first come first served in **slot-major order**: every token's first choice in token order,
  then every token's second choice, and so on (GShard's order: a token loses its lower choices
  first). A dropped copy contributes nothing and the kept weights are not renormalised (the
  residual connection around the layer, not modelled here, carries a dropped token on).
  ``capacity_factor=None``: no limit, nothing dropped (DeepSeek-V3 drops no tokens, Section 2.1.2).
* **experts**: SwiGLU MLPs, ``E_e(x) = (silu(x W1_e) * (x W3_e)) W2_e``, ``W1, W3`` (h, f) and
  ``W2`` (f, h), stored stacked as (E, h, f) and (E, f, h): three matrices, as DeepSeek-V3's.
* **combine**: ``y_t = sum over kept choices j of g_tj E_{e_tj}(x_t)``. (No shared expert: it is
  dense and needs no routing.)

The backward pass (:func:`moe_backward`, derived in its docstring) is checked against finite
differences and torch autograd in ``tests/test_moe.py``. Routing statistics for the sections'
plots: tokens per expert and per rank (:func:`expert_load`), the R x R token copies each rank
sends each other rank under expert parallelism (:func:`dispatch_counts`, what the dispatch
all-to-all carries), dropped fraction against the capacity factor (:func:`capacity_sweep`).
"""
from __future__ import annotations

import numpy as np

from . import costs
from .validate import equal_parts, integer_at_least, positive_number

# ---- constraints and data ------------------------------------------------------------------------

def check_layout(experts: int, top_k: int, ranks: int = 1, capacity_factor=None) -> int:
    """Experts per rank; ValueError unless 1 <= top_k <= experts, the ranks divide the experts and
    the capacity factor is None or > 0."""
    experts = integer_at_least(experts, "the number of experts E")
    top_k = integer_at_least(top_k, "top_k")
    if top_k > experts:
        raise ValueError(f"top_k ({top_k}) must be <= the number of experts ({experts}): a token picks distinct experts")
    if capacity_factor is not None:
        positive_number(capacity_factor, "capacity_factor")
    parts = equal_parts(experts, integer_at_least(ranks, "the number of ranks"),
                        "the {n} experts must be divisible by the {k} expert-parallel ranks ({n} % {k} = {r})")
    return len(parts[0])


def token_groups(tokens: int, groups: int) -> list[range]:
    """The capacity groups: ``tokens`` cut into ``groups`` equal contiguous groups (one per rank)."""
    return equal_parts(tokens, integer_at_least(groups, "groups"),
                       "the {n} tokens must be divisible by the {k} groups (ranks) ({n} % {k} = {r})")


def init_params(h: int, f: int, experts: int, seed: int = 0) -> dict:
    """Router (h, E) and stacked SwiGLU weights w1, w3 (E, h, f), w2 (E, f, h), float64, scaled 1/sqrt(fan-in)."""
    h, f, experts = integer_at_least(h, "h"), integer_at_least(f, "f"), integer_at_least(experts, "experts")
    rng = np.random.default_rng(seed)
    return {"router": rng.standard_normal((h, experts)) / np.sqrt(h),
            "w1": rng.standard_normal((experts, h, f)) / np.sqrt(h),
            "w3": rng.standard_normal((experts, h, f)) / np.sqrt(h),
            "w2": rng.standard_normal((experts, f, h)) / np.sqrt(f)}


def problem(tokens: int, h: int, f: int, experts: int, seed: int = 0, skew: float = 0.0) -> dict:
    """Parameters, tokens ``x`` (T, h) and an output gradient ``dy`` (T, h) for the loss sum(y * dy).

    ``skew`` adds ``skew`` times one fixed unit vector to every token: the router then favours
    the experts whose column points that way, the load imbalance of a real batch (0: even routing
    up to chance).
    """
    p = init_params(h, f, experts, seed)
    rng = np.random.default_rng(seed + 1)
    u = rng.standard_normal(h)
    x = rng.standard_normal((integer_at_least(tokens, "tokens"), h)) + float(skew) * u / np.linalg.norm(u)
    return {**p, "x": x, "dy": rng.standard_normal((tokens, h))}


# ---- the pieces --------------------------------------------------------------------------------------

def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def route(x: np.ndarray, router: np.ndarray, top_k: int) -> dict:
    """Affinities ``scores`` (T, E), chosen experts ``idx`` (T, k) by decreasing affinity and gate weights ``gates`` (T, k)."""
    scores = sigmoid(x @ router)
    check_layout(scores.shape[1], top_k)
    idx = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
    chosen = np.take_along_axis(scores, idx, axis=1)
    return {"scores": scores, "idx": idx, "gates": chosen / chosen.sum(axis=1, keepdims=True)}


def keep_mask(idx: np.ndarray, experts: int, capacity: int, groups: int = 1) -> np.ndarray:
    """(T, k) booleans: which routed copies their expert accepts (slot-major, token order, per group)."""
    T, k = idx.shape
    keep = np.zeros((T, k), dtype=bool)
    for part in token_groups(T, groups):
        used = np.zeros(experts, dtype=int)
        for j in range(k):  # every token's j-th choice before anyone's (j+1)-th
            for t in part:
                e = idx[t, j]
                if used[e] < capacity:
                    keep[t, j] = True
                    used[e] += 1
    return keep


def silu(z):
    return z * sigmoid(z)


def swiglu(x, w1, w3, w2):
    """One expert: (silu(x w1) * (x w3)) w2, and what its backward needs."""
    a, b = x @ w1, x @ w3
    m = silu(a) * b
    return m @ w2, (x, a, b, m, w1, w3, w2)


def swiglu_backward(dy, cache):
    """dx, dw1, dw3, dw2 of :func:`swiglu`; silu'(a) = sigmoid(a) (1 + a (1 - sigmoid(a)))."""
    x, a, b, m, w1, w3, w2 = cache
    dm = dy @ w2.T
    sa = sigmoid(a)
    da = dm * b * sa * (1 + a * (1 - sa))
    db = dm * silu(a)
    return da @ w1.T + db @ w3.T, x.T @ da, x.T @ db, m.T @ dy


# ---- the layer -----------------------------------------------------------------------------------

def moe_forward(x: np.ndarray, params: dict, top_k: int, capacity_factor=None, groups: int = 1):
    """The layer's output y (T, h) and a cache for :func:`moe_backward` (it holds the routing:
    ``idx``, ``gates``, ``keep``, ``capacity``)."""
    x = np.asarray(x, dtype=float)
    E = params["router"].shape[1]
    check_layout(E, top_k, 1, capacity_factor)
    parts = token_groups(x.shape[0], groups)
    r = route(x, params["router"], top_k)
    capacity = costs.expert_capacity(len(parts[0]), E, top_k, capacity_factor)
    keep = keep_mask(r["idx"], E, capacity, groups)
    y = np.zeros_like(x)
    per_expert = {}
    for e in range(E):
        t, j = np.nonzero((r["idx"] == e) & keep)  # an expert appears at most once per token: t has no repeats
        if len(t):
            out, c = swiglu(x[t], params["w1"][e], params["w3"][e], params["w2"][e])
            y[t] += r["gates"][t, j][:, None] * out
            per_expert[e] = (t, j, out, c)
    return y, {**r, "x": x, "keep": keep, "capacity": capacity, "per_expert": per_expert, "params": params}


def moe_backward(dy: np.ndarray, cache: dict) -> dict:
    """Gradients of sum(y * dy) for x, the router and the experts' w1, w3, w2.

    With o = E_e(x_t) for a kept choice (t, j) of expert e: dg_tj = dy_t . o, and the expert sees
    g_tj dy_t. The gate g_j = s_j / S (S the sum of the chosen affinities) gives
    dL/ds_j = (dg_j - sum_i g_i dg_i) / S for the chosen j (0 for the others: top-k selection is
    piecewise constant), then dL/dlogit = dL/ds s (1 - s), dx += dlogit W_r^T, dW_r = x^T dlogit.
    """
    P, x, idx, gates, s = cache["params"], cache["x"], cache["idx"], cache["gates"], cache["scores"]
    dx = np.zeros_like(x)
    grads = {k: np.zeros_like(P[k]) for k in ("w1", "w3", "w2")}
    dgates = np.zeros_like(gates)
    for e, (t, j, out, c) in cache["per_expert"].items():
        dgates[t, j] = np.sum(dy[t] * out, axis=1)
        dxe, grads["w1"][e], grads["w3"][e], grads["w2"][e] = swiglu_backward(gates[t, j][:, None] * dy[t], c)
        dx[t] += dxe
    chosen = np.take_along_axis(s, idx, axis=1)
    dchosen = (dgates - np.sum(gates * dgates, axis=1, keepdims=True)) / chosen.sum(axis=1, keepdims=True)
    ds = np.zeros_like(s)
    np.put_along_axis(ds, idx, dchosen, axis=1)
    dlogits = ds * s * (1 - s)
    dx += dlogits @ P["router"].T
    return {"x": dx, "router": x.T @ dlogits, **grads}


def reference(tokens: int, h: int, f: int, experts: int, top_k: int, capacity_factor=None, seed: int = 0,
              skew: float = 0.0, ranks: int = 1) -> dict:
    """Forward and backward of the layer on :func:`problem` ``(tokens x ranks)`` tokens, one capacity
    group per rank: what expert parallelism on ``ranks`` ranks with ``tokens`` tokens each must return."""
    P = problem(integer_at_least(tokens, "tokens") * integer_at_least(ranks, "ranks"), h, f, experts, seed, skew)
    y, cache = moe_forward(P["x"], P, top_k, capacity_factor, groups=ranks)
    return {"y": y, "grads": moe_backward(P["dy"], cache), "idx": cache["idx"], "keep": cache["keep"],
            "capacity": cache["capacity"], "problem": P}


# ---- routing statistics --------------------------------------------------------------------------

def expert_load(idx: np.ndarray, keep: np.ndarray, experts: int) -> dict:
    """Token copies per expert: routed there (``routed``) and accepted (``kept``), each (E,)."""
    return {"routed": np.bincount(idx.ravel(), minlength=experts),
            "kept": np.bincount(idx[keep], minlength=experts)}


def rank_load(load: np.ndarray, ranks: int) -> np.ndarray:
    """Per-expert counts summed over each rank's E/R consecutive experts: (R,)."""
    load = np.asarray(load)
    check_layout(len(load), 1, ranks)
    return load.reshape(ranks, -1).sum(axis=1)


def dispatch_counts(idx: np.ndarray, keep: np.ndarray, experts: int, ranks: int) -> np.ndarray:
    """(R, R) integers: token copies that token group (rank) r sends to rank q in the dispatch
    all-to-all (the diagonal stays on its rank). Rank q holds experts q E/R .. (q+1) E/R - 1."""
    per = check_layout(experts, 1, ranks)
    out = np.zeros((ranks, ranks), dtype=int)
    for r, part in enumerate(token_groups(idx.shape[0], ranks)):
        dest = idx[part.start:part.stop][keep[part.start:part.stop]] // per
        out[r] = np.bincount(dest, minlength=ranks)
    return out


def dropped_fraction(keep: np.ndarray) -> float:
    """The share of routed token copies that were dropped."""
    return float(1.0 - np.mean(keep))


def capacity_sweep(x: np.ndarray, router: np.ndarray, top_k: int, factors, groups: int = 1) -> list[float]:
    """Dropped fraction for each capacity factor in ``factors`` (routing computed once)."""
    r = route(np.asarray(x, dtype=float), router, top_k)
    E, T = router.shape[1], len(x)
    size = len(token_groups(T, groups)[0])
    return [dropped_fraction(keep_mask(r["idx"], E, costs.expert_capacity(size, E, top_k, cf), groups)) for cf in factors]
