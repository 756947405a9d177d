"""Context parallelism on paper: which tokens each rank holds, what it computes, what it sends (P.10, 12.3.2).

Torch-free (numpy). Partitions of the sequence over ``p`` ranks (``contiguous``, ``striped``,
``zigzag``) and padding for a length that does not divide (:func:`partition_indices`,
:func:`padded_length`); the causal work each rank does, in unmasked query/key pairs and in tiles
(:func:`work_table`); and the cost models of the sections: K/V memory, ring bytes, all-gather and
all-to-all (Ulysses) bytes, attention FLOPs, one ring step's compute against its transfer
(:func:`ring_step_times`; on :mod:`helpers.costs`). The ring itself is
:mod:`helpers.ring_attention`.
"""
from __future__ import annotations

import numpy as np

from .. import costs
from ..validate import equal_parts, integer_at_least, positive_number

SCHEMES = ("contiguous", "striped", "zigzag")


# ---- partitions of the sequence -------------------------------------------------------------

def _check_sp(s: int, p: int):
    for name, x in (("s", s), ("p", p)):
        integer_at_least(x, name)


def _unit(p: int, scheme: str) -> int:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}: allowed are {SCHEMES}")
    return 2 * p if scheme == "zigzag" else p


def padded_length(s: int, p: int, scheme: str = "contiguous") -> int:
    """Smallest length >= ``s`` the scheme can split over ``p`` ranks (a multiple of p; 2p for zigzag)."""
    _check_sp(s, p)
    u = _unit(p, scheme)
    return -(-s // u) * u


def partition_indices(s: int, p: int, scheme: str = "contiguous") -> list[np.ndarray]:
    """The token positions each of ``p`` ranks holds (12.3.2).

    ``contiguous``: rank k holds ``[k s/p, (k+1) s/p)``. ``striped``: rank k holds every p-th
    token starting at k. ``zigzag``: the sequence is cut into 2p chunks and rank k holds chunks k
    and 2p-1-k (one early, one late). ValueError when ``s`` is not a multiple of p (2p for
    zigzag): pad first (:func:`padded_length`).
    """
    _check_sp(s, p)
    u = _unit(p, scheme)
    chunks = [np.arange(c.start, c.stop) for c in equal_parts(s, u, (
        f"sequence length s={{n}} is not divisible by {'2p' if scheme == 'zigzag' else 'p'}={{k}} "
        f"({scheme} partition over p={p} ranks); pad it to {padded_length(s, p, scheme)} and mask the padding"))]
    if scheme == "contiguous":
        return chunks
    if scheme == "striped":
        return [np.arange(s)[k::p].copy() for k in range(p)]
    return [np.concatenate([chunks[k], chunks[2 * p - 1 - k]]) for k in range(p)]


def allowed(q_pos, k_pos, causal: bool, valid_len: int | None = None) -> np.ndarray:
    """Boolean ``(len(q_pos), len(k_pos))``: True where the query may see the key.

    Causal: key position <= query position. Padding: keys at positions >= ``valid_len`` are hidden.
    """
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    ok = np.ones((len(q_pos), len(k_pos)), dtype=bool)
    if causal:
        ok &= q_pos[:, None] >= k_pos[None, :]
    if valid_len is not None:
        ok &= (k_pos < valid_len)[None, :]
    return ok


def tile_ok(ok: np.ndarray, tile: int):
    n_q, n_k = ok.shape
    if tile < 1 or n_q % tile or n_k % tile:
        raise ValueError(f"tile={tile} must be >= 1 and divide the local shard length {n_q}")
    t = ok.reshape(n_q // tile, tile, n_k // tile, tile)
    return t.any(axis=(1, 3)), t.all(axis=(1, 3))


def work_table(s: int, p: int, scheme: str, causal: bool = True, tile: int | None = None, valid_len=None) -> dict:
    """The attention work of every rank at every ring step, from the masks alone (12.3.2).

    Returns ``pairs[r, j]`` (unmasked query/key pairs rank r scores at step j, when it holds the
    K/V block of rank ``(r - j) mod p``) and ``tiles[r, j]`` (tile x tile blocks it computes when
    it skips tiles that are fully masked; ``tile`` defaults to the whole local shard). The kernel
    in this module computes exactly ``tiles`` tiles (checked in the tests).
    """
    parts = partition_indices(s, p, scheme)
    n = s // p
    tile = n if tile is None else tile
    pairs = np.zeros((p, p), dtype=np.int64)
    tiles = np.zeros((p, p), dtype=np.int64)
    for r in range(p):
        for j in range(p):
            ok = allowed(parts[r], parts[(r - j) % p], causal, valid_len)
            pairs[r, j] = ok.sum()
            tiles[r, j] = tile_ok(ok, tile)[0].sum()
    return {"pairs": pairs, "tiles": tiles, "tile": tile, "tile_pairs": tile * tile}


# ---- cost models (P.10, 12.3.2) ---------------------------------------------------------------

def _nonneg(**kw):
    for k, x in kw.items():
        positive_number(x, k, allow_zero=True)


def score_matrix_bytes(n: int, bytes_per: int = 2, heads: int = 1, layers: int = 1) -> int:
    """Bytes to materialise the n x n score matrix (P.10: one head, one layer, 16-bit)."""
    _nonneg(n=n, bytes_per=bytes_per, heads=heads, layers=layers)
    return n * n * bytes_per * heads * layers


def kv_bytes(s: int, hidden: int, bytes_per: int = 2, layers: int = 1, batch: int = 1, p: int = 1, t: int = 1) -> float:
    """Bytes of K and V for ``s`` tokens of width ``hidden`` (12.3.2): ``2 s h bytes``.

    Divided by the context-parallel degree ``p`` (each rank holds s/p tokens) and the
    tensor-parallel degree ``t`` (each rank holds hidden/t of the heads).
    """
    _nonneg(s=s, hidden=hidden, bytes_per=bytes_per, layers=layers, batch=batch)
    _check_sp(1, p), _check_sp(1, t)
    return 2 * s * hidden * bytes_per * layers * batch / (p * t)


def ring_bytes_per_rank(s: int, p: int, n_heads: int, d_head: int, bytes_per: int = 2, batch: int = 1) -> float:
    """Forward-pass bytes one rank sends per layer in ring attention (12.3.2).

    ``p - 1`` steps, each sending a K and a V block of ``s/p x n_heads x d_head`` elements:
    ``2 (p-1) (s/p) n_heads d_head bytes``.
    """
    _check_sp(s, p)
    _nonneg(n_heads=n_heads, d_head=d_head, bytes_per=bytes_per, batch=batch)
    return costs.ring_steps("all_gather", p) * (2 * (s / p) * n_heads * d_head * bytes_per * batch)


def ring_backward_bytes_per_rank(s: int, p: int, n_heads: int, d_head: int, bytes_per: int = 2, grad_bytes_per: int | None = None) -> float:
    """Backward-pass bytes one rank sends per layer: K/V again (p-1 steps) plus dK/dV (p steps home).

    ``grad_bytes_per`` is the accumulator's element size (4 for float32 accumulators of 16-bit K/V).
    One rank (p = 1) sends nothing.
    """
    g = bytes_per if grad_bytes_per is None else grad_bytes_per
    hops = p if p > 1 else 0
    return ring_bytes_per_rank(s, p, n_heads, d_head, bytes_per) + hops * 2 * (s / p) * n_heads * d_head * g


def allgather_kv_bytes_per_rank(s: int, p: int, n_heads: int, d_head: int, bytes_per: int = 2) -> float:
    """Bytes one rank sends to all-gather K and V with a ring all-gather: ``(p-1)/p`` of the full pair."""
    _check_sp(s, p)
    return costs.ring_bytes_sent("all_gather", 2 * s * n_heads * d_head * bytes_per, p)


def ulysses_bytes_per_rank(s: int, p: int, n_heads: int, d_head: int, bytes_per: int = 2) -> float:
    """Bytes one rank sends in Ulysses-style attention: all-to-all of Q, K, V in, of the output back.

    Each all-to-all keeps 1/p of a rank's ``s/p x n_heads x d_head`` block and sends the rest:
    ``4 (p-1)/p (s/p) n_heads d_head bytes``. Needs ``p`` to divide ``n_heads``.
    """
    _check_sp(s, p)
    if n_heads % p:
        raise ValueError(f"all-to-all over heads needs p={p} to divide n_heads={n_heads}")
    return 4 * costs.ring_bytes_sent("all_to_all", (s / p) * n_heads * d_head * bytes_per, p)


def attention_flops(s_q: int, s_k: int, n_heads: int, d_head: int, causal: bool = False) -> float:
    """Forward FLOPs of attention: ``q k^T`` and ``P v``, 2 FLOPs per multiply-add each (halved if causal)."""
    _nonneg(s_q=s_q, s_k=s_k, n_heads=n_heads, d_head=d_head)
    return float(costs.attention_flops(s_q, s_k, n_heads * d_head, causal))


def ring_step_times(s: int, p: int, n_heads: int, d_head: int, flops_per_s: float, link_bytes_per_s: float,
                    kv_heads: int | None = None, causal: bool = False, bytes_per: int = 2) -> dict:
    """One ring step of one rank (12.3.2): attention compute of its s/p queries over one block of
    s/p keys (:func:`attention_flops`, half when causal: the balanced average) and the transfer of
    one K/V block of ``kv_heads`` heads (:func:`ring_bytes_per_rank` / (p-1)), in seconds.

    ``hidden`` is True when compute is at least the transfer (the overlapped ring then costs
    only its compute); the break-even is :func:`helpers.costs.ring_overlap_tokens` tokens per rank.
    """
    integer_at_least(p, "p")
    if p < 2:
        raise ValueError(f"a ring needs p >= 2 ranks, got p={p}")
    kv = n_heads if kv_heads is None else kv_heads
    if n_heads % kv:
        raise ValueError(f"kv_heads={kv} must divide n_heads={n_heads}")
    positive_number(flops_per_s, "flops_per_s")
    positive_number(link_bytes_per_s, "link_bytes_per_s")
    compute = attention_flops(s // p, s // p, n_heads, d_head, causal) / flops_per_s
    transfer = ring_bytes_per_rank(s, p, kv, d_head, bytes_per) / costs.ring_steps("all_gather", p) / link_bytes_per_s
    return {"compute_s": compute, "transfer_s": transfer, "hidden": compute >= transfer}
