"""Per-layer communication and what can hide it (12.1.2, 12.2.1, 12.4.1).

* :func:`fsdp_prefetch_worker` (12.1.2): FSDP2 (``fully_shard`` per layer) on a stack of Linear
  layers of different sizes, so that each collective's payload names its layer. It records
  every layer's forward and backward compute as spans and returns them with FSDP2's own
  all-gathers and reduce-scatters (from the communication log), layer by layer:
  :func:`prefetch_order` reads off when each all-gather was issued relative to the compute of
  the layer before it. Options: FSDP2's explicit forward prefetch
  (``set_modules_to_forward_prefetch``) and asynchronous all-gathers (``_set_unshard_async_op``,
  a private switch in torch 2.13): on CPU ranks the compute runs on the calling thread, so an
  all-gather overlaps compute only when it is both issued early and not waited for at once.
* :func:`tp_chain_worker` (12.2.1, 12.4.1): a stack of tensor-parallel MLP layers. Each layer's
  all-reduce produces the next layer's input, so within one micro-batch nothing can run beside
  it; with two micro-batches interleaved, one's all-reduce travels while the other computes.
  :func:`tp_chain_reference` is the same stack on one process.
"""
from __future__ import annotations

from .launcher.commlog import add_span, mark, now, ops_since, span
from .launcher.worker import device
from .torch_private import set_unshard_async_op
from .validate import equal_parts, integer_at_least

PREFETCH_WIDTHS = (512, 640, 768, 896, 512)  # four layers whose parameter bytes all differ


def layer_bytes(widths, world: int = 1) -> list[int]:
    """FP32 bytes of each Linear(widths[i], widths[i+1]) (weight and bias): the payload of its
    all-gather and of its reduce-scatter. ValueError unless ``world`` divides every output width
    (FSDP2 would pad the dim-0 shards and the payloads would no longer be these)."""
    out = []
    for a, b in zip(widths[:-1], widths[1:]):
        equal_parts(integer_at_least(b, "a layer width"), integer_at_least(world, "world"),
                    "the world size {k} does not divide the output width {n}: FSDP2 would pad the shards")
        out.append(4 * (b * integer_at_least(a, "a layer width") + b))
    if len(set(out)) != len(out):
        raise ValueError(f"layers of equal parameter bytes {out}: a payload would not name its layer")
    return out


def _timed_stack(widths, seed, events):
    import torch

    class Mark(torch.autograd.Function):
        """Identity; its backward notes the time (the gradient has reached this point)."""

        @staticmethod
        def forward(ctx, x, key):
            ctx.key = key
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            events[ctx.key] = now()
            return g, None

    class TimedLinear(torch.nn.Module):
        def __init__(self, a, b, i):
            super().__init__()
            self.lin, self.i = torch.nn.Linear(a, b), i

        def forward(self, x):
            x = Mark.apply(x, ("backward end", self.i))
            start = now()
            y = torch.tanh(self.lin(x))
            events[("forward", self.i)] = (start, now())
            return Mark.apply(y, ("backward start", self.i))

    torch.manual_seed(seed)
    return torch.nn.Sequential(*[TimedLinear(a, b, i) for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))])


def _prefetch_input(widths, batch, seed):
    import torch

    return torch.randn(batch, widths[0], generator=torch.Generator().manual_seed(seed + 1))


def fsdp_prefetch_worker(widths=PREFETCH_WIDTHS, batch: int = 256, steps: int = 2, forward_prefetch: bool = False,
                         async_unshard: bool = False, seed: int = 0):
    """FSDP2 forward and backward of the timed stack, ``steps`` times, on every rank's copy of
    one batch (12.1.2). Returns, for the last step: ``compute`` {(kind, layer): (start, end)}
    and ``ops`` [(op, layer, issue time)] in seconds since the step began, ``loss``, the local
    gradient shards ``grads`` (dim-0 slices, as :func:`helpers.zero.assemble_dim0` expects), and
    the step's wall time."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    payload_layer = {b: i for i, b in enumerate(layer_bytes(widths, dist.get_world_size()))}
    events = {}
    model = _timed_stack(widths, seed, events).to(device())
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    if forward_prefetch:
        for a, b in zip(model[:-1], model[1:]):
            a.set_modules_to_forward_prefetch([b])
    if async_unshard:
        set_unshard_async_op(model, True)  # private in torch 2.13: all-gathers return a Work, waited in pre-forward
    x = _prefetch_input(widths, batch, seed).to(device()).requires_grad_(True)
    for _ in range(integer_at_least(steps, "steps")):
        events.clear()
        for p in model.parameters():
            p.grad = None
        m, t0 = mark(), now()
        with span("step"):
            loss = model(x).square().mean()
            loss.backward()
        t1 = now()
        ops = [(o.op, payload_layer.get(o.bytes), o.t - t0) for o in ops_since(m)]
    compute = {}
    for i in range(len(widths) - 1):
        compute[("forward", i)] = tuple(t - t0 for t in events[("forward", i)])
        compute[("backward", i)] = (events[("backward start", i)] - t0, events[("backward end", i)] - t0)
        for kind in ("forward", "backward"):
            add_span(kind, *(t + t0 for t in compute[(kind, i)]))
    return {"compute": compute, "ops": ops, "loss": loss.item(), "wall_s": t1 - t0,
            "grads": [p.grad.to_local().detach().clone() for p in model.parameters()]}


def prefetch_reference(widths=PREFETCH_WIDTHS, batch: int = 256, seed: int = 0):
    """The same forward and backward on one process: the loss and the full gradients."""
    events = {}
    model = _timed_stack(widths, seed, events)
    loss = model(_prefetch_input(widths, batch, seed).requires_grad_(True)).square().mean()
    loss.backward()
    return {"loss": loss.item(), "grads": [p.grad.detach().clone() for p in model.parameters()]}


def prefetch_order(result) -> list[dict]:
    """For each layer i, from one rank's :func:`fsdp_prefetch_worker` result: when its forward
    and backward all-gathers were issued, and whether that was before the compute of the layer
    that runs just before it (layer i-1 in forward, layer i+1 in backward) began or ended.
    A gather issued before the previous layer's compute began is prefetched."""
    n = 1 + max(layer for _, layer in result["compute"])
    gathers = {i: [t for op, layer, t in result["ops"] if op == "all_gather" and layer == i] for i in range(n)}
    c = result["compute"]
    rows = []
    for i in range(n):
        fwd, bwd = gathers[i][0], gathers[i][-1] if len(gathers[i]) > 1 else None
        row = {"layer": i, "forward gather at": fwd, "backward gather at": bwd}
        if i > 0:
            row["forward: before layer i-1 began"] = fwd < c[("forward", i - 1)][0]
            row["forward: before layer i-1 ended"] = fwd < c[("forward", i - 1)][1]
        if i < n - 1 and bwd is not None:
            row["backward: before layer i+1 began"] = bwd < c[("backward", i + 1)][0]
        rows.append(row)
    return rows


def prefetch_plot(result, ax=None, title: str = ""):
    """One rank's step of :func:`fsdp_prefetch_worker`: each layer's forward and backward
    compute as bars, and below them FSDP2's all-gathers (AG i) and reduce-scatters (RS i) at
    the moment they were issued (12.1.2); drawn by :func:`helpers.plots.prefetch_timeline`."""
    from .plots import prefetch_timeline

    return prefetch_timeline(result, ax, title=title)


# ---- tensor parallelism: the all-reduce feeds the next layer (12.2.1) ------------------------------

def _tp_problem(h, ffn, tokens, layers, micro_batches, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    A = [torch.randn(h, ffn, generator=g, dtype=torch.float64) / h ** 0.5 for _ in range(layers)]
    B = [torch.randn(ffn, h, generator=g, dtype=torch.float64) / ffn ** 0.5 for _ in range(layers)]
    xs = [torch.randn(tokens, h, generator=g, dtype=torch.float64) for _ in range(micro_batches)]
    return A, B, xs


def tp_chain_reference(h: int = 512, ffn: int = 128, tokens: int = 256, layers: int = 6, micro_batches: int = 2,
                       seed: int = 0):
    """One process: x <- x + GeLU(x A_l) B_l for every layer, for each micro-batch."""
    import torch

    A, B, xs = _tp_problem(h, ffn, tokens, layers, micro_batches, seed)
    outs = []
    for x in xs:
        for a, b in zip(A, B):
            x = x + torch.nn.functional.gelu(x @ a) @ b
        outs.append(x)
    return outs


def tp_chain_worker(h: int = 512, ffn: int = 128, tokens: int = 256, layers: int = 6, micro_batches: int = 2,
                    interleave: bool = False, seed: int = 0):
    """The same stack with A split by columns and B by rows over the ranks (12.2.1): each rank
    computes a partial GeLU(x A_r) B_r and an all-reduce sums them into the next layer's input.

    ``interleave=False``: micro-batch after micro-batch, each all-reduce blocking (it has to:
    its result is the very next input). ``interleave=True``: layer by layer over the
    micro-batches, each all-reduce launched asynchronously and waited for only when its
    micro-batch comes round again, so it travels while the other micro-batches compute.
    Spans ``compute`` and ``all-reduce`` (issue to completion). Returns the outputs and the
    wall time.
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    cols = equal_parts(ffn, world, "the tensor-parallel degree {k} does not divide the FFN width {n}")[rank]
    A, B, xs = _tp_problem(h, ffn, tokens, layers, integer_at_least(micro_batches, "micro_batches"), seed)
    A = [a[:, cols.start:cols.stop].contiguous().to(device()) for a in A]
    B = [b[cols.start:cols.stop].contiguous().to(device()) for b in B]
    xs = [x.to(device()) for x in xs]

    def partial(x, layer):
        with span("compute"):
            return torch.nn.functional.gelu(x @ A[layer]) @ B[layer]

    def launch(z):
        start = now()
        work = dist.all_reduce(z, async_op=True)
        return work, work.get_future().then(lambda _: now()), start, z

    def land(m, pending):
        work, done, start, z = pending
        work.wait()
        add_span("all-reduce", start, max(start, done.wait()))
        xs[m] = xs[m] + z

    t0 = now()
    if interleave:
        pending = [None] * micro_batches
        for layer in range(layers):
            for m in range(micro_batches):
                if pending[m] is not None:
                    land(m, pending[m])
                pending[m] = launch(partial(xs[m], layer))
        for m in range(micro_batches):
            land(m, pending[m])
    else:
        for m in range(micro_batches):
            for layer in range(layers):
                land(m, launch(partial(xs[m], layer)))  # launched and waited at once: nothing else to do
    return {"out": xs, "wall_s": now() - t0}


def _union(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def busy_together(spans, a: str = "compute", b: str = "all-reduce") -> float:
    """Seconds during which some span named ``a`` and some span named ``b`` ran at the same time
    on one rank (``run.spans[r]``): the communication that computation actually covered (12.2.1)."""
    xs = _union((s.start, s.end) for s in spans if s.name == a)
    ys = _union((s.start, s.end) for s in spans if s.name == b)
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in xs for s2, e2 in ys)
