"""The chapters' closed-form costs, each written once (torch-free: plain Python, no torch, no numpy).

Every module that needs one of these formulas calls it from here; a module may keep a wrapper
that says what the payload or the shape is in its section's words (e.g.
:func:`helpers.tensor_parallel.allreduce_bytes_per_device`), but not the formula.

* **Collectives on a ring** of N ranks, payload S bytes (P.7; what :mod:`helpers.launcher.commlog` puts
  beside every recorded call): all-reduce sends 2(N-1)/N x S per rank in 2(N-1) steps;
  all-gather, reduce-scatter and all-to-all send (N-1)/N x S in N-1 steps; a send sends S in one
  step. The alpha-beta time is steps x alpha + bytes sent / beta (:func:`alpha_beta_time`); a
  two-level all-reduce over servers adds an intra-server reduce-scatter and all-gather around an
  inter-server all-reduce of 1/per_node of the payload (:func:`hierarchical_all_reduce_time`).
* **Activation memory** of one transformer layer (Korthikanti et al. 2022, 12.3.1): 16-bit
  activations and 1-byte dropout masks, s b h (34 + 5 a s / h) on one device, with the
  tensor-parallel and sequence-parallel variants, with or without the s x s scores and the
  dropout masks (:func:`activation_bytes_per_layer`); full recomputation keeps each layer's
  input (:func:`layer_input_bytes`).
* **Activation recomputation** (Korthikanti et al. 2022, 12.3.1, 12.4.1), per layer, by policy
  (:data:`RECOMPUTE_POLICIES`): what a layer keeps for backward (:func:`recompute_kept_bytes`:
  everything; everything but the 5as/h attention-core term, "selective"; only the input, "full"),
  what its backward re-materialises (:func:`recompute_rematerialised_bytes`) and the forward FLOPs
  it repeats (:func:`recompute_forward_flops`: 0; the attention core's two products; the layer).
* **Parameters and FLOPs** of a transformer layer (P.8, 12.2.1, 12.2.2, 12.4.1): attention
  2 h (heads x d) + 2 h (kv_heads x d) weights (4h^2 for plain multi-head attention), an MLP of
  2 or 3 matrices of h x ffn; forward FLOPs 2 per weight per token plus attention's
  4 x tokens x seq x width; training FLOPs per token 6 N + 12 L s (heads x d) (PaLM, appendix B).
* **Mixture-of-experts routing** (12.4.1, 12.4.2): an expert's capacity ceil(cf x tokens x k / E);
  the dispatch (and combine) all-to-all of expert parallelism carries tokens x k x h x bytes per
  rank, of which the copies for other ranks' experts, (EP-1)/EP under even routing, leave it.
* **Bytes per parameter** of model state by precision recipe and optimizer (12.1.1, 12.1.2).

Sizes in bytes, times in seconds, bandwidths in bytes per second.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .validate import integer_at_least, one_of, positive_number, probability

# ---- collectives on a ring (P.7) ---------------------------------------------------------------

HALF_RING_OPS = ("all_gather", "reduce_scatter", "all_to_all")


def ring_steps(op: str, n: int) -> int:
    """Latency-bound steps of ``op`` on a ring of ``n`` ranks: 2(n-1) for all-reduce, n-1 for
    all-gather, reduce-scatter and all-to-all, 1 for a send (each step pays alpha once)."""
    n = integer_at_least(n, "the group size N")
    if op == "all_reduce":
        return 2 * (n - 1)
    if op in HALF_RING_OPS:
        return n - 1
    if op == "send":
        return 1
    raise ValueError(f"no ring model of the steps of {op!r}: op must be 'all_reduce', 'send' or one of {HALF_RING_OPS}")


def ring_bytes_sent(op: str, payload_bytes: float, group_size: int) -> float:
    """Bytes one rank sends for a collective of ``payload_bytes`` on a ring of ``group_size``.

    P.7: a ring all-reduce sends 2(N-1)/N*S per rank, reduce-scatter and all-gather each half of
    that (all-to-all too: each rank keeps 1/N of its buffer and sends the rest); a send sends S.
    Ops without a single standard cost (broadcast, reduce, gather, scatter) are counted as S, the
    bytes the root's tree or pipeline must push at least once; recv and barrier send nothing.
    """
    n = integer_at_least(group_size, "the group size N")
    positive_number(payload_bytes, "payload_bytes", allow_zero=True)
    if op == "all_reduce":
        return 2 * (n - 1) / n * payload_bytes
    if op in HALF_RING_OPS:
        return (n - 1) / n * payload_bytes
    if op in ("recv", "barrier"):
        return 0.0
    if op == "send":
        return float(payload_bytes)
    return float(payload_bytes) if n > 1 else 0.0


def allreduce_bytes(n: int, size_bytes: float) -> float:
    """Bytes each of ``n`` ranks sends in a ring all-reduce of ``size_bytes``: 2(N-1)/N x S."""
    return ring_bytes_sent("all_reduce", size_bytes, n)


def alpha_beta_time(n: int, size_bytes, alpha: float, beta: float, op: str = "all_reduce"):
    """The alpha-beta time of ``op`` on a ring of ``n`` ranks: steps x alpha + bytes sent / beta (P.7).

    All-reduce: T = 2(N-1) alpha + 2(N-1)/N x S / beta; all-gather, reduce-scatter, all-to-all:
    (N-1) alpha + (N-1)/N x S / beta; a send: alpha + S / beta. alpha in seconds per step, beta
    in bytes per second per link. ``size_bytes`` may be a number or a numpy array (for curves).
    """
    positive_number(alpha, "alpha (seconds per step)", allow_zero=True)
    positive_number(beta, "beta (bytes/s per link)")
    return ring_steps(op, n) * alpha + ring_bytes_sent(op, 1.0, n) * size_bytes / beta


def hierarchical_all_reduce_time(per_node: int, nodes: int, size_bytes, alpha_intra: float, beta_intra: float,
                                 alpha_inter: float, beta_inter: float):
    """Two-level all-reduce of ``size_bytes`` over ``nodes`` servers of ``per_node`` ranks (12.2.1, 12.2.2).

    Reduce-scatter inside each server (ring of ``per_node`` on the fast links), all-reduce of each
    rank's 1/per_node slice with its peers in the other servers (ring of ``nodes``, every rank on
    its own inter-server link, all in parallel), all-gather inside the server: the sum of the three
    :func:`alpha_beta_time` terms. Across the servers each rank sends 2 (nodes-1)/nodes x S / per_node.
    """
    per_node = integer_at_least(per_node, "per_node (ranks per server)")
    nodes = integer_at_least(nodes, "nodes (servers)")
    inside = 0.0 if per_node == 1 else (alpha_beta_time(per_node, size_bytes, alpha_intra, beta_intra, "reduce_scatter")
                                        + alpha_beta_time(per_node, size_bytes, alpha_intra, beta_intra, "all_gather"))
    across = 0.0 if nodes == 1 else alpha_beta_time(nodes, size_bytes / per_node, alpha_inter, beta_inter)
    return inside + across


# ---- mixture-of-experts routing (12.4.1, 12.4.2) -------------------------------------------------

def expert_capacity(tokens: int, experts: int, top_k: int, capacity_factor=None) -> int:
    """Token copies one expert accepts from a group of ``tokens`` tokens: ceil(cf x tokens x top_k / experts).

    ``tokens x top_k / experts`` is the expert's share under perfectly even routing; the capacity
    factor cf > 0 scales it (GShard, Switch Transformer). ``capacity_factor=None`` means no limit:
    ``tokens`` (an expert appears at most once among a token's top-k), so nothing is dropped.
    """
    tokens = integer_at_least(tokens, "tokens", 0)
    experts = integer_at_least(experts, "the number of experts")
    top_k = integer_at_least(top_k, "top_k")
    if top_k > experts:
        raise ValueError(f"top_k ({top_k}) must be <= the number of experts ({experts})")
    if capacity_factor is None:
        return tokens
    cf = positive_number(capacity_factor, "capacity_factor")
    return math.ceil(round(cf * tokens * top_k / experts, 9))  # round: 1.1 x 40 / 4 is 11, not 11.000000000000002


def moe_dispatch_bytes(tokens: int, top_k: int, hidden: int, bytes_per_value: float = 2) -> float:
    """Payload of one dispatch all-to-all on one rank: every routed copy of a token's hidden vector,
    tokens x top_k x hidden x bytes (the combine returns as many; the local experts' share included)."""
    positive_number(bytes_per_value, "bytes_per_value")
    return integer_at_least(tokens, "tokens", 0) * integer_at_least(top_k, "top_k") * integer_at_least(hidden, "hidden") * bytes_per_value


def moe_all_to_all_sent(tokens: int, top_k: int, hidden: int, ep: int, bytes_per_value: float = 2, remote_share=None) -> float:
    """Bytes one rank sends in one dispatch (or combine) all-to-all of expert parallelism over ``ep`` ranks:
    tokens x top_k x hidden x bytes x the share of the copies routed to experts on other ranks.

    The share defaults to (ep-1)/ep, even routing over experts spread evenly over the ranks (the
    all-to-all's ring cost, :func:`ring_bytes_sent`); pass the measured share otherwise.
    """
    payload = moe_dispatch_bytes(tokens, top_k, hidden, bytes_per_value)
    if remote_share is None:
        return ring_bytes_sent("all_to_all", payload, ep)
    integer_at_least(ep, "the expert-parallel degree ep")
    return payload * probability(remote_share, "remote_share")


# ---- communication hidden under computation (P.6, 12.1.2, 12.4.1) -------------------------------

def exposed_comm(comm_s: float, window_s: float) -> float:
    """Seconds of a communication of ``comm_s`` that no computation hides, when ``window_s`` seconds
    of independent computation can run beside it: max(0, comm - window) (P.6: 70 ms with 60 ms of
    backward to hide under leaves 10 ms exposed)."""
    comm_s = positive_number(comm_s, "comm_s", allow_zero=True)
    return max(0.0, comm_s - positive_number(window_s, "window_s", allow_zero=True))


def step_time(compute_s: float, comm_s: float, window_s: float = 0.0) -> float:
    """A step of ``compute_s`` of computation and ``comm_s`` of communication, of which
    ``window_s`` seconds of computation can run beside the communication (P.6):
    compute + :func:`exposed_comm`. ``window_s = 0`` gives compute + comm (no overlap, the book's
    400 + 70 = 470 ms); ``window_s = compute_s`` gives max(compute, comm) (perfect overlap). The
    window is part of the compute, so it cannot exceed it (ValueError)."""
    compute_s = positive_number(compute_s, "compute_s", allow_zero=True)
    if positive_number(window_s, "window_s", allow_zero=True) > compute_s:
        raise ValueError(f"the overlap window ({window_s} s) is part of the compute and cannot exceed it ({compute_s} s)")
    return compute_s + exposed_comm(comm_s, window_s)


def bucketed_finish(ready_s, comm_s) -> float:
    """When the last of a sequence of bucket all-reduces ends (P.6): bucket i can start once its
    last gradient is ready (``ready_s[i]``) and the previous bucket's all-reduce has ended (one
    link), and takes ``comm_s[i]``: f_i = max(ready_i, f_(i-1)) + comm_i. The exposed
    communication of a backward pass that ends at ``end`` is max(0, f_last - end)."""
    ready, comm = list(ready_s), list(comm_s)
    if not ready or len(ready) != len(comm):
        raise ValueError(f"ready_s and comm_s must be non-empty and of equal length, got {len(ready)} and {len(comm)}")
    finish = 0.0
    for r, c in zip(ready, comm):
        finish = max(positive_number(r, "a ready time", allow_zero=True), finish) + positive_number(c, "a bucket's comm time", allow_zero=True)
    return finish


def linear_scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """The linear scaling rule (Goyal et al. 2017; P.6): when the batch grows k-fold, multiply the
    learning rate by k, so that one step on a k times larger batch moves the weights about as far
    as k steps did: base_lr x batch / base_batch."""
    base_lr = positive_number(base_lr, "base_lr")
    return base_lr * integer_at_least(batch, "batch") / integer_at_least(base_batch, "base_batch")


def bucket_assignment(sizes_bytes, cap_bytes: int, first_cap_bytes: int | None = None) -> list[list[int]]:
    """Which gradients share a bucket (P.6; PyTorch DDP's rule): take the gradients in the order
    they become ready in backward (``sizes_bytes`` in that order), add each to the open bucket,
    and close the bucket as soon as it holds >= its cap; the first bucket's cap is
    ``first_cap_bytes`` (default: the same cap), the last bucket takes what is left. Returns the
    buckets as lists of positions into ``sizes_bytes``; the number of all-reduces per step is
    their number."""
    cap = integer_at_least(cap_bytes, "cap_bytes (the bucket size in bytes)")
    limit = cap if first_cap_bytes is None else integer_at_least(first_cap_bytes, "first_cap_bytes")
    buckets, current, held = [], [], 0
    for i, s in enumerate(sizes_bytes):
        current.append(i)
        held += integer_at_least(s, "a gradient's size in bytes")
        if held >= limit:
            buckets.append(current)
            current, held, limit = [], 0, cap
    if current:
        buckets.append(current)
    if not buckets:
        raise ValueError("sizes_bytes must list at least one gradient")
    return buckets


# ---- activation memory per layer (Korthikanti et al. 2022; 12.3.1) ------------------------------

def _shape(s, b, h):
    return integer_at_least(s, "s"), integer_at_least(b, "b"), integer_at_least(h, "h")


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                               attention_scores: bool = True, dropout: bool = True) -> float:
    """Korthikanti et al. 2022: activation bytes one transformer layer keeps for backward, per rank.

    16-bit activations and 1-byte dropout masks, FFN width 4h. ``attention_scores=False`` drops
    the 5as/h term (FlashAttention or selective recomputation does not store the s x s scores);
    ``dropout=False`` drops the two s b h masks after attention and after the MLP.

    * t = 1:          s b h (34 + 5 a s / h)
    * TP:             s b h (10 + 24/t + 5 a s / (h t))     (10 = LayerNorm inputs 4, their
                      outputs feeding QKV and fc1 4, two dropout masks 2: replicated)
    * TP + SP:        s b h / t (34 + 5 a s / h)
    """
    t = integer_at_least(t, "the tensor-parallel degree t")
    s, b, h = _shape(s, b, h)
    a = integer_at_least(a, "a")
    scores = 5 * a * s / h if attention_scores else 0.0
    if sequence_parallel:
        total = s * b * h / t * (34 + scores)
    else:
        total = s * b * h * (10 + 24 / t + scores / t)
    if not dropout:  # the two 1-byte masks, on s/t positions under sequence parallelism
        total -= 2 * s * b * h / (t if sequence_parallel else 1)
    return total


def layer_input_bytes(s: int, b: int, h: int, t: int = 1, sequence_parallel: bool = False) -> float:
    """Bytes of one layer's 16-bit input, what full activation recomputation keeps per layer
    (s b h x 2, on s/t positions under sequence parallelism)."""
    t = integer_at_least(t, "the tensor-parallel degree t")
    s, b, h = _shape(s, b, h)
    return 2 * s * b * h / (t if sequence_parallel else 1)


# ---- activation recomputation (Korthikanti et al. 2022; 12.3.1, 12.4.1) ---------------------------

RECOMPUTE_POLICIES = ("none", "selective", "full")


def recompute_kept_bytes(policy: str, s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                         attention_scores: bool = True, dropout: bool = True) -> float:
    """Bytes one layer keeps for backward under a recomputation ``policy`` (per rank):

    * ``"none"``: :func:`activation_bytes_per_layer` (s b h (34 + 5 a s / h) on one device);
    * ``"selective"``: the attention core (Q K^T, softmax, its dropout, x V) is recomputed, so the
      5 a s^2 b bytes of scores, mask and dropped probabilities are not kept: 34 s b h (Q, K, V
      are kept: they are the core's input);
    * ``"full"``: only the layer's input, :func:`layer_input_bytes` (2 s b h).
    ``attention_scores=False`` (FlashAttention) makes "selective" keep what "none" keeps.
    """
    one_of(policy, "the recomputation policy", RECOMPUTE_POLICIES)
    if policy == "full":
        return layer_input_bytes(s, b, h, t, sequence_parallel)
    scores = attention_scores and policy == "none"
    return activation_bytes_per_layer(s, b, h, a, t, sequence_parallel, attention_scores=scores, dropout=dropout)


def recompute_rematerialised_bytes(policy: str, s: int, b: int, h: int, a: int, t: int = 1,
                                   sequence_parallel: bool = False, attention_scores: bool = True,
                                   dropout: bool = True) -> float:
    """Bytes the backward of one layer rebuilds before it can run (the peak adds them once, for
    the layer being differentiated): 0 for ``"none"``; the attention core's 5 a s^2 b for
    ``"selective"`` (0 under FlashAttention, which stores no scores); the layer's whole
    :func:`activation_bytes_per_layer` for ``"full"``."""
    one_of(policy, "the recomputation policy", RECOMPUTE_POLICIES)
    if policy == "none":
        return 0.0
    full = activation_bytes_per_layer(s, b, h, a, t, sequence_parallel, attention_scores=attention_scores, dropout=dropout)
    if policy == "full":
        return full
    return full - activation_bytes_per_layer(s, b, h, a, t, sequence_parallel, attention_scores=False, dropout=dropout)


def recompute_forward_flops(policy: str, tokens: int, h: int, ffn: int, seq: int, mlp_matrices: int = 2) -> float:
    """Forward FLOPs one layer repeats in its backward under ``policy``, on ``tokens`` tokens of
    sequences of length ``seq``: 0 (``"none"``); the attention core's two products,
    :func:`attention_flops` = 4 x tokens x seq x h (``"selective"``, the whole core re-run, as
    Megatron does); the whole :func:`layer_forward_flops` (``"full"``). A step without
    recomputation is 3 forwards (backward = 2 forwards), so "full" adds 1/3."""
    one_of(policy, "the recomputation policy", RECOMPUTE_POLICIES)
    if policy == "none":
        return 0
    if policy == "selective":
        return attention_flops(integer_at_least(tokens, "tokens"), integer_at_least(seq, "seq"), integer_at_least(h, "h"))
    return layer_forward_flops(tokens, h, ffn, seq, mlp_matrices)


def recompute_flops_per_token(policy: str, params: float, layers: int = 0, seq: int = 0, width: int = 0) -> float:
    """Training FLOPs per token added by ``policy`` on top of :func:`training_flops_per_token`:
    0; L x attention's forward 4 s width (``"selective"``); one forward, 2 N + 4 L s width, a
    third of the step (``"full"``)."""
    one_of(policy, "the recomputation policy", RECOMPUTE_POLICIES)
    if policy == "none":
        return 0.0
    if policy == "selective":
        positive_number(params, "params")
        return integer_at_least(layers, "layers", 0) * attention_flops(1, seq, width)
    return training_flops_per_token(params, layers, seq, width) / 3


# ---- parameters and FLOPs of a transformer layer -------------------------------------------------

def attention_params(h: int, heads: int = 1, kv_heads: int = 0, head_dim: int = 0) -> int:
    """Weights of one attention block: Q and the output projection h x (heads x d) each, K and V
    h x (kv_heads x d) each. With d = h / heads and kv_heads = heads (plain multi-head
    attention) that is 4h^2. Biases and norms are left out."""
    h, heads = integer_at_least(h, "h"), integer_at_least(heads, "heads")
    kv = integer_at_least(kv_heads, "kv_heads", 0) or heads
    d = integer_at_least(head_dim, "head_dim", 0) or h // heads
    return h * heads * d * 2 + 2 * h * kv * d


def mlp_params(h: int, ffn: int, mlp_matrices: int = 2) -> int:
    """Weights of one MLP: ``mlp_matrices`` matrices of h x ffn (2 for GeLU, 3 for SwiGLU/GeGLU)."""
    if mlp_matrices not in (2, 3):
        raise ValueError(f"mlp_matrices must be 2 (GeLU MLP) or 3 (SwiGLU), got {mlp_matrices}")
    return mlp_matrices * integer_at_least(h, "h") * integer_at_least(ffn, "ffn")


def layer_params(h: int, ffn: int, mlp_matrices: int = 2) -> int:
    """Weights of one transformer layer with plain multi-head attention: 4h^2 + mlp_matrices x h x ffn."""
    return attention_params(h) + mlp_params(h, ffn, mlp_matrices)


def attention_flops(s_q: int, s_k: int, width: int, causal: bool = False):
    """Forward FLOPs of attention's two products, Q K^T and scores x V: 2 x s_q x s_k x width each
    (2 FLOPs per multiply-add; ``width`` = heads x head dim); halved when causal."""
    f = 4 * integer_at_least(s_q, "s_q", 0) * integer_at_least(s_k, "s_k", 0) * integer_at_least(width, "width", 0)
    return f / 2 if causal else f


def ring_overlap_tokens(flops_per_s: float, link_bytes_per_s: float, q_per_kv: int = 1, causal: bool = False,
                        bytes_per_value: float = 2) -> float:
    """Tokens per rank n at which one ring-attention step's compute equals its K/V transfer (12.3.2).

    Per step a rank scores its n queries against a block of n keys, :func:`attention_flops`
    (n, n, H d) = 4 n^2 H d FLOPs (half when causal), and sends one K and one V block,
    2 n H_kv d bytes_per_value. With g = H / H_kv query heads per K/V head and c = 1/2 for
    causal (1 otherwise) the two take equal time at n = bytes_per_value F / (2 c g B): below it
    the ring's transfers cannot hide behind compute, above it they can. Head dim and head count
    cancel; the sequence length where this happens is p n.
    """
    positive_number(flops_per_s, "flops_per_s")
    positive_number(link_bytes_per_s, "link_bytes_per_s")
    positive_number(bytes_per_value, "bytes_per_value")
    g = integer_at_least(q_per_kv, "q_per_kv (query heads per K/V head)")
    return bytes_per_value * flops_per_s / (2 * (0.5 if causal else 1.0) * g * link_bytes_per_s)


def layer_forward_flops(tokens: int, h: int, ffn: int, seq: int, mlp_matrices: int = 2) -> int:
    """Forward FLOPs of one transformer layer on ``tokens`` tokens of sequences of length ``seq``:
    the weight matmuls, 2 x tokens x :func:`layer_params`, plus attention's
    :func:`attention_flops` (4 x tokens x seq x h). For a batch of b sequences of s tokens:
    8 s b h^2 + 2 mlp_matrices s b h ffn + 4 b s^2 h."""
    tokens = integer_at_least(tokens, "tokens")
    return 2 * tokens * layer_params(h, ffn, mlp_matrices) + attention_flops(tokens, integer_at_least(seq, "seq"), h)


def mlp_forward_flops(tokens: int, h: int, ffn: int, mlp_matrices: int = 2) -> int:
    """Forward FLOPs of one MLP block: 2 x tokens x :func:`mlp_params` (two matmuls of 2 tokens h ffn for GeLU)."""
    return 2 * integer_at_least(tokens, "tokens") * mlp_params(h, ffn, mlp_matrices)


def training_flops_per_token(params: float, layers: int = 0, seq: int = 0, width: int = 0) -> float:
    """Training (forward + backward) FLOPs per token: 6 N + 12 L s width (PaLM, appendix B).

    6 N: 2 per weight forward, 4 backward; 12 L s width: three times attention's forward
    4 s width per token and layer (0 when ``layers`` is 0: the usual 6 N estimate).
    """
    positive_number(params, "params")
    return 6 * params + 3 * integer_at_least(layers, "layers", 0) * attention_flops(1, seq, width)


# ---- bytes per parameter of model state (12.1.1, 12.1.2) ----------------------------------------

# precision recipe -> bytes per parameter of (weights, gradients, fp32 master copy, each optimizer moment)
PRECISIONS = {
    "bf16-mixed": (2, 2, 4, 4),  # bf16 weights and grads, fp32 master weights and moments (12.1.1)
    "fp16-mixed": (2, 2, 4, 4),  # the ZeRO paper's recipe: same byte counts
    "fp32": (4, 4, 0, 4),  # everything in fp32; the weights are the master copy
    "bf16": (2, 2, 0, 2),  # pure bf16: no master copy, moments in bf16
}
# optimizer -> number of moment tensors per parameter
OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd-momentum": 1, "sgd": 0}
COMPONENTS = ("weights", "gradients", "master", "moments")


@dataclass(frozen=True)
class BytesPerParam:
    """Bytes per parameter by component; ``total`` is their sum (16 for bf16-mixed AdamW)."""

    weights: float
    gradients: float
    master: float
    moments: float

    @property
    def optimizer_state(self) -> float:
        """Master copy plus moments: the ZeRO paper's K (12 for mixed-precision Adam)."""
        return self.master + self.moments

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.master + self.moments


def bytes_per_param(precision: str = "bf16-mixed", optimizer: str = "adamw") -> BytesPerParam:
    """Bytes each parameter costs in model state (12.1.1): weights, gradients, master, moments."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: allowed are {sorted(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: allowed are {sorted(OPTIMIZERS)}")
    w, g, master, moment = PRECISIONS[precision]
    return BytesPerParam(w, g, master, OPTIMIZERS[optimizer] * moment)
