"""ZeRO stages 0-3 by hand on one rank (12.1.2): :class:`HandZero` and what it is built from.

On a small MLP (:func:`make_mlp`) with AdamW:

* stage 0: naive DDP by hand (one all-reduce of the flattened gradients, full optimizer);
* stage 1: full gradients after backward, one ``reduce_scatter_single`` of all of them, AdamW on
  the chunk this rank owns, one ``all_gather_single`` of the updated parameters;
* stage 2: gradients reduce-scattered layer by layer *during* backward (post-accumulate-grad
  hooks) and the full-size gradients freed at once; the same step and all-gather as stage 1;
* stage 3: only parameter chunks at rest; each layer all-gathers its weights just before its
  forward, frees them after, gathers them again in backward, and reduce-scatters its gradient
  (``Stage3Linear``, an autograd function).

Every layer (``nn.Linear``) is one sharding unit, as in FSDP (:class:`Unit`): its weight and bias
flattened, padded to a multiple of the world size, rank r owning the r-th equal chunk;
:func:`assemble` rebuilds the full parameters from every rank's chunks. The training run on the
launcher's ranks is :func:`helpers.zero.zero_train_worker`.
"""
from __future__ import annotations

import math

import numpy as np

from ..launcher.worker import device
from ..memory import measure_model_state, tensor_bytes
from ..validate import index_below, integer_at_least, one_of
from ..validate import zero_stage as check_zero_stage

DEFAULT_SIZES = (8, 32, 32, 4)  # 288 + 1056 + 132 = 1476 parameters; every layer divides by 1, 2, 3, 4, 6, 12
ADAMW = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}
STAGE_PRECISIONS = ("fp32", "fp64", "bf16-mixed")


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


def assemble(results, key: str = "shards") -> list:
    """Full parameters from every rank's ``result["shards"]`` (rank order), without a collective;
    ``key="grad_shards"`` rebuilds the reduced gradients of the last step the same way."""
    import torch

    shapes = results[0]["shapes"]
    out = []
    for u, unit_shapes in enumerate(shapes):
        flat = torch.cat([res[key][u].reshape(-1) for res in results])
        numels = [math.prod(s) for s in unit_shapes]
        out += [t.reshape(s).clone() for t, s in zip(flat[: sum(numels)].split(numels), unit_shapes)]
    return out


def max_abs_diff(a, b) -> float:
    """Largest elementwise difference between two lists of tensors of the same shapes."""
    if len(a) != len(b):
        raise ValueError(f"lists of different lengths: {len(a)} and {len(b)}")
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def moment_bytes(optimizer) -> tuple[int, int]:
    """Bytes of an optimizer's moment tensors, and of its scalar step counters."""
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
    updates), ``"fp64"`` (the same in float64: rounding small enough to check gradients against
    DDP's to 1e-12) or ``"bf16-mixed"`` (bf16 weights and gradients, communicated in bf16; fp32 master
    copy and moments of the owned chunks only). Use: ``zero_grad()``, ``forward(x)``, the loss's
    ``backward()``, then ``step()``; ``sync = False`` keeps stage 2 from reducing (accumulation).

    What a rank holds is set up by one of :meth:`_hold_everything` (stage 0),
    :meth:`_hold_flat_buffers` (stages 1-2) and :meth:`_hold_owned_chunks` (stage 3); a step is
    :meth:`_reduced_gradients`, :meth:`_adamw_on_owned` and, in stages 1-2,
    :meth:`_all_gather_updates`.
    """

    def __init__(self, zero_stage: int, sizes=DEFAULT_SIZES, precision: str = "fp32", seed: int = 0):
        import torch
        import torch.distributed as dist


        check_zero_stage(zero_stage)
        one_of(precision, "precision", STAGE_PRECISIONS)
        self.stage, self.mixed, self.sync = zero_stage, precision == "bf16-mixed", True
        self.rank, self.world, self.dev = dist.get_rank(), dist.get_world_size(), device()
        self.pdt = {"fp32": torch.float32, "fp64": torch.float64, "bf16-mixed": torch.bfloat16}[precision]
        model = make_mlp(sizes, seed).to(self.dev)
        self.linears = [m for m in model if isinstance(m, torch.nn.Linear)]
        self.units = [Unit([lin.weight.shape, lin.bias.shape], self.world, self.rank) for lin in self.linears]
        self.shard_grads = None  # stages 1-2: this rank's chunk of every layer's reduced gradient
        self.reduced = []  # the averaged gradients the last step fed to AdamW
        self.peak_grad_bytes = 0
        hold = {0: self._hold_everything, 1: self._hold_flat_buffers, 2: self._hold_flat_buffers, 3: self._hold_owned_chunks}
        updated = hold[zero_stage](model)  # the tensors AdamW updates on this rank
        self.master = [t.detach().float().clone().requires_grad_(True) for t in updated] if self.mixed else []
        self.targets = self.master if self.mixed else updated
        self.opt = torch.optim.AdamW(self.targets, **ADAMW)
        if zero_stage == 2:
            self._install_reduce_hooks()

    # -- what a rank holds ---------------------------------------------------------------------
    def _hold_everything(self, model) -> list:
        """Stage 0: every rank holds the whole model and updates all of it."""
        self.model = model.to(self.pdt)
        self.weights = list(self.model.parameters())
        return self.weights

    def _hold_flat_buffers(self, model) -> list:
        """Stages 1-2: full weights, as views into one padded flat buffer per layer; AdamW updates
        the owned chunks in place (aliases of the buffers, no copy)."""
        import torch

        self.model, self.bufs = model, []
        for lin, u in zip(self.linears, self.units):
            buf = u.flatten([lin.weight.detach(), lin.bias.detach()]).to(self.pdt)
            lin.weight, lin.bias = (torch.nn.Parameter(v) for v in u.views(buf))
            self.bufs.append(buf)
        self.weights = self.bufs
        self.owned = [buf[u.lo : u.hi] for buf, u in zip(self.bufs, self.units)]
        return [torch.nn.Parameter(o, requires_grad=False) for o in self.owned]

    def _hold_owned_chunks(self, model) -> list:
        """Stage 3: only the owned chunks exist; the full model is dropped."""
        import torch

        self.model = None
        self.shards = [
            torch.nn.Parameter(u.flatten([lin.weight.detach(), lin.bias.detach()])[u.lo : u.hi].to(self.pdt).clone())
            for lin, u in zip(self.linears, self.units)
        ]
        self.weights = self.shards
        self.gathered, self.fn = _Stage3(), _stage3_function()
        return self.shards

    # -- stage 2: reduce-scatter a layer's gradient as soon as it is complete, then free it ------
    def _install_reduce_hooks(self):
        for i, (lin, u) in enumerate(zip(self.linears, self.units)):
            hook = self._reduce_hook(i, [lin.weight, lin.bias], u)
            for p in (lin.weight, lin.bias):
                p.register_post_accumulate_grad_hook(hook)

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

    # -- a training step -----------------------------------------------------------------------
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

    def step(self):
        """Reduce what is not reduced yet, AdamW on what this rank owns, share the result."""
        import torch

        with torch.no_grad():
            grads = self._reduced_gradients()
            self.reduced = [g.detach().clone() for g in grads]
            self._adamw_on_owned(grads)
            if self.stage in (1, 2):
                self._all_gather_updates()

    def _reduced_gradients(self) -> list:
        """The averaged gradients of what this rank updates, one tensor per AdamW target."""
        import torch
        import torch.distributed as dist

        chunks = [u.chunk for u in self.units]
        if self.stage == 0:  # naive DDP: one all-reduce of every gradient
            params = list(self.model.parameters())
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)  # SUM
            return [g.view(p.shape) for g, p in zip(flat.div_(self.world).split([p.numel() for p in params]), params)]
        if self.stage == 1:  # one reduce-scatter of all gradients, packed rank-major
            packed = torch.cat([u.flatten([lin.weight.grad, lin.bias.grad]).view(self.world, u.chunk)
                                for lin, u in zip(self.linears, self.units)], dim=1)  # row r: every layer's chunk r
            self.shard_grads = torch.empty(packed.shape[1], dtype=self.pdt, device=self.dev)
            dist.reduce_scatter_single(self.shard_grads, packed.reshape(-1))
            return self.shard_grads.div_(self.world).split(chunks)
        if self.stage == 2:  # already reduced during backward
            return self.shard_grads.split(chunks)
        return [s.grad for s in self.shards]

    def _adamw_on_owned(self, grads):
        """AdamW on the owned tensors (the fp32 master copy under mixed precision, which the bf16
        working copy then follows)."""
        for t, g in zip(self.targets, grads):
            t.grad = g.to(t.dtype)  # the same tensor when the dtypes match
        self.opt.step()
        if self.mixed:
            working = self.weights if self.stage in (0, 3) else self.owned
            for w, m in zip(working, self.master):
                w.copy_(m)

    def _all_gather_updates(self):
        """Stages 1-2: one all-gather returns every updated chunk to every rank's flat buffers."""
        import torch
        import torch.distributed as dist

        chunks = [u.chunk for u in self.units]
        mine = torch.cat(self.owned)
        gathered = torch.empty(self.world * mine.numel(), dtype=self.pdt, device=self.dev)
        dist.all_gather_single(gathered, mine)
        for buf, col in zip(self.bufs, gathered.view(self.world, -1).split(chunks, dim=1)):
            buf.copy_(col.reshape(-1))

    # -- what a rank holds, measured -------------------------------------------------------------
    def grad_bytes(self) -> int:
        """Gradient bytes alive now: full-size ones (stages 0-2) and reduced chunks (1-3)."""
        if self.stage == 3:
            return tensor_bytes([s.grad for s in self.shards])
        return tensor_bytes([p.grad for p in self.model.parameters()] + [self.shard_grads])

    def after_backward(self):
        """Call after each backward: records the peak of gradient bytes."""
        self.peak_grad_bytes = max(self.peak_grad_bytes, self.grad_bytes())

    def held(self) -> dict:
        """Bytes of weights and gradients now, of master copy and moments (after a step)."""
        moments, counters = moment_bytes(self.opt)
        return {"weights": tensor_bytes(self.weights), "gradients": self.grad_bytes(),
                "master": tensor_bytes(self.master), "moments": moments, "counters": counters}

    def reduced_chunks(self) -> list:
        """This rank's chunk of every layer's averaged gradient in the last step (see
        :func:`assemble` with ``key="grad_shards"``): what must equal DDP's gradient there."""
        if self.stage == 0:  # full gradients, one per parameter tensor: cut this rank's chunk
            it = iter(self.reduced)
            return [u.flatten([next(it) for _ in u.shapes])[u.lo : u.hi].clone() for u in self.units]
        return [g.clone() for g in self.reduced]

    def owned_chunks(self) -> list:
        """This rank's chunk of every layer's padded flat parameters (see :func:`assemble`)."""
        if self.stage == 3:
            return [s.detach().clone() for s in self.shards]
        return [u.flatten([lin.weight.detach(), lin.bias.detach()])[u.lo : u.hi].clone()
                for lin, u in zip(self.linears, self.units)]
