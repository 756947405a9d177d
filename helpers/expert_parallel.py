"""Expert parallelism on ranks: dispatch and combine with all-to-all (12.4.1's fourth dimension, 12.4.2).

R ranks, E experts: rank r holds the E/R whole experts r E/R .. (r+1) E/R - 1, a replica of the
router, and its own T tokens. One mixture-of-experts layer (:class:`ExpertParallelMoE`):

1. **route** its tokens (DeepSeek-V3's sigmoid gate, normalised over the top k; the layer of
   :mod:`helpers.moe_numpy`, written again in torch) and drop the copies beyond each expert's
   capacity: a rank is a capacity group, so it drops before it sends;
2. sort the kept copies by expert and **exchange the counts**: an ``all_to_all_single`` of E
   integers tells every rank how many rows it will receive from each peer for each of its experts;
3. **dispatch**: ``all_to_all_single`` of the token rows with those uneven splits;
4. each local expert (SwiGLU) processes the rows it received, from every rank;
5. **combine**: the reverse ``all_to_all_single`` sends the outputs home, where each is weighted
   by its gate and added to its token.

The backward pass is autograd's: :class:`AllToAll`'s backward is the all-to-all with the splits
swapped (the gradient of a row goes back where the row came from), so the backward also makes two
token all-to-alls: four per layer and micro-batch, as the planner counts them
(:func:`helpers.planner.assess.step_time_breakdown`). (``torch.distributed.nn.functional.all_to_all_single``
does the same in torch 2.13; the Function here is short enough to read.)

:func:`moe_single` is the same layer on one process in torch (autograd, no communication);
:func:`ep_worker` runs the layer on the launcher's ranks (or under torchrun) and returns outputs,
gradients, splits and the collectives; :func:`max_differences` compares a run with
:func:`helpers.moe_numpy.reference`; :func:`bytes_table` puts the logged all-to-all bytes beside
:func:`helpers.costs.moe_dispatch_bytes` and :func:`helpers.costs.moe_all_to_all_sent`.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import costs
from .launcher.commlog import as_tuples, mark, ops_since
from .launcher.worker import device
from .moe_numpy import check_layout, problem, reference, token_groups

# ---- the all-to-all with its backward ------------------------------------------------------------

class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of the rows of x (rank q gets ``in_splits[q]`` rows, this rank gets
    ``out_splits[p]`` rows from rank p); backward: the same with the splits swapped."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (list(out_splits), list(in_splits)), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x, out_splits, in_splits, group=None):
    return AllToAll.apply(x, out_splits, in_splits, group)


# ---- the layer's pieces in torch -----------------------------------------------------------------

def route(x, router, top_k: int):
    """Chosen experts (T, k) by decreasing affinity sigmoid(x W_r), and their normalised gate weights."""
    vals, idx = torch.topk(torch.sigmoid(x @ router), top_k, dim=1, sorted=True)
    return idx, vals / vals.sum(dim=1, keepdim=True)


def keep_mask(idx, experts: int, capacity: int):
    """(T, k) booleans for one capacity group: a copy is kept if fewer than ``capacity`` copies
    reached its expert before it in slot-major order (all first choices, then all second ...)."""
    T, k = idx.shape
    order = idx.t().reshape(-1)  # slot-major
    before = F.one_hot(order, experts).cumsum(0).gather(1, order[:, None])[:, 0] - 1
    return (before < capacity).reshape(k, T).t()


def swiglu(x, w1, w3, w2):
    return (F.silu(x @ w1) * (x @ w3)) @ w2


def moe_single(x, params: dict, top_k: int, capacity_factor=None, groups: int = 1):
    """The whole layer on one process (torch, autograd): each capacity group routed, each expert
    applied to its kept tokens and the outputs added with their gates. ``params`` holds
    ``router`` (h, E) and ``w1``, ``w3`` (E, h, f), ``w2`` (E, f, h)."""
    E = params["router"].shape[1]
    check_layout(E, top_k, 1, capacity_factor)
    y = torch.zeros_like(x)
    for part in token_groups(x.shape[0], groups):
        xs = x[part.start:part.stop]
        idx, gates = route(xs, params["router"], top_k)
        keep = keep_mask(idx, E, costs.expert_capacity(len(part), E, top_k, capacity_factor))
        for e in range(E):
            t, j = torch.nonzero((idx == e) & keep, as_tuple=True)
            out = swiglu(xs[t], params["w1"][e], params["w3"][e], params["w2"][e])
            y = y.index_add(0, t + part.start, gates[t, j][:, None] * out)
    return y


# ---- the layer on ranks --------------------------------------------------------------------------

class ExpertParallelMoE:
    """One rank's part of the layer: the router (replicated) and this rank's E/R experts.

    ``w1``, ``w3``, ``w2`` hold the local experts only, stacked (E/R, ...). After a forward,
    ``stats`` has this rank's routing: ``send`` / ``recv`` rows per peer (the dispatch splits),
    ``routed`` and ``dropped`` copies, and the capacity.
    """

    def __init__(self, router, w1, w3, w2, top_k: int, capacity_factor=None, group=None):
        self.router, self.w1, self.w3, self.w2 = router, w1, w3, w2
        self.group = group
        self.ranks = dist.get_world_size(group)
        self.experts = router.shape[1]
        self.local = check_layout(self.experts, top_k, self.ranks, capacity_factor)
        if w1.shape[0] != self.local:
            raise ValueError(f"each rank must hold E/R = {self.local} experts, got {w1.shape[0]}")
        self.top_k, self.capacity_factor = top_k, capacity_factor
        self.stats: dict = {}

    def forward(self, x):
        T, k, E, R, L = x.shape[0], self.top_k, self.experts, self.ranks, self.local
        idx, gates = route(x, self.router, k)
        capacity = costs.expert_capacity(T, E, k, self.capacity_factor)
        keep = keep_mask(idx, E, capacity)
        # the kept copies, sorted by expert (so by destination rank), then by token and slot
        flat = torch.nonzero(keep.reshape(-1), as_tuple=True)[0]
        expert_of = idx.reshape(-1)[flat]
        order = torch.argsort(expert_of * (T * k) + flat)
        flat, expert_of = flat[order], expert_of[order]
        per_expert = torch.bincount(expert_of, minlength=E)
        # 1. counts: rank q learns how many rows each peer sends to each of q's experts
        counts = torch.empty_like(per_expert)
        dist.all_to_all_single(counts, per_expert, group=self.group)
        counts = counts.reshape(R, L)  # [source rank, local expert]
        send = per_expert.reshape(R, L).sum(1).tolist()
        recv = counts.sum(1).tolist()
        # 2. dispatch
        rows = all_to_all(x[flat // k], recv, send, self.group)
        # 3. the local experts, each on its rows from every rank
        local_of = torch.arange(L, device=x.device).repeat(R).repeat_interleave(counts.reshape(-1))
        perm = torch.argsort(local_of, stable=True)
        chunks = torch.split(rows[perm], counts.sum(0).tolist())
        out = torch.cat([swiglu(c, self.w1[e], self.w3[e], self.w2[e]) for e, c in enumerate(chunks)])
        out = out[torch.argsort(perm)]
        # 4. combine: outputs go home, weighted by their gates and added per token
        back = all_to_all(out, send, recv, self.group)
        y = torch.zeros_like(x).index_add(0, flat // k, gates.reshape(-1)[flat][:, None] * back)
        self.stats = {"send": send, "recv": recv, "routed": T * k, "dropped": T * k - len(flat), "capacity": capacity}
        return y

    __call__ = forward


def local_experts(experts: int, ranks: int, rank: int) -> range:
    """The experts rank ``rank`` holds: E/R consecutive ones."""
    per = check_layout(experts, 1, ranks)
    return range(rank * per, (rank + 1) * per)


def ep_worker(tokens: int = 32, h: int = 8, f: int = 16, experts: int = 8, top_k: int = 2, capacity_factor=None,
              seed: int = 0, skew: float = 0.0):
    """One forward + backward of the layer on this rank, with ``tokens`` tokens per rank.

    Every rank builds the same :func:`helpers.moe_numpy.problem` for tokens x R tokens and keeps
    its T rows, its experts and the router. Returns y and dx of its tokens, the router's gradient
    from its tokens (their sum over ranks is the full one), its experts' gradients, the dispatch
    splits and the collectives of the forward and the backward: (op, payload bytes, group size).
    """

    rank, R = dist.get_rank(), dist.get_world_size()
    check_layout(experts, top_k, R, capacity_factor)
    P = problem(tokens * R, h, f, experts, seed, skew)
    mine, exp = slice(rank * tokens, (rank + 1) * tokens), local_experts(experts, R, rank)
    dev = device()

    def t(a):
        return torch.tensor(np.ascontiguousarray(a), dtype=torch.float64, device=dev)

    W = {k: t(P[k][exp.start:exp.stop]).requires_grad_() for k in ("w1", "w3", "w2")}
    router = t(P["router"]).requires_grad_()
    x, dy = t(P["x"][mine]).requires_grad_(), t(P["dy"][mine])
    layer = ExpertParallelMoE(router, W["w1"], W["w3"], W["w2"], top_k, capacity_factor)
    m0 = mark()
    y = layer(x)
    m1 = mark()
    (y * dy).sum().backward()
    m2 = mark()
    return {"rank": rank, "experts": list(exp), "y": y.detach(), "dx": x.grad, "router": router.grad,
            **{k: W[k].grad for k in W}, **layer.stats, "forward": as_tuples(ops_since(m0, m1)),
            "backward": as_tuples(ops_since(m1, m2)),
            "args": dict(tokens=tokens, h=h, f=f, experts=experts, top_k=top_k, capacity_factor=capacity_factor,
                         seed=seed, skew=skew, ranks=R)}


# ---- checking what the ranks returned ------------------------------------------------------------

def max_differences(results: list[dict], ref: dict | None = None) -> dict:
    """Largest |difference| between a run of :func:`ep_worker` and :func:`helpers.moe_numpy.reference`
    (computed from the run's own arguments unless given): y, dx, router (summed over ranks), experts."""
    ref = ref or reference(**results[0]["args"])
    T, g = results[0]["args"]["tokens"], ref["grads"]
    out = {"y": 0.0, "dx": 0.0, "experts": 0.0}
    for r in results:
        rows, exp = slice(r["rank"] * T, (r["rank"] + 1) * T), slice(r["experts"][0], r["experts"][-1] + 1)
        out["y"] = max(out["y"], float(np.max(np.abs(r["y"].numpy() - ref["y"][rows]))))
        out["dx"] = max(out["dx"], float(np.max(np.abs(r["dx"].numpy() - g["x"][rows]))))
        for k in ("w1", "w3", "w2"):
            out["experts"] = max(out["experts"], float(np.max(np.abs(r[k].numpy() - g[k][exp]))))
    out["router"] = float(np.max(np.abs(sum(r["router"].numpy() for r in results) - g["router"])))
    return out


def token_all_to_alls(ops) -> list[int]:
    """Payload bytes of the token all-to-alls among (op, bytes, group) tuples: every all-to-all
    but the counts exchange, which comes first in a forward."""
    a2a = [b for op, b, _ in ops if op == "all_to_all"]
    return a2a[1:] if len(a2a) == 3 else a2a


def bytes_table(results: list[dict], bytes_per_value: int = 8) -> list[dict]:
    """Per rank: the logged payloads of dispatch and combine (forward) beside the model.

    ``dispatch model``: :func:`helpers.costs.moe_dispatch_bytes` (T k h bytes, every routed copy,
    none dropped); ``dispatch kept``: the kept copies x h x bytes, which the log must equal exactly;
    ``sent to others``: rows to other ranks x h x bytes (from the splits) beside
    :func:`helpers.costs.moe_all_to_all_sent` ((R-1)/R of the model: even routing).
    """
    rows = []
    for r in results:
        a = r["args"]
        dispatch, combine = token_all_to_alls(r["forward"])
        row_bytes = a["h"] * bytes_per_value
        kept = sum(r["send"]) * row_bytes
        rows.append({"rank": r["rank"], "dispatch (log)": dispatch, "dispatch kept": kept,
                     "dispatch model": costs.moe_dispatch_bytes(a["tokens"], a["top_k"], a["h"], bytes_per_value),
                     "combine (log)": combine, "combine rows x h x bytes": sum(r["recv"]) * row_bytes,
                     "sent to others": kept - r["send"][r["rank"]] * row_bytes,
                     "sent model": costs.moe_all_to_all_sent(a["tokens"], a["top_k"], a["h"], a["ranks"], bytes_per_value)})
    return rows
