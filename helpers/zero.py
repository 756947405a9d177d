"""ZeRO stages 1, 2 and 3 built by hand, and PyTorch's own ZeRO-1 and FSDP2 (12.1.2).

numpy side: AdamW is elementwise, so updating one chunk with its own moments gives exactly the
numbers a full update gives there; ZeRO-1 on simulated devices (reduce-scatter, local AdamW,
all-gather) equals DDP (all-reduce, full AdamW): :func:`adamw_numpy`, :func:`zero1_numpy`,
:func:`ddp_numpy`.

torch side, :class:`HandZero` (one rank's state) and :func:`zero_train_worker` (a training run on
the launcher's ranks), on a small MLP with AdamW:

* stage 0: naive DDP by hand (one all-reduce of the flattened gradients, full optimizer);
* stage 1: full gradients after backward, one ``reduce_scatter_single`` of all of them, AdamW on
  the chunk this rank owns, one ``all_gather_single`` of the updated parameters;
* stage 2: gradients reduce-scattered layer by layer *during* backward (post-accumulate-grad
  hooks) and the full-size gradients freed at once; the same step and all-gather as stage 1;
* stage 3: only parameter chunks at rest; each layer all-gathers its weights just before its
  forward, frees them after, gathers them again in backward, and reduce-scatters its gradient.

Every layer (``nn.Linear``) is one sharding unit, as in FSDP (:class:`Unit`): its weight and bias
flattened, padded to a multiple of the world size, rank r owning the r-th equal chunk. The
workers measure the bytes each rank holds and return enough to rebuild the full parameters in
the parent (:func:`assemble`), so that no collective is spent on checking. The communication is
logged by the launcher (``run.comm``; :func:`per_step_comm` keeps what a training step issued).
References on the same data: :func:`ddp_reference_worker` (PyTorch DDP),
:func:`zero_redundancy_worker` (``ZeroRedundancyOptimizer``), :func:`fsdp2_worker` (``fully_shard``);
and :func:`identity_worker` (all-reduce = reduce-scatter + all-gather on the ranks).

Units: bytes throughout. The chapter's 2|θ| and 3|θ| are multiples of one copy of the
communicated parameters in bytes (count x bytes per element); per rank, a ring sends (M-1)/M of
that per reduce-scatter or all-gather (:func:`comm_bytes_per_rank`).
"""
from __future__ import annotations

import math

import numpy as np

from . import costs
from .validate import equal_parts, index_below, integer_at_least, positive_number
from .validate import zero_stage as check_zero_stage

DEFAULT_SIZES = (8, 32, 32, 4)  # 288 + 1056 + 132 = 1476 parameters; every layer divides by 1, 2, 3, 4, 6, 12
ADAMW = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}
STAGE_PRECISIONS = ("fp32", "bf16-mixed")


# ---- models of the communication ------------------------------------------------------------

def comm_bytes_per_rank(n_params: float, world_size: int, zero_stage: int, bytes_per_element: float = 2) -> dict:
    """Bytes one rank sends per training step under a ring, by collective (12.1.2).

    Stage 0 (naive DDP): one all-reduce of the gradients, 2(M-1)/M x S with S = n_params x
    bytes_per_element. Stages 1 and 2: a reduce-scatter of the gradients and an all-gather of the
    updated parameters, (M-1)/M x S each. Stage 3: two all-gathers of the parameters (forward and
    backward) and one reduce-scatter. ``"units"`` is the total in the chapter's units of
    (M-1)/M x S: 2, 2, 2, 3.
    """
    positive_number(n_params, "n_params")
    integer_at_least(world_size, "world_size")
    check_zero_stage(zero_stage)
    positive_number(bytes_per_element, "bytes_per_element")
    payload = n_params * bytes_per_element
    unit = costs.ring_bytes_sent("reduce_scatter", payload, world_size)
    parts = {"all_reduce": 0.0, "reduce_scatter": 0.0, "all_gather": 0.0}
    if zero_stage == 0:
        parts["all_reduce"] = costs.allreduce_bytes(world_size, payload)
    else:
        parts["reduce_scatter"] = unit
        parts["all_gather"] = (2 if zero_stage == 3 else 1) * unit
    total = sum(parts.values())
    return {**parts, "total": total, "units": total / unit if unit else float(2 + (zero_stage == 3))}


def collectives_per_step(zero_stage: int, n_layers: int, micro_batches: int = 1, defer: bool = False) -> dict:
    """How many collectives each rank issues per optimizer step in :func:`zero_train_worker`.

    Stage 0: one all-reduce; stage 1: one reduce-scatter and one all-gather (all layers packed
    together); stage 2: one reduce-scatter per layer per backward (per micro-batch, or only in the
    last one when ``defer``) and one packed all-gather; stage 3: per micro-batch, one all-gather
    per layer in forward and in backward and one reduce-scatter per layer.
    """
    check_zero_stage(zero_stage)
    integer_at_least(n_layers, "n_layers")
    integer_at_least(micro_batches, "micro_batches")
    if zero_stage == 0:
        return {"all_reduce": 1, "reduce_scatter": 0, "all_gather": 0}
    if zero_stage == 1:
        return {"all_reduce": 0, "reduce_scatter": 1, "all_gather": 1}
    if zero_stage == 2:
        return {"all_reduce": 0, "reduce_scatter": n_layers * (1 if defer else micro_batches), "all_gather": 1}
    return {"all_reduce": 0, "reduce_scatter": n_layers * micro_batches, "all_gather": 2 * n_layers * micro_batches}


# ---- numpy: the optimizer step is elementwise, so it shards -----------------------------------

def adamw_numpy(p, g, m, v, t: int, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
    """One AdamW step in numpy, PyTorch's formula; returns new (p, m, v). Elementwise in every array."""
    if t < 1:
        raise ValueError(f"the step count t starts at 1, got {t}")
    b1, b2 = betas
    p = p * (1 - lr * weight_decay)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / math.sqrt(1 - b2**t) + eps
    return p - lr / (1 - b1**t) * m / denom, m, v


def _lsq_grads(w, Xs, ys):
    return np.stack([X.T @ (X @ w - y) / len(y) for X, y in zip(Xs, ys)])


def ddp_numpy(w0, Xs, ys, steps: int, **adamw):
    """Naive DDP on simulated devices: every device all-reduces (ring) and updates everything."""
    from .collectives import ring_allreduce

    w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    n_dev = len(Xs)
    for t in range(1, steps + 1):
        g = ring_allreduce(_lsq_grads(w, Xs, ys))[0] / n_dev
        w, m, v = adamw_numpy(w, g, m, v, t, **adamw)
    return w


def zero1_numpy(w0, Xs, ys, steps: int, **adamw):
    """ZeRO-1 on simulated devices: reduce-scatter, AdamW on the owned chunk, all-gather.

    Device d keeps moments only for chunk d (1/M of them). Returns (final w on every device, the
    per-device moment lengths).
    """
    from .collectives import all_gather, reduce_scatter

    n_dev, n = len(Xs), len(w0)
    if n % n_dev:
        raise ValueError(f"{n_dev} devices do not divide {n} parameters into equal chunks")
    c = n // n_dev
    w = np.tile(w0, (n_dev, 1))  # every device's copy of the parameters
    m, v = np.zeros((n_dev, c)), np.zeros((n_dev, c))
    for t in range(1, steps + 1):
        grads = np.stack([_lsq_grads(w[d], Xs[d : d + 1], ys[d : d + 1])[0] for d in range(n_dev)])
        owned = reduce_scatter(grads) / n_dev  # device d: the summed gradient of chunk d
        new = np.empty((n_dev, c))
        for d in range(n_dev):
            new[d], m[d], v[d] = adamw_numpy(w[d, d * c : (d + 1) * c], owned[d], m[d], v[d], t, **adamw)
        w = all_gather(new)
    return w, [m[d].size + v[d].size for d in range(n_dev)]


# ---- torch: the model, the data, the sharding units -------------------------------------------

def make_mlp(sizes=DEFAULT_SIZES, seed: int = 0, dtype=None):
    """Linear-Tanh-...-Linear from ``seed`` (identical on every rank); fp32 unless ``dtype``."""
    import torch

    if len(sizes) < 2 or any(int(s) < 1 for s in sizes):
        raise ValueError(f"sizes must list at least two positive layer widths, got {sizes}")
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1]).to(dtype or torch.float32)


def make_regression(n_batches: int, batch: int, sizes=DEFAULT_SIZES, seed: int = 1):
    """``n_batches`` fp32 regression batches (X, y) for :func:`make_mlp`, identical on every rank."""
    import torch

    integer_at_least(n_batches, "n_batches")
    integer_at_least(batch, "batch")
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n_batches, batch, sizes[0], generator=g)
    A = torch.randn(sizes[0], sizes[-1], generator=g) / math.sqrt(sizes[0])
    return X, torch.sin(X @ A) + 0.1 * torch.randn(n_batches, batch, sizes[-1], generator=g)


def n_params(sizes=DEFAULT_SIZES) -> int:
    """Parameters of :func:`make_mlp` (weights and biases)."""
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


class Unit:
    """One sharding unit (a Linear layer): its tensors flattened, padded to ``world`` chunks."""

    def __init__(self, shapes, world: int, rank: int):
        index_below(rank, "rank", integer_at_least(world, "world"))
        self.shapes = [tuple(s) for s in shapes]
        self.numels = [math.prod(s) for s in self.shapes]
        self.numel = sum(self.numels)
        self.padded = -(-self.numel // world) * world
        self.chunk = self.padded // world
        self.lo, self.hi = rank * self.chunk, (rank + 1) * self.chunk
        self.world = world

    def flatten(self, tensors):
        """A new padded flat buffer holding ``tensors`` (zeros where a tensor is None)."""
        import torch

        ref = next(t for t in tensors if t is not None)
        out = torch.zeros(self.padded, dtype=ref.dtype, device=ref.device)
        for v, t in zip(self.views(out), tensors):
            if t is not None:
                v.copy_(t)
        return out

    def views(self, flat):
        """The unit's tensors as views into a padded flat buffer."""
        return [t.view(s) for t, s in zip(flat[: self.numel].split(self.numels), self.shapes)]


def assemble(results) -> list:
    """Full parameters from every rank's ``result["shards"]`` (rank order), without a collective."""
    import torch

    shapes = results[0]["shapes"]
    out = []
    for u, unit_shapes in enumerate(shapes):
        flat = torch.cat([res["shards"][u].reshape(-1) for res in results])
        numels = [math.prod(s) for s in unit_shapes]
        out += [t.reshape(s).clone() for t, s in zip(flat[: sum(numels)].split(numels), unit_shapes)]
    return out


def max_abs_diff(a, b) -> float:
    """Largest elementwise difference between two lists of tensors of the same shapes."""
    if len(a) != len(b):
        raise ValueError(f"lists of different lengths: {len(a)} and {len(b)}")
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def _storage_bytes(tensors) -> int:
    from .memory import tensor_bytes

    return tensor_bytes(tensors)


def _moment_bytes(optimizer) -> tuple[int, int]:
    from .memory import measure_model_state

    held = measure_model_state([], optimizer)
    return held["moments"], held["counters"]


# ---- stage 3: a Linear whose weights exist only while it computes ----------------------------

class _Stage3:
    """Per-job state of the stage-3 layers: counts what is gathered and alive."""

    def __init__(self):
        self.alive = 0
        self.peak = 0

    def gather(self, unit, shard):
        import torch
        import torch.distributed as dist

        full = torch.empty(unit.padded, dtype=shard.dtype, device=shard.device)
        dist.all_gather_single(full, shard.detach().contiguous())
        self.alive += full.numel() * full.element_size()
        self.peak = max(self.peak, self.alive)
        return full

    def free(self, full):
        self.alive -= full.numel() * full.element_size()


def _stage3_function():
    import torch
    import torch.distributed as dist

    class Stage3Linear(torch.autograd.Function):
        """y = x W^T + b with W, b all-gathered from shards in forward and again in backward."""

        @staticmethod
        def forward(ctx, x, shard, unit, state):
            full = state.gather(unit, shard)
            W, b = unit.views(full)
            y = torch.nn.functional.linear(x, W, b)
            state.free(full)
            del full, W, b  # nothing but the shard stays: the gathered weights are freed here
            ctx.save_for_backward(x, shard)
            ctx.unit, ctx.state = unit, state
            return y

        @staticmethod
        def backward(ctx, gy):
            x, shard = ctx.saved_tensors
            unit, state = ctx.unit, ctx.state
            # gathered again: the input's gradient needs W (the first layer's would not, but like
            # FSDP this does not special-case it)
            full = state.gather(unit, shard)
            W, _ = unit.views(full)
            gx = gy @ W
            state.free(full)
            del full, W
            gy2, x2 = gy.reshape(-1, gy.shape[-1]), x.reshape(-1, x.shape[-1])
            flat = unit.flatten([gy2.T @ x2, gy2.sum(0)])  # this rank's full-size gradient of the layer
            g_shard = torch.empty(unit.chunk, dtype=flat.dtype, device=flat.device)
            dist.reduce_scatter_single(g_shard, flat)  # SUM over ranks
            return gx, g_shard.div_(unit.world), None, None

    return Stage3Linear


# ---- one rank's state under a stage: what it holds, how it reduces, steps and gathers ----------

class HandZero:
    """One rank training :func:`make_mlp` with AdamW under ZeRO stage 0-3, by hand (12.1.2).

    ``precision`` is ``"fp32"`` (fp32 weights, gradients and moments; the weights are what AdamW
    updates) or ``"bf16-mixed"`` (bf16 weights and gradients, communicated in bf16; fp32 master
    copy and moments of the owned chunks only). Use: ``zero_grad()``, ``forward(x)``, the loss's
    ``backward()``, then ``step()``; ``sync = False`` keeps stage 2 from reducing (accumulation).
    """

    def __init__(self, zero_stage: int, sizes=DEFAULT_SIZES, precision: str = "fp32", seed: int = 0):
        import torch
        import torch.distributed as dist

        from .worker import device

        check_zero_stage(zero_stage)
        if precision not in STAGE_PRECISIONS:
            raise ValueError(f"precision must be one of {STAGE_PRECISIONS}, got {precision!r}")
        self.stage, self.mixed, self.sync = zero_stage, precision == "bf16-mixed", True
        self.rank, self.world, self.dev = dist.get_rank(), dist.get_world_size(), device()
        self.pdt = torch.bfloat16 if self.mixed else torch.float32
        model = make_mlp(sizes, seed).to(self.dev)
        self.linears = [m for m in model if isinstance(m, torch.nn.Linear)]
        self.units = [Unit([lin.weight.shape, lin.bias.shape], self.world, self.rank) for lin in self.linears]
        self.shard_grads = None  # stages 1-2: this rank's chunk of every layer's reduced gradient
        self.peak_grad_bytes = 0
        if zero_stage == 0:  # every rank holds everything
            self.model = model.to(self.pdt)
            self.weights = list(self.model.parameters())
            opt_on = self.weights
        elif zero_stage in (1, 2):  # full weights, as views into one padded flat buffer per layer
            self.model, self.bufs = model, []
            for lin, u in zip(self.linears, self.units):
                buf = u.flatten([lin.weight.detach(), lin.bias.detach()]).to(self.pdt)
                lin.weight, lin.bias = (torch.nn.Parameter(v) for v in u.views(buf))
                self.bufs.append(buf)
            self.weights = self.bufs
            self.owned = [buf[u.lo : u.hi] for buf, u in zip(self.bufs, self.units)]
            # AdamW updates the owned chunks in place: aliases of the buffers, no copy
            opt_on = [torch.nn.Parameter(o, requires_grad=False) for o in self.owned]
        else:  # only the owned chunks exist; the full model is dropped
            self.model = None
            self.shards = [
                torch.nn.Parameter(u.flatten([lin.weight.detach(), lin.bias.detach()])[u.lo : u.hi].to(self.pdt).clone())
                for lin, u in zip(self.linears, self.units)
            ]
            self.weights = opt_on = self.shards
            self.gathered, self.fn = _Stage3(), _stage3_function()
        self.master = [t.detach().float().clone().requires_grad_(True) for t in opt_on] if self.mixed else []
        self.targets = self.master if self.mixed else opt_on
        self.opt = torch.optim.AdamW(self.targets, **ADAMW)
        if zero_stage == 2:
            for i, (lin, u) in enumerate(zip(self.linears, self.units)):
                hook = self._reduce_hook(i, [lin.weight, lin.bias], u)
                for p in (lin.weight, lin.bias):
                    p.register_post_accumulate_grad_hook(hook)

    # -- stage 2: reduce-scatter a layer's gradient as soon as it is complete, then free it ------
    def _reduce_hook(self, i, params, unit):
        import torch
        import torch.distributed as dist

        offsets = np.cumsum([0] + [u.chunk for u in self.units])
        seen = [0]

        def hook(_param):
            seen[0] += 1
            if seen[0] < len(params):
                return  # the layer's other tensor is not done yet
            seen[0] = 0
            if not self.sync:
                return  # accumulating: keep the full-size gradient until the last micro-batch
            self.peak_grad_bytes = max(self.peak_grad_bytes, self.grad_bytes())
            flat = unit.flatten([p.grad for p in params])
            out = torch.empty(unit.chunk, dtype=flat.dtype, device=flat.device)
            dist.reduce_scatter_single(out, flat)  # SUM: this rank gets its chunk of this layer
            if self.shard_grads is None:
                self.shard_grads = torch.zeros(int(offsets[-1]), dtype=self.pdt, device=self.dev)
            self.shard_grads[offsets[i] : offsets[i + 1]].add_(out.div_(self.world))
            for p in params:
                p.grad = None  # freed: only the chunk survives

        return hook

    def zero_grad(self):
        for t in self.targets + self.weights + (list(self.model.parameters()) if self.model else []):
            t.grad = None
        self.shard_grads = None

    def forward(self, x):
        import torch

        x = x.to(self.dev, self.pdt)
        if self.stage < 3:
            return self.model(x)
        for i, (shard, u) in enumerate(zip(self.shards, self.units)):
            x = self.fn.apply(x, shard, u, self.gathered)
            x = torch.tanh(x) if i < len(self.units) - 1 else x
        return x

    def grad_bytes(self) -> int:
        """Gradient bytes alive now: full-size ones (stages 0-2) and reduced chunks (1-3)."""
        if self.stage == 3:
            return _storage_bytes([s.grad for s in self.shards])
        return _storage_bytes([p.grad for p in self.model.parameters()] + [self.shard_grads])

    def after_backward(self):
        """Call after each backward: records the peak of gradient bytes."""
        self.peak_grad_bytes = max(self.peak_grad_bytes, self.grad_bytes())

    def held(self) -> dict:
        """Bytes of weights and gradients now, of master copy and moments (after a step)."""
        moments, counters = _moment_bytes(self.opt)
        return {"weights": _storage_bytes(self.weights), "gradients": self.grad_bytes(),
                "master": _storage_bytes(self.master), "moments": moments, "counters": counters}

    def step(self):
        """Reduce what is not reduced yet, AdamW on what this rank owns, share the result."""
        import torch
        import torch.distributed as dist

        chunks = [u.chunk for u in self.units]
        with torch.no_grad():
            if self.stage == 0:  # naive DDP: one all-reduce of every gradient
                params = list(self.model.parameters())
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                dist.all_reduce(flat)  # SUM
                grads = [g.view(p.shape) for g, p in zip(flat.div_(self.world).split([p.numel() for p in params]), params)]
            elif self.stage == 1:  # one reduce-scatter of all gradients, packed rank-major
                packed = torch.cat([u.flatten([lin.weight.grad, lin.bias.grad]).view(self.world, u.chunk)
                                    for lin, u in zip(self.linears, self.units)], dim=1)  # row r: every layer's chunk r
                self.shard_grads = torch.empty(packed.shape[1], dtype=self.pdt, device=self.dev)
                dist.reduce_scatter_single(self.shard_grads, packed.reshape(-1))
                grads = self.shard_grads.div_(self.world).split(chunks)
            elif self.stage == 2:  # already reduced during backward
                grads = self.shard_grads.split(chunks)
            else:
                grads = [s.grad for s in self.shards]
            for t, g in zip(self.targets, grads):
                t.grad = g.to(t.dtype)  # the same tensor when the dtypes match
            self.opt.step()
            if self.mixed:  # the bf16 working copy follows the fp32 master copy
                working = self.weights if self.stage in (0, 3) else self.owned
                for w, m in zip(working, self.master):
                    w.copy_(m)
            if self.stage in (1, 2):  # one all-gather returns every updated chunk to every rank
                mine = torch.cat(self.owned)
                gathered = torch.empty(self.world * mine.numel(), dtype=self.pdt, device=self.dev)
                dist.all_gather_single(gathered, mine)
                for buf, col in zip(self.bufs, gathered.view(self.world, -1).split(chunks, dim=1)):
                    buf.copy_(col.reshape(-1))

    def owned_chunks(self) -> list:
        """This rank's chunk of every layer's padded flat parameters (see :func:`assemble`)."""
        if self.stage == 3:
            return [s.detach().clone() for s in self.shards]
        return [u.flatten([lin.weight.detach(), lin.bias.detach()])[u.lo : u.hi].clone()
                for lin, u in zip(self.linears, self.units)]


def zero_train_worker(zero_stage: int, steps: int = 3, batch: int = 16, sizes=DEFAULT_SIZES, precision: str = "fp32",
                      micro_batches: int = 1, defer_reduce: bool = False, seed: int = 0):
    """Train with :class:`HandZero` on the launcher's ranks for ``steps`` steps (12.1.2).

    Each rank takes its ``batch / world`` rows of every (micro-)batch. ``micro_batches`` > 1
    accumulates gradients; with ``defer_reduce`` stage 2 reduces only in the last micro-batch's
    backward (the others keep full-size gradients). Each step runs inside ``span("step")``.

    Returns this rank's owned chunks (``"shards"``; rebuild the model with :func:`assemble`), its
    full parameters where it holds them (stages 0-2), the bytes it holds (``"held"``: weights and
    gradients at the end of the last backward, master and moments after the last step), the peak
    of gradient bytes during backward, the peak of gathered weight bytes (stage 3), the losses.
    """
    import torch
    import torch.distributed as dist

    from .commlog import span
    from .data_parallel import rank_rows

    integer_at_least(micro_batches, "micro_batches")
    if defer_reduce and zero_stage != 2:
        raise ValueError(f"defer_reduce applies to stage 2 only (stages 0-1 reduce once per step anyway), got stage {zero_stage}")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = rank_rows(batch, rank, world)
    z = HandZero(zero_stage, sizes, precision, seed)
    X, Y = make_regression(steps * micro_batches, batch, sizes)
    losses = []
    for k in range(steps):
        with span("step"):
            z.zero_grad()
            total = 0.0
            for j in range(micro_batches):
                z.sync = (not defer_reduce) or j == micro_batches - 1
                idx = k * micro_batches + j
                loss = torch.nn.functional.mse_loss(z.forward(X[idx][mine]).float(), Y[idx][mine].to(z.dev)) / micro_batches
                loss.backward()
                z.after_backward()
                total += loss.item()
            end_of_backward = z.held()
            z.step()
        losses.append(total)
    held = {**z.held(), "weights": end_of_backward["weights"], "gradients": end_of_backward["gradients"]}
    return {
        "stage": zero_stage, "precision": precision, "world": world,
        "n_params": sum(u.numel for u in z.units), "padded": sum(u.padded for u in z.units),
        "shapes": [u.shapes for u in z.units], "shards": z.owned_chunks(),
        "params": None if zero_stage == 3 else [p.detach().clone() for p in z.model.parameters()],
        "held": held, "peak_grad_bytes": z.peak_grad_bytes,
        "peak_gathered_bytes": z.gathered.peak if zero_stage == 3 else None, "losses": losses,
    }


# ---- references: PyTorch's DDP, ZeroRedundancyOptimizer and FSDP2 ------------------------------

def _train_loop(model, opt, steps, batch, sizes, micro_batches=1, context=None):
    """The reference training loop; ``context(last)`` wraps each micro-batch (no_sync and the like)."""
    import contextlib

    import torch
    import torch.distributed as dist

    from .commlog import span
    from .data_parallel import rank_rows
    from .worker import device

    mine = rank_rows(batch, dist.get_rank(), dist.get_world_size())
    X, Y = make_regression(steps * micro_batches, batch, sizes)
    losses = []
    for k in range(steps):
        with span("step"):
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for j in range(micro_batches):
                idx = k * micro_batches + j
                last = j == micro_batches - 1
                with (context(last) if context else contextlib.nullcontext()):
                    out = model(X[idx][mine].to(device()))
                    loss = torch.nn.functional.mse_loss(out, Y[idx][mine].to(device())) / micro_batches
                    loss.backward()
                total += loss.item()
            opt.step()
        losses.append(total)
    return losses


def ddp_reference_worker(steps: int = 3, batch: int = 16, sizes=DEFAULT_SIZES, micro_batches: int = 1, seed: int = 0):
    """Plain PyTorch DDP + AdamW (fp32) on the same data: what every stage must equal.

    With ``micro_batches`` > 1 it accumulates under ``no_sync`` until the last micro-batch.
    """
    import contextlib

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .worker import device

    model = DDP(make_mlp(sizes, seed).to(device()))
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    context = lambda last: contextlib.nullcontext() if last else model.no_sync()
    losses = _train_loop(model, opt, steps, batch, sizes, micro_batches, context)
    return {"params": [p.detach().clone() for p in model.parameters()], "losses": losses}


def zero_redundancy_worker(steps: int = 3, batch: int = 16, sizes=DEFAULT_SIZES, seed: int = 0):
    """PyTorch's ZeRO-1: DDP + ``ZeroRedundancyOptimizer(AdamW)``; measured like the hand stages.

    It partitions whole parameter tensors between ranks (not equal flat chunks), DDP still
    all-reduces every gradient, and the updated parameters are broadcast from their owners.
    """
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .worker import device

    model = DDP(make_mlp(sizes, seed).to(device()))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **ADAMW)
    losses = _train_loop(model, opt, steps, batch, sizes)
    params = list(model.parameters())
    moments, counters = _moment_bytes(opt.optim)
    owned = sum(p.numel() for g in opt.optim.param_groups for p in g["params"])
    return {
        "params": [p.detach().clone() for p in params],
        "held": {"weights": _storage_bytes(params), "moments": moments, "counters": counters},
        "owned_params": owned,
        "losses": losses,
    }


def fsdp2_worker(steps: int = 3, batch: int = 16, sizes=DEFAULT_SIZES, seed: int = 0, micro_batches: int = 1,
                 defer_reduce: bool = False):
    """PyTorch's FSDP2 (``fully_shard`` on every Linear, then on the model), AdamW, fp32.

    With ``micro_batches`` > 1 and ``defer_reduce``, gradient reduction is switched off with
    ``set_requires_gradient_sync(False)`` until the last micro-batch (FSDP2 has no ``no_sync``).

    Returns this rank's local shards (``"local"``, dim-0 slices of every parameter; concatenate
    over ranks to rebuild, see :func:`assemble_dim0`), the bytes it holds and the losses.
    """
    import contextlib

    import torch
    from torch.distributed.fsdp import fully_shard

    from .worker import device

    model = make_mlp(sizes, seed).to(device())
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)

    def context(last):
        model.set_requires_gradient_sync(last or not defer_reduce)
        return contextlib.nullcontext()

    losses = _train_loop(model, opt, steps, batch, sizes, micro_batches, context)
    params = list(model.parameters())
    local = [p.to_local() for p in params]
    moments = [v.to_local() for st in opt.state.values() for v in st.values() if hasattr(v, "to_local")]
    return {
        "local": [t.detach().clone() for t in local],
        "held": {
            "weights": sum(t.numel() * t.element_size() for t in local),
            "gradients": sum(p.grad.to_local().numel() * 4 for p in params if p.grad is not None),
            "moments": sum(t.numel() * t.element_size() for t in moments),
        },
        "losses": losses,
    }


def per_step_comm(run, rank: int = 0) -> dict:
    """Per training step on one rank: calls, payload bytes and ring-model bytes sent, by op.

    Only the collectives issued inside the workers' ``span("step")`` count (DDP's set-up
    broadcasts, for example, do not); totals are divided by the number of steps.
    """
    from .commlog import summarize

    steps = [s for s in run.spans[rank] if s.name == "step"]
    if not steps:
        raise ValueError("this run recorded no 'step' spans: run a worker from helpers.zero")
    ops = [o for o in run.comm[rank] if any(s.start <= o.t <= s.end for s in steps)]
    return {op: {k: v / len(steps) for k, v in row.items()} for op, row in summarize(ops).items()}


def assemble_dim0(results, key: str = "local") -> list:
    """Full parameters from dim-0 shards returned by every rank (FSDP2's ``Shard(0)`` layout)."""
    import torch

    return [torch.cat([res[key][i] for res in results], dim=0) for i in range(len(results[0][key]))]


# ---- the identity on the ranks: all-reduce = reduce-scatter + all-gather ------------------------

def identity_worker(numel: int = 1 << 12, seed: int = 0):
    """On this rank: all-reduce one random tensor, and reduce-scatter + all-gather a copy (12.1.2).

    Returns both results and the max difference; the launcher logs the bytes of each call.
    """
    import torch
    import torch.distributed as dist

    from .worker import device

    world, rank = dist.get_world_size(), dist.get_rank()
    equal_parts(numel, world, "world size {k} does not divide {n} elements into equal chunks")
    g = torch.Generator().manual_seed(seed + rank)
    x = torch.randint(-100, 100, (numel,), generator=g).to(torch.float32).to(device())  # integers: sums are exact
    ar = x.clone()
    dist.all_reduce(ar)
    piece = torch.empty(numel // world, device=device())
    dist.reduce_scatter_single(piece, x)
    rs_ag = torch.empty(numel, device=device())
    dist.all_gather_single(rs_ag, piece)
    return {"all_reduce": ar, "rs_ag": rs_ag, "piece": piece, "equal": bool(torch.equal(ar, rs_ag))}
