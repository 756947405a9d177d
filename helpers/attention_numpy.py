"""Softmax attention and its online-softmax merge, in numpy (P.10, 12.3.2).

Ring attention (12.3.2) and the ring exchange of P.10 rest on one fact: the softmax over all keys
can be computed block by block, keeping three running statistics per query row,

* ``m``: the largest score seen so far,
* ``l``: the sum of ``exp(score - m)`` over the keys seen so far (so ``m + log l`` is the
  log-sum-exp of the scores),
* ``o``: the sum of ``exp(score - m) * value`` over the keys seen so far (unnormalised output),

and two such partial results merge exactly (in real arithmetic) with

    m = max(m_a, m_b),  l = e^(m_a - m) l_a + e^(m_b - m) l_b,  o = e^(m_a - m) o_a + e^(m_b - m) o_b,

the attention output being ``o / l``. In floating point a single merge is commutative bit for bit,
but a chain of merges is not associative: the order of the blocks changes the last bits. This
module computes both and measures the difference in units in the last place (ULPs).

Shapes: ``q`` is ``(..., n_q, d)``, ``k`` is ``(..., n_k, d)``, ``v`` is ``(..., n_k, d_v)``;
leading dimensions (heads, batch) broadcast. A ``mask`` is boolean ``(n_q, n_k)`` (or
broadcastable), True where a query may attend to a key.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .validate import equal_parts, index_below, integer_at_least


def _check_qkv(q, k, v):
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError("q, k, v must have at least 2 dimensions (tokens, features)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature size d: got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must hold the same number of tokens: got {k.shape[-2]} and {v.shape[-2]}")
    if not (np.issubdtype(q.dtype, np.floating) and q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must be floating point arrays of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return q, k, v


def scores(q, k, scale=None):
    """``q k^T * scale`` with ``scale = 1/sqrt(d)`` by default (12.3.2, ring step 2)."""
    q, k, _ = _check_qkv(q, k, k)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    return (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(scale)


def causal_mask(n_q: int, n_k: int | None = None, q_pos=None, k_pos=None) -> np.ndarray:
    """True where query position >= key position (a query sees itself and the past)."""
    n_k = n_q if n_k is None else n_k
    q_pos = np.arange(n_q) if q_pos is None else np.asarray(q_pos)
    k_pos = np.arange(n_k) if k_pos is None else np.asarray(k_pos)
    return q_pos[:, None] >= k_pos[None, :]


def attention(q, k, v, mask=None, scale=None):
    """Full softmax attention on one process: returns ``(out, lse)``.

    ``out = softmax(q k^T * scale) v`` with masked scores excluded; ``lse`` is the log-sum-exp of
    each query row's scores (``-inf`` for a row with no visible key, whose output is 0).
    """
    q, k, v = _check_qkv(q, k, v)
    s = scores(q, k, scale)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m_safe)
    l = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(l > 0, (e @ v) / np.where(l > 0, l, 1), 0).astype(q.dtype)
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(l[..., 0]), -np.inf).astype(q.dtype)
    return out, lse


@dataclass
class Partial:
    """The running statistics of the online softmax for a set of query rows (12.3.2).

    ``m``: running max score, shape ``(..., n_q)``; ``l``: running sum of ``exp(s - m)``;
    ``o``: running unnormalised output ``sum exp(s - m) v``, shape ``(..., n_q, d_v)``.
    """

    m: np.ndarray
    l: np.ndarray
    o: np.ndarray

    def output(self) -> np.ndarray:
        """The attention output ``o / l`` (0 for rows that have seen no visible key)."""
        l = self.l[..., None]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(l > 0, self.o / np.where(l > 0, l, 1), 0).astype(self.o.dtype)

    def lse(self) -> np.ndarray:
        """Log-sum-exp of all scores seen: ``m + log l``."""
        with np.errstate(divide="ignore"):
            return np.where(self.l > 0, self.m + np.log(np.where(self.l > 0, self.l, 1)), -np.inf).astype(self.l.dtype)


def block_partial(q, k_blk, v_blk, mask=None, scale=None) -> Partial:
    """The statistics ``(m, l, o)`` of one key/value block, as a device computes them on arrival."""
    q, k_blk, v_blk = _check_qkv(q, k_blk, v_blk)
    s = scores(q, k_blk, scale)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1)
    e = np.exp(s - np.where(np.isfinite(m), m, 0)[..., None])
    return Partial(m=m, l=e.sum(axis=-1), o=e @ v_blk)


def merge(a: Partial, b: Partial) -> Partial:
    """Merge two partial results over disjoint key sets: exact in real arithmetic (12.3.2).

    ``m = max(m_a, m_b)``, each side rescaled by ``exp(m_side - m)`` before adding. Rows where
    both sides saw no visible key (``m = -inf``) stay empty.
    """
    if a.m.shape != b.m.shape or a.o.shape != b.o.shape:
        raise ValueError(f"partials must cover the same query rows: shapes {a.o.shape} and {b.o.shape}")
    m = np.maximum(a.m, b.m)
    m_safe = np.where(np.isfinite(m), m, 0)
    wa = np.where(np.isfinite(a.m), np.exp(a.m - m_safe), 0).astype(a.l.dtype)
    wb = np.where(np.isfinite(b.m), np.exp(b.m - m_safe), 0).astype(b.l.dtype)
    return Partial(m=m, l=wa * a.l + wb * b.l, o=wa[..., None] * a.o + wb[..., None] * b.o)


def split_blocks(n: int, n_blocks: int) -> list[np.ndarray]:
    """Key indices 0..n-1 cut into ``n_blocks`` contiguous blocks; ValueError unless it divides."""
    integer_at_least(n, "n (keys)")
    blocks = equal_parts(n, n_blocks, "{k} blocks do not divide {n} keys evenly ({n} % {k} = {r})")
    return [np.arange(b.start, b.stop) for b in blocks]


def online_attention(q, k, v, n_blocks: int, order=None, mask=None, scale=None):
    """Attention by merging ``n_blocks`` key blocks one at a time in ``order`` (a left fold).

    ``order`` is a permutation of ``range(n_blocks)`` (default: 0, 1, 2, ...). Returns
    ``(out, lse)`` like :func:`attention`.
    """
    q, k, v = _check_qkv(q, k, v)
    blocks = split_blocks(k.shape[-2], n_blocks)
    order = list(range(n_blocks)) if order is None else list(order)
    if sorted(order) != list(range(n_blocks)):
        raise ValueError(f"order must be a permutation of 0..{n_blocks - 1}, got {order}")
    acc = None
    for j in order:
        idx = blocks[j]
        mk = None if mask is None else np.broadcast_to(mask, q.shape[-2:-1] + (k.shape[-2],))[..., idx]
        part = block_partial(q, k[..., idx, :], v[..., idx, :], mk, scale)
        acc = part if acc is None else merge(acc, part)
    return acc.output(), acc.lse()


def tree_attention(q, k, v, n_blocks: int, mask=None, scale=None):
    """Attention by merging the block partials pairwise, as a balanced tree (another order)."""
    q, k, v = _check_qkv(q, k, v)
    parts = []
    for idx in split_blocks(k.shape[-2], n_blocks):
        mk = None if mask is None else np.broadcast_to(mask, q.shape[-2:-1] + (k.shape[-2],))[..., idx]
        parts.append(block_partial(q, k[..., idx, :], v[..., idx, :], mk, scale))
    while len(parts) > 1:
        nxt = [merge(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        parts = nxt + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0].output(), parts[0].lse()


def ring_order(rank: int, p: int) -> list[int]:
    """The order in which rank ``rank`` of a ring of ``p`` sees the key blocks: r, r-1, r-2, ..."""
    index_below(rank, "rank", p)
    return [(rank - j) % p for j in range(p)]


# ---- measuring the last bits ------------------------------------------------------------------

def _ordered_ints(x: np.ndarray) -> np.ndarray:
    """Map floats to integers whose difference counts representable numbers between them."""
    x = np.ascontiguousarray(x)
    itype = {np.dtype(np.float64): np.int64, np.dtype(np.float32): np.int32, np.dtype(np.float16): np.int16}.get(x.dtype)
    if itype is None:
        raise ValueError(f"ULP distance needs float16, float32 or float64 arrays, got {x.dtype}")
    i = x.view(itype).astype(np.int64)
    bits = 8 * x.dtype.itemsize
    return np.where(i < 0, -(i & ((1 << (bits - 1)) - 1)), i)


def ulp_distance(a, b) -> np.ndarray:
    """Elementwise number of representable floats between ``a`` and ``b`` (0 when bit-identical)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"arrays must share dtype and shape, got {a.dtype}{a.shape} and {b.dtype}{b.shape}")
    if np.isnan(a).any() or np.isnan(b).any():
        raise ValueError("ULP distance is undefined for NaN")
    return np.abs(_ordered_ints(a) - _ordered_ints(b))


def order_study(q, k, v, n_blocks: int, mask=None, max_orders: int = 120) -> dict:
    """Merge the blocks in every order (up to ``max_orders`` permutations) and compare the bits.

    Returns a dict: ``orders`` (how many were tried), ``distinct`` (how many bitwise-different
    outputs they produced), ``max_ulp_between_orders``, ``max_ulp_vs_direct`` (against
    :func:`attention`), ``frac_bits_differ_vs_direct`` (share of output elements not identical to
    the direct computation, over all orders) and ``max_abs_vs_direct``.
    """
    direct, _ = attention(q, k, v, mask)
    outs = []
    for order in itertools.islice(itertools.permutations(range(n_blocks)), max_orders):
        outs.append(online_attention(q, k, v, n_blocks, order, mask)[0])
    stack = np.stack(outs)
    distinct = len({o.tobytes() for o in outs})
    ulp_vs = np.stack([ulp_distance(o, direct) for o in outs])
    ulp_between = max(int(ulp_distance(o, outs[0]).max()) for o in outs)
    return {
        "orders": len(outs),
        "distinct": distinct,
        "max_ulp_between_orders": ulp_between,
        "max_ulp_vs_direct": int(ulp_vs.max()),
        "frac_bits_differ_vs_direct": float((ulp_vs > 0).mean()),
        "max_abs_vs_direct": float(np.abs(stack - direct).max()),
        "max_err_in_eps": float(np.abs(stack - direct).max() / (np.finfo(direct.dtype).eps * np.abs(v).max())),
    }


def merge_is_commutative(a: Partial, b: Partial) -> bool:
    """True when ``merge(a, b)`` and ``merge(b, a)`` are bit-identical (one merge step)."""
    x, y = merge(a, b), merge(b, a)
    return all(np.array_equal(getattr(x, f), getattr(y, f)) for f in ("m", "l", "o"))


def merge_is_associative(a: Partial, b: Partial, c: Partial) -> bool:
    """True when ``merge(merge(a, b), c)`` and ``merge(a, merge(b, c))`` are bit-identical."""
    x, y = merge(merge(a, b), c), merge(a, merge(b, c))
    return all(np.array_equal(getattr(x, f), getattr(y, f)) for f in ("m", "l", "o"))
