"""3D parallelism for real: a tiny transformer trained on DP x PP x TP ranks (P.11, 12.4.1).

The pieces are the hand-written ones of the earlier sections:

* the rank grid and its groups: :class:`helpers.mesh.Mesh` (outermost DP, then PP, innermost
  TP, so a TP group is consecutive ranks, as on a server) and :func:`helpers.mesh.build_groups`;
* tensor parallelism inside each stage: :class:`helpers.tensor_parallel.ParallelBlock`
  (column-parallel QKV and fc1, row-parallel output projection and fc2, all-reduces over the
  TP group), built from the full block weights of :func:`helpers.tensor_parallel.make_block_params`;
* pipeline parallelism across stages: each stage holds :func:`helpers.pipeline_parallel.layer_ranges`
  of the blocks and runs the per-device order of :func:`helpers.pipeline_schedule.op_orders`
  (1F1B or GPipe) with :func:`helpers.pipeline_parallel.run_schedule`, receiving activations and
  sending gradients point to point to the rank with the same (dp, tp) in the neighbouring stage;
* data parallelism: one all-reduce (sum) of the flattened gradients over the DP group.

Spans ``F``, ``B``, ``recv`` and ``DP all-reduce`` (:func:`helpers.launcher.commlog.span`) let
:func:`helpers.plots.timeline` draw each rank's step.

The loss is the mean squared error over the whole global batch: micro-batch j on replica d
contributes its sum of squared errors divided by the global element count, so summing the
gradients over micro-batches and replicas gives exactly the single-process full-batch gradient,
and plain SGD then gives the same parameters (:func:`reference_training`). Everything runs in
float64, on CPU ranks (gloo) or one GPU per rank (NCCL) through :func:`helpers.launcher.worker.device`.

Activations are ``(s, b, h)``, sequence first (as in :mod:`helpers.tensor_parallel`); data
parallelism and micro-batches split the batch dimension b.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from .launcher.commlog import as_tuples, mark, ops_since, span
from .launcher.worker import device
from .mesh import Mesh, build_groups
from .pipeline_parallel import layer_ranges, run_schedule
from .pipeline_schedule import op_orders
from .tensor_parallel.block import BlockConfig, ParallelBlock, make_block_params, reference_block, shard_block_params
from .validate import integer_at_least

SCHEDULES = ("1f1b", "gpipe")


def default_config() -> BlockConfig:
    """The tiny block of the demo: h 16, 4 heads, FFN 32, no dropout."""
    return BlockConfig(h=16, heads=4, ffn=32)


def make_batch(batch: int, seq: int, h: int, seed: int = 1):
    """Inputs X and targets Y, both (seq, batch, h), float64; the same on every rank for a seed."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(seq, batch, h, generator=g, dtype=torch.float64)
    Y = torch.randn(seq, batch, h, generator=g, dtype=torch.float64)
    return X, Y


def check_layout(dp: int, pp: int, tp: int, n_blocks: int, batch: int, m: int, cfg: BlockConfig) -> None:
    """ValueError unless every degree divides what it partitions (P.11's constraints)."""
    for name, v in (("dp", dp), ("pp", pp), ("tp", tp), ("n_blocks", n_blocks), ("batch", batch), ("m", m)):
        integer_at_least(v, name)
    if n_blocks % pp:
        raise ValueError(f"PP={pp} must divide the {n_blocks} blocks")
    if batch % (dp * m):
        raise ValueError(f"DP x m = {dp} x {m} must divide the global batch of {batch}")
    if cfg.heads % tp or cfg.ffn % tp:
        raise ValueError(f"TP={tp} must divide the {cfg.heads} heads and the FFN width {cfg.ffn}")
    if cfg.p_drop:
        raise ValueError("the 3D demo compares with one process exactly: use a config without dropout")


@contextmanager
def _recorded(into: list):
    """Append to ``into`` the collectives and p2p calls made inside the block."""
    at = mark()
    yield
    into += as_tuples(ops_since(at))


class _StageStep:
    """One rank's stage during one step, the steps of :func:`helpers.pipeline_parallel.run_schedule`:
    the forward and backward of its blocks on micro-batch j (TP collectives inside), the
    point-to-point hand-offs with the rank of the same (dp, tp) in the neighbouring stages, and
    ``comm``, the calls of each phase (``tp``, ``pp``; ``dp`` is added by the worker)."""

    def __init__(self, blocks, X, Y, coord, pp_ranks, pp, m, mb, lo, scale):
        self.blocks, self.X, self.Y, self.pp_ranks, self.m, self.mb, self.lo, self.scale = (
            blocks, X, Y, pp_ranks, m, mb, lo, scale)
        self.stage, self.last = coord["pp"], coord["pp"] == pp - 1
        self.state, self.sends, self.loss_sum = {}, [], 0.0
        self.comm = {"tp": [], "pp": []}

    def _cols(self, j: int) -> slice:
        return slice(self.lo + j * self.mb, self.lo + (j + 1) * self.mb)

    def p2p(self, sends, recvs):
        """Sends (``dist.isend``, waited for after the step) and blocking receives, tagged j
        (activations) and m + j (gradients)."""
        import torch.distributed as dist


        out = []
        with _recorded(self.comm["pp"]):
            for kind, _, j, t in sends:
                dst, tag = (self.stage + 1, j) if kind == "F" else (self.stage - 1, self.m + j)
                self.sends.append((dist.isend(t, dst=self.pp_ranks[dst], tag=tag), t))
            for kind, _, j in recvs:
                if (kind == "F" and self.stage == 0) or (kind == "B" and self.last):
                    out.append(None)  # the first stage reads the batch; the last computes the loss
                    continue
                src, tag = (self.stage - 1, j) if kind == "F" else (self.stage + 1, self.m + j)
                x = self.X.new_empty(self.X.shape[0], self.mb, self.X.shape[2])
                with span("recv"):
                    dist.recv(x, src=self.pp_ranks[src], tag=tag)
                out.append(x)
        return out

    def forward(self, c: int, j: int, x):

        x = self.X[:, self._cols(j)] if self.stage == 0 else x.requires_grad_(True)
        with _recorded(self.comm["tp"]), span("F"):
            out = x
            for b in self.blocks:
                out = b(out)
            if self.last:
                out = ((out - self.Y[:, self._cols(j)]) ** 2).sum() * self.scale
                self.loss_sum += out.item()
        self.state[j] = (x, out)
        return None if self.last else out.detach()

    def backward(self, c: int, j: int, g):

        x, out = self.state.pop(j)
        with _recorded(self.comm["tp"]), span("B"):
            out.backward(g)
        return x.grad if self.stage > 0 else None


def three_d_worker(dp: int = 2, pp: int = 2, tp: int = 2, steps: int = 3, m: int = 2, batch: int = 8, seq: int = 8,
                   n_blocks: int = 4, cfg: BlockConfig | None = None, lr: float = 0.05, seed: int = 0,
                   schedule: str = "1f1b") -> dict:
    """``steps`` SGD steps of the tiny transformer on a DP x PP x TP grid of ranks (world = dp pp tp).

    Returns this rank's coordinate and group members, its per-step partial loss (last stage only,
    else None), its parameter shards after training ``{block: {name: tensor}}``, and the
    collectives it issued in each phase of the last step: ``tp`` (inside the forward and
    backward), ``pp`` (sends and receives), ``dp`` (the gradient all-reduce). Each step runs the
    schedule's order with :func:`helpers.pipeline_parallel.run_schedule`.
    """
    import torch.distributed as dist

    cfg = cfg or default_config()
    check_layout(dp, pp, tp, n_blocks, batch, m, cfg)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    mesh = Mesh.of(dp=dp, pp=pp, tp=tp)
    rank = dist.get_rank()
    coord = mesh.coord(rank)
    groups = build_groups(mesh)
    stage = coord["pp"]
    pp_ranks = mesh.group_of(rank, "pp")  # the same (dp, tp) in every stage
    dev = device()
    mine = list(layer_ranges(n_blocks, pp)[stage])
    blocks = [ParallelBlock({k: v.to(dev) for k, v in make_block_params(cfg, seed + i).items()}, cfg, group=groups["tp"])
              for i in mine]
    params = [p for b in blocks for p in b.parameters()]
    X, Y = (t.to(dev) for t in make_batch(batch, seq, cfg.h, seed + 1000))
    per_replica, mb = batch // dp, batch // (dp * m)
    scale = 1.0 / (batch * seq * cfg.h)
    order = op_orders(schedule, pp, m)[stage]
    losses, comm = [], {}
    for _ in range(steps):
        for p in params:
            p.grad = None
        step = _StageStep(blocks, X, Y, coord, pp_ranks, pp, m, mb, coord["dp"] * per_replica, scale)
        run_schedule(order, step)
        for work, _ in step.sends:
            work.wait()
        # data parallelism: one all-reduce of every gradient, flattened, over the DP group
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        step.comm["dp"] = []
        with _recorded(step.comm["dp"]):
            if dp > 1:
                with span("DP all-reduce"):
                    dist.all_reduce(flat, group=groups["dp"])
        with torch.no_grad():
            k = 0
            for p in params:
                n = p.numel()
                p -= lr * flat[k:k + n].view_as(p)
                k += n
        losses.append(step.loss_sum if step.last else None)
        comm = step.comm
    return {"rank": rank, "coord": coord, "groups": {n: mesh.group_of(rank, n) for n in mesh.names},
            "blocks": mine, "losses": losses,
            "params": {i: {k: v.detach().clone() for k, v in b.named_shards().items()} for i, b in zip(mine, blocks)},
            "comm": comm}


def reference_training(steps: int = 3, batch: int = 8, seq: int = 8, n_blocks: int = 4, cfg: BlockConfig | None = None,
                       lr: float = 0.05, seed: int = 0) -> dict:
    """The same model, data, loss and SGD on one process: losses per step and the final full weights."""
    cfg = cfg or default_config()
    P = [{k: v.clone().requires_grad_() for k, v in make_block_params(cfg, seed + i).items()} for i in range(n_blocks)]
    X, Y = make_batch(batch, seq, cfg.h, seed + 1000)
    losses = []
    for _ in range(steps):
        out = X
        for Pi in P:
            out = reference_block(out, Pi, cfg)
        loss = ((out - Y) ** 2).sum() / (batch * seq * cfg.h)
        grads = torch.autograd.grad(loss, [v for Pi in P for v in Pi.values()])
        with torch.no_grad():
            for v, g in zip((v for Pi in P for v in Pi.values()), grads):
                v -= lr * g
        losses.append(loss.item())
    return {"losses": losses, "params": [{k: v.detach().clone() for k, v in Pi.items()} for Pi in P]}


def global_losses(results: list) -> list:
    """Per-step loss of the whole batch: the last stage's partial losses summed over DP (TP rank 0)."""
    parts = [r["losses"] for r in results if r["losses"][0] is not None and r["coord"]["tp"] == 0]
    if not parts:
        raise ValueError("no last-stage results to sum")
    return [sum(p[k] for p in parts) for k in range(len(parts[0]))]


def max_param_diff(results: list, ref: dict, tp: int) -> float:
    """Largest |difference| between every rank's shards and the reference's full weights, sharded
    the same way (:func:`helpers.tensor_parallel.shard_block_params`)."""
    worst = 0.0
    for r in results:
        t_rank = r["coord"]["tp"]
        for i, shards in r["params"].items():
            want = shard_block_params(ref["params"][i], t_rank, tp)
            for k, v in shards.items():
                worst = max(worst, float((v.cpu() - want[k]).abs().max()))
    return worst


def expected_comm(dp: int, pp: int, tp: int, m: int, n_blocks: int) -> dict:
    """Collectives one rank issues per step: TP all-reduces (2 forward + 2 backward per block and
    micro-batch, Megatron's f and g), PP point-to-point calls (a receive and a send per micro-batch
    and direction on an inner stage, half that on the ends), DP all-reduces (one, flattened)."""
    per_stage = n_blocks // pp
    return {"tp all_reduce": 4 * per_stage * m if tp > 1 else 0,
            "pp calls, first/last stage": 2 * m if pp > 1 else 0,
            "pp calls, inner stage": 4 * m if pp > 2 else None,
            "dp all_reduce": 1 if dp > 1 else 0}


def shard_numel(n_blocks: int, pp: int, tp: int, stage: int, cfg: BlockConfig | None = None) -> int:
    """Parameters one rank of ``stage`` holds (its TP shards of its stage's blocks)."""
    cfg = cfg or default_config()
    full = make_block_params(cfg, 0)
    per_block = sum(v.numel() for v in shard_block_params(full, 0, tp).values())
    return per_block * len(layer_ranges(n_blocks, pp)[stage])


def expected_bytes(dp: int, pp: int, tp: int, m: int, n_blocks: int = 4, batch: int = 8, seq: int = 8,
                   cfg: BlockConfig | None = None, stage: int = 0) -> dict:
    """Payload bytes (float64) one rank of ``stage`` hands to each kind of call per step.

    TP: 4 all-reduces of a (seq, batch/(dp m), h) activation per block and micro-batch; PP: one
    such activation sent per micro-batch forward (all stages but the last) and one gradient
    backward (all but the first); DP: one all-reduce of all the rank's parameter gradients.
    """
    cfg = cfg or default_config()
    check_layout(dp, pp, tp, n_blocks, batch, m, cfg)
    act = seq * (batch // (dp * m)) * cfg.h * 8
    blocks = n_blocks // pp
    sends = (stage < pp - 1) + (stage > 0)
    return {"tp all_reduce": 4 * blocks * m * act if tp > 1 else 0,
            "pp send": sends * m * act if pp > 1 else 0,
            "dp all_reduce": shard_numel(n_blocks, pp, tp, stage, cfg) * 8 if dp > 1 else 0}


def measured_bytes(result: dict) -> dict:
    """The same three quantities summed from what the rank recorded in its last step."""
    c = result["comm"]
    return {"tp all_reduce": sum(b for op, b, _ in c["tp"] if op == "all_reduce"),
            "pp send": sum(b for op, b, _ in c["pp"] if op == "send"),
            "dp all_reduce": sum(b for op, b, _ in c["dp"] if op == "all_reduce")}
