"""Communication hidden under computation, on the ranks (P.6, 12.1.2, 12.2.1, 12.4.1).

* :class:`GradBuckets`: DDP's gradient synchronisation written by hand. Gradient hooks
  (``register_post_accumulate_grad_hook``) drop each gradient into the open bucket as backward
  produces it; a bucket that reaches its size is all-reduced at once with ``async_op=True``, so
  the late layers' gradients travel while the early layers' backward still runs (P.6).
  :meth:`GradBuckets.finish` waits, averages and writes the gradients back before the optimizer
  step. :func:`hand_ddp_worker` trains with it, :func:`ddp_worker` with PyTorch's DDP at a given
  ``bucket_cap_mb``; both return parameters, gradients and what each step all-reduced.
* :func:`overlap_timing_worker`: the same step timed four ways (compute alone, communication
  alone, one after the other, overlapped), with compute and communication spans for
  :func:`helpers.plots.lane_timeline`. ``stall_ms`` replaces real compute by a wait of that length
  per layer, the way a host thread waits for an accelerator: on a CPU the two otherwise compete
  for the same cores.
* :func:`tp_chain_worker` (12.2.1, 12.4.1): a tensor-parallel MLP stack whose all-reduce output is
  the next layer's input; it can overlap only with another micro-batch's compute.

The closed forms (``max(compute, comm)`` against ``compute + comm``, buckets finishing one after
another, which gradients share a bucket) are in :mod:`helpers.costs`; FSDP2's prefetch is in
:mod:`helpers.prefetch`.
"""
from __future__ import annotations

from .costs import bucket_assignment, step_time
from .data_parallel import make_batches, make_model, rank_rows
from .launcher.commlog import add_span, mark, now, ops_since, span
from .launcher.worker import device
from .torch_private import ddp_logging_data
from .validate import integer_at_least, positive_number

MLP_SIZES = (8, 32, 32, 1)  # the P.6 regression MLP, with a hidden layer more so that buckets differ
MIB = 1 << 20


def ddp_bucket_caps(bucket_cap_mb: float | None = None) -> tuple[int, int]:
    """(first bucket cap, bucket cap) in bytes of PyTorch 2.13's DDP after its first step.

    Unset, 1 MiB for the first bucket (the last layers' gradients, ready first) and 25 MiB after;
    set, the same cap for every bucket (``torch.nn.parallel.distributed._BucketCapacityConfig``).
    In the first step DDP uses one bucket for everything, then rebuilds them in the order the
    gradients became ready (``Reducer._rebuild_buckets``).
    """
    if bucket_cap_mb is None:
        return MIB, 25 * MIB
    cap = int(positive_number(bucket_cap_mb, "bucket_cap_mb") * MIB)
    return cap, cap


def cap_mb(bucket_bytes: int) -> float:
    """``bucket_cap_mb`` for DDP that means exactly ``bucket_bytes`` (a power-of-two division, so
    DDP's ``int(bucket_cap_mb * MiB)`` gives the bytes back)."""
    return integer_at_least(bucket_bytes, "bucket_bytes (the bucket size in bytes)") / MIB


class GradBuckets:
    """Bucketed, overlapped gradient all-reduce for one rank's ``params`` (P.6; DDP by hand).

    ``bucket_bytes``: a bucket is launched as soon as it holds at least this many bytes (the last
    one when every gradient has arrived). ``overlap=False`` keeps the same buckets but launches
    them only in :meth:`finish`, after backward: the baseline without overlap. Each launched
    all-reduce is recorded as an ``"all-reduce"`` span from its issue to its completion, and the
    time :meth:`finish` blocks as a ``"wait"`` span (the exposed communication).
    """

    def __init__(self, params, bucket_bytes: int, overlap: bool = True, group=None):
        import torch.distributed as dist

        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("GradBuckets needs at least one parameter that requires a gradient")
        if len({(p.dtype, p.device) for p in self.params}) > 1:
            raise ValueError("GradBuckets flattens a bucket into one tensor: every parameter needs the same dtype and device")
        self.cap = integer_at_least(bucket_bytes, "bucket_bytes (the bucket size in bytes)")
        self.overlap, self.group = bool(overlap), group
        self.enabled = True  # False: the hooks ignore gradients (to time backward alone)
        self.world = dist.get_world_size(group)
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params]
        self._reset()

    def _reset(self):
        self._open, self._open_bytes, self._arrived = [], 0, 0
        self._closed, self._inflight = [], []

    def _ready(self, p):
        if not self.enabled:
            return
        if self._arrived == len(self.params):
            raise RuntimeError("a second backward pass before finish(): GradBuckets syncs once per backward")
        self._open.append(p)
        self._open_bytes += p.grad.numel() * p.grad.element_size()
        self._arrived += 1
        if self._open_bytes >= self.cap or self._arrived == len(self.params):
            bucket, self._open, self._open_bytes = self._open, [], 0
            self._launch(bucket) if self.overlap else self._closed.append(bucket)

    def _launch(self, bucket):
        import torch
        import torch.distributed as dist

        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        start = now()
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        done = work.get_future().then(lambda _: now())  # runs on gloo's thread when the sum is in
        self._inflight.append((work, done, start, flat, bucket))

    def finish(self) -> list[int]:
        """Launch what is left, wait for every bucket, write the averaged gradients back.

        Returns the bytes of each bucket in launch order. RuntimeError if some parameter got no
        gradient in this backward pass (its bucket could never be complete).
        """
        missing = len(self.params) - self._arrived
        if missing:
            raise RuntimeError(f"{missing} of {len(self.params)} parameters received no gradient in this backward pass")
        for bucket in self._closed:
            self._launch(bucket)
        sizes = []
        with span("wait"):
            for work, done, start, flat, bucket in self._inflight:
                work.wait()
                add_span("all-reduce", start, max(start, done.wait()))
                flat.div_(self.world)
                offset = 0
                for p in bucket:
                    p.grad.copy_(flat[offset:offset + p.grad.numel()].view_as(p.grad))
                    offset += p.grad.numel()
                sizes.append(flat.numel() * flat.element_size())
        self._reset()
        return sizes

    def remove(self):
        """Take the gradient hooks off the parameters."""
        for h in self._hooks:
            h.remove()


# ---- training with the hand-written buckets and with DDP (float64, compared exactly) ----------

def _train(model, sync, steps, batch, lr, sizes):
    """SGD on this rank's rows of every batch; returns what ``sync()`` reported per step."""
    import torch
    import torch.distributed as dist

    opt = torch.optim.SGD(model.parameters(), lr=lr)
    X, y = (t.to(device()) for t in make_batches(steps, batch, features=sizes[0]))
    mine = rank_rows(batch, dist.get_rank(), dist.get_world_size())
    reported = []
    for k in range(steps):
        opt.zero_grad(set_to_none=True)
        m = mark()
        with span("step"):
            torch.nn.functional.mse_loss(model(X[k][mine]), y[k][mine]).backward()
            reported.append(sync(m))
            grads = [p.grad.detach().clone() for p in model.parameters()]
            opt.step()
    return {"params": [p.detach().clone() for p in model.parameters()], "grads": grads, "per_step": reported}


def hand_ddp_worker(bucket_bytes: int, steps: int = 3, batch: int = 32, lr: float = 0.1, seed: int = 0,
                    sizes=MLP_SIZES, overlap: bool = True):
    """Train the P.6 MLP with :class:`GradBuckets` (P.6). Returns the final parameters, the last
    step's averaged gradients, ``per_step`` (the bucket sizes each step launched) and
    ``bucket_bytes`` as asked."""

    model = make_model(seed, sizes).to(device())
    buckets = GradBuckets(model.parameters(), bucket_bytes, overlap=overlap)
    out = _train(model, lambda m: buckets.finish(), steps, batch, lr, sizes)
    return {**out, "bucket_bytes": buckets.cap}


def ddp_worker(bucket_cap_mb: float | None = None, steps: int = 3, batch: int = 32, lr: float = 0.1, seed: int = 0,
               sizes=MLP_SIZES):
    """The same training with PyTorch's DDP (P.6). ``per_step`` lists the payloads of the
    all-reduces each step issued (from the communication log); ``rebuilt`` DDP's own account of
    its buckets after the first step (``_get_ddp_logging_data``)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(make_model(seed, sizes).to(device()), bucket_cap_mb=bucket_cap_mb)
    out = _train(ddp, lambda m: [o.bytes for o in ops_since(m) if o.op == "all_reduce"], steps, batch, lr, sizes)
    data = ddp_logging_data(ddp)
    return {**out, "rebuilt": str(data.get("rebuilt_bucket_sizes", "")), "initial": str(data.get("bucket_sizes", ""))}


def reference_training(steps: int = 3, batch: int = 32, lr: float = 0.1, seed: int = 0, sizes=MLP_SIZES):
    """One process, the whole batch: the parameters after ``steps`` SGD steps and the last step's
    gradients (the reference for :func:`hand_ddp_worker` and :func:`ddp_worker`)."""
    import torch

    model = make_model(seed, sizes)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    X, y = make_batches(steps, batch, features=sizes[0])
    for k in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X[k]), y[k]).backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
    return {"params": [p.detach().clone() for p in model.parameters()], "grads": grads}


def ready_order_bytes(seed: int = 0, sizes=MLP_SIZES) -> list[int]:
    """Bytes of each gradient in the order backward produces them, measured with hooks on one
    process (for an MLP: the parameters in reverse, each bias before its weight)."""
    import torch

    model = make_model(seed, sizes)
    order = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: order.append(p.numel() * p.element_size()))
    X, y = make_batches(1, 4, features=sizes[0])
    torch.nn.functional.mse_loss(model(X[0]), y[0]).backward()
    return order


def max_diff(a, b) -> float:
    """Largest absolute difference between two lists of tensors."""
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


# ---- timing: compute alone, communication alone, one after the other, overlapped ----------------

def _stall_layer(ms: float):
    """A layer that passes its input through and whose backward waits ``ms`` milliseconds: a
    stand-in for compute on an accelerator, during which the host's cores are free."""
    import time

    import torch

    class Stall(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            time.sleep(ms / 1e3)
            return g

    class StallLayer(torch.nn.Module):
        def forward(self, x):
            return Stall.apply(x)

    return StallLayer()


def overlap_timing_worker(width: int = 1024, layers: int = 8, batch: int = 16, bucket_bytes: int = 8 * MIB,
                          repeats: int = 3, stall_ms: float = 0.0, seed: int = 0):
    """Time one data-parallel step of a ``layers`` x Linear(width, width) + Tanh stack (float32)
    in four modes, ``repeats`` times each, interleaved (P.6):

    * ``"compute"``: forward and backward, no communication;
    * ``"comm"``: the same buckets all-reduced back to back, no compute;
    * ``"sequential"``: backward, then the buckets (``GradBuckets(overlap=False)``);
    * ``"overlapped"``: buckets launched from the gradient hooks (``GradBuckets(overlap=True)``).

    Spans: ``forward``, ``backward``, ``all-reduce`` (issue to completion), ``wait`` and
    ``step:<mode>``. Returns per mode the median seconds of ``forward``, ``backward``, ``wait``
    and ``step``, and the bucket sizes.
    """
    import statistics

    import torch
    import torch.distributed as dist

    integer_at_least(repeats, "repeats")
    torch.manual_seed(seed)
    blocks = []
    for _ in range(integer_at_least(layers, "layers")):
        blocks += [torch.nn.Linear(width, width), torch.nn.Tanh()]
        if stall_ms:
            blocks.append(_stall_layer(positive_number(stall_ms, "stall_ms")))
    model = torch.nn.Sequential(*blocks).to(device())
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed + dist.get_rank())).to(device())
    sync = GradBuckets(model.parameters(), bucket_bytes)
    sizes = [sum(p.numel() * p.element_size() for p in b) for b in _buckets_of(model, bucket_bytes)]
    flats = [torch.zeros(n // 4, device=device()) for n in sizes]
    times = {m: {"forward": [], "backward": [], "wait": [], "step": []} for m in ("compute", "comm", "sequential", "overlapped")}
    for _ in range(repeats):
        for mode, row in times.items():
            sync.enabled, sync.overlap = mode != "compute", mode == "overlapped"
            for p in model.parameters():
                p.grad = None
            dist.barrier()
            t0 = now()
            with span(f"step:{mode}"):
                if mode == "comm":
                    with span("wait"):
                        for flat in flats:
                            s0 = now()
                            dist.all_reduce(flat)
                            add_span("all-reduce", s0, now())
                else:
                    with span("forward"):
                        loss = model(x).square().mean()
                    t1 = now()
                    with span("backward"):
                        loss.backward()
                    row["forward"].append(t1 - t0)
                    row["backward"].append(now() - t1)
                    if mode != "compute":
                        w = now()
                        if sync.finish() != sizes:
                            raise RuntimeError("GradBuckets filled other buckets than the model of costs.bucket_assignment")
                        row["wait"].append(now() - w)
            row["step"].append(now() - t0)
    return {"modes": {m: {k: statistics.median(v) if v else 0.0 for k, v in row.items()} for m, row in times.items()},
            "bucket_sizes": sizes}


def _buckets_of(model, bucket_bytes):
    """The parameters in backward's order, cut into buckets the way :class:`GradBuckets` fills them."""

    params = list(reversed([p for p in model.parameters() if p.requires_grad]))
    cut = bucket_assignment([p.numel() * p.element_size() for p in params], bucket_bytes)
    return [[params[i] for i in b] for b in cut]


def timed_steps(run, rank: int = 0) -> list[dict]:
    """The steps an :func:`overlap_timing_worker` run recorded on ``rank``, one dict each:
    ``mode``, ``start``/``end`` and the spans inside it by name (``forward``, ``backward``,
    ``all-reduce``, ``wait``: lists of (start, end) in seconds since the step began), and
    ``issued``: the all-reduce calls of the communication log inside the step, as issue times."""
    spans, ops = run.spans[rank], [o for o in run.comm[rank] if o.op == "all_reduce"]
    out = []
    for s in (s for s in spans if s.name.startswith("step:")):
        inside = {}
        for t in spans:
            if t is not s and not t.name.startswith("step:") and s.start <= t.start and t.end <= s.end:
                inside.setdefault(t.name, []).append((t.start - s.start, t.end - s.start))
        out.append({"mode": s.name.split(":", 1)[1], "start": s.start, "end": s.end, "spans": inside,
                    "issued": [o.t - s.start for o in ops if s.start <= o.t <= s.end]})
    return out


def timing_table(result) -> list[dict]:
    """Measured beside modelled for one rank's :func:`overlap_timing_worker` result (P.6): per
    mode the measured step, and the model from the two parts measured alone, compute (forward +
    backward) and communication (the buckets back to back): compute + comm one after the other,
    and with the backward as the window the communication can hide under
    (:func:`helpers.costs.step_time`; max(compute, comm) if the window were all the compute)."""

    m = result["modes"]
    compute, comm, backward = m["compute"]["forward"] + m["compute"]["backward"], m["comm"]["step"], m["compute"]["backward"]
    model = {"compute": compute, "comm": comm, "sequential": step_time(compute, comm),
             "overlapped": step_time(compute, comm, min(backward, compute))}
    return [{"mode": k, "measured_s": m[k]["step"], "model_s": model[k], "wait_s": m[k]["wait"]} for k in m]
