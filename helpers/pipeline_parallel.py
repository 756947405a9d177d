"""A real pipeline on the launcher's ranks: an MLP cut into stages, micro-batches, p2p sends (P.9, 12.2.2).

Rank ``d`` owns chunk ``c`` = virtual stage ``c*p + d`` (``v`` chunks per rank; v = 1 is the plain
one-stage-per-rank pipeline). The ranks run exactly the per-device orders of
:func:`helpers.pipeline_schedule.op_orders` (GPipe, 1F1B, interleaved 1F1B, ZB-H1) with
:func:`run_schedule`, the one executor of the workbook's pipelines (:mod:`helpers.three_d`'s and
:mod:`helpers.fake_world.step`'s steps run on it too; the fake world's interleaved steps run on
:func:`run_steps`, Megatron-LM's batching of the same order):

* ``F``: receive the activation from the previous stage (``dist.recv``), run the chunk, send the
  output to the next stage (``dist.isend``, not waited for, so no two ranks can block each other);
* ``B``: receive the gradient of the output, backpropagate, send the gradient of the input back.
  Without the B/W split this is ``backward()`` and also accumulates the weight gradients;
* ``W`` (ZB-H1): the weight gradients alone, from what B kept: for each linear layer
  ``dW = dZ^T A`` and ``db = sum(dZ)``, where ``A`` is the layer's input and ``dZ`` the gradient
  of its output, computed by B (which asks autograd only for input and ``dZ`` gradients, so it
  computes no weight gradient).

Messages are matched by tag (kind, virtual stage, micro-batch), which gloo honours. (NCCL ignores
tags and matches in issue order; the non-interleaved schedules still match there, because each
direction between two ranks carries one kind of message in micro-batch order.)

Per-op time is measured with :func:`helpers.launcher.commlog.span` (names ``F``, ``B``, ``W``; ``recv`` for
time spent waiting on a receive), so ``helpers.plots.timeline(run)`` draws it and
:func:`timeline_from_run` turns it into a :class:`helpers.pipeline_schedule.Timeline`, whose bubble
and makespan are computed by the same code as the simulator's. Stage compute time can be padded
with a sleep per op (``f_s``, ``b_s``, ``w_s`` seconds): on a machine with fewer cores than
ranks, real compute on four ranks at once would be slowed by the fight for cores, while a sleep
stands for a stage's compute time without taking a core.

The loss is the full-batch mean squared error; micro-batch j contributes its sum of squared
errors divided by the whole batch size, so the accumulated gradients equal one process's
full-batch gradients (:func:`reference_grads`).
"""
from __future__ import annotations

import time

from .costs import layer_forward_flops, layer_params, mlp_forward_flops  # noqa: F401 (12.2.2's worked example)
from .launcher.commlog import span
from .launcher.worker import device
from .pipeline_schedule import KINDS, check_schedule, from_records, handoff_delays, op_orders, per_stage, simulate
from .validate import equal_parts, integer_at_least, positive_number

TORCH_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


# ---- the model and the data ----------------------------------------------------------------------

def make_layers(n_layers: int = 8, width: int = 16, seed: int = 0):
    """``n_layers`` float64 linear layers: ``n_layers-1`` of width x width, then width -> 1.

    tanh follows every layer except the last. The same seed gives the same weights on every rank.
    """
    import torch

    integer_at_least(n_layers, "n_layers")
    integer_at_least(width, "width")
    torch.manual_seed(seed)
    return [torch.nn.Linear(width, width if i < n_layers - 1 else 1, dtype=torch.float64) for i in range(n_layers)]


def make_data(batch: int = 32, width: int = 16, seed: int = 1):
    """A regression batch ``(X, y)``: ``X`` is batch x width, ``y`` is batch x 1."""
    import torch

    g = torch.Generator().manual_seed(seed)
    X = torch.randn(batch, width, generator=g, dtype=torch.float64)
    y = torch.sin(X.sum(-1, keepdim=True)) + 0.1 * torch.randn(batch, 1, generator=g, dtype=torch.float64)
    return X, y


def layer_ranges(n_layers: int, p: int, v: int = 1) -> list[range]:
    """Layers of each virtual stage 0..p*v-1 (equal counts; ValueError unless p*v divides n_layers)."""
    return equal_parts(n_layers, p * v, "p*v = {k} virtual stages must divide the {n} layers evenly")


def forward_layers(layers, idx, x, n_layers: int):
    """Run layers ``idx`` on ``x``; return output, each linear's input ``A`` and output ``Z``."""
    import torch

    a, acts, zs = x, [], []
    for i in idx:
        acts.append(a)
        z = layers[i](a)
        zs.append(z)
        a = torch.tanh(z) if i < n_layers - 1 else z
    return a, acts, zs


def reference_grads(n_layers: int = 8, width: int = 16, batch: int = 32, seed: int = 0):
    """One process, whole batch: ``{layer: (dW, db)}`` and the loss, the pipeline's reference."""
    layers = make_layers(n_layers, width, seed)
    X, y = make_data(batch, width, seed + 1)
    out, _, _ = forward_layers(layers, range(n_layers), X, n_layers)
    loss = ((out - y) ** 2).sum() / batch
    loss.backward()
    return {i: (l.weight.grad.clone(), l.bias.grad.clone()) for i, l in enumerate(layers)}, loss.item()


def max_grad_diff(grads: dict, ref: dict) -> float:
    """Largest absolute difference between two ``{layer: (dW, db)}`` dicts over shared layers."""
    if not grads:
        raise ValueError("no gradients to compare")
    return max(float((g - r).abs().max()) for i in grads for g, r in zip(grads[i], ref[i]))


# ---- the arithmetic of 12.2.2's worked example -----------------------------------------------------
# layer_params, mlp_forward_flops and layer_forward_flops are helpers.costs' (imported above).

def stage_weight_bytes(h: int, ffn: int, layers: int, bytes_per_param: int = 2) -> int:
    """Weight bytes of a pipeline stage holding ``layers`` transformer layers (BF16: 2 bytes)."""
    integer_at_least(layers, "layers")
    positive_number(bytes_per_param, "bytes_per_param")
    return layers * layer_params(h, ffn) * bytes_per_param


def handoff_bytes(seq: int, micro_batch: int, h: int, bytes_per_value: int = 2) -> int:
    """Bytes one stage sends the next per micro-batch: the activation, seq x micro_batch x h values."""
    for name, v in (("seq", seq), ("micro_batch", micro_batch), ("h", h)):
        integer_at_least(v, name)
    positive_number(bytes_per_value, "bytes_per_value")
    return seq * micro_batch * h * bytes_per_value


# ---- the split backward on one layer (12.2.2) -----------------------------------------------------

def split_backward_linear(x, weight, bias, grad_out):
    """B then W for one linear layer ``y = x W^T + b``, by hand.

    B: ``dx = dy W`` needs the weight and the output gradient, not ``x``.
    W: ``dW = dy^T x`` and ``db = sum(dy)`` need ``x`` and ``dy``, and nothing downstream waits for
    them, so they can run any time after B. Returns ``(dx, dW, db)``.
    """
    if x.shape[-1] != weight.shape[1] or grad_out.shape[-1] != weight.shape[0]:
        raise ValueError(f"shapes do not fit a linear layer: x {tuple(x.shape)}, W {tuple(weight.shape)}, dy {tuple(grad_out.shape)}")
    dx = grad_out @ weight  # B: the input gradient, sent to the previous stage at once
    dW = grad_out.T @ x  # W: may wait
    db = grad_out.sum(0)
    return dx, dW, db


# ---- the executor: one rank walks its order (here, helpers.three_d, helpers.fake_world.step) -------------

# the neighbour each op receives its input from and sends its output to: activations flow to the
# next stage, gradients back to the previous one
_RECEIVES_FROM = {"F": "previous", "B": "next"}
_SENDS_TO = {"F": "next", "B": "previous"}


def run_schedule(order, steps, *, paired: bool = False) -> None:
    """Run one rank's ``order`` (its list of :func:`helpers.pipeline_schedule.op_orders`) with the
    caller's ``steps``: for each ``(kind, chunk, micro_batch)``, receive the op's input, run it,
    send its output.

    ``steps`` has ``forward(c, j, x)`` (returns the activation to send on, None on the last
    stage), ``backward(c, j, g)`` (returns the input's gradient to send back, None on the first),
    ``weight_grad(c, j)`` (W, for a split backward) and ``p2p(sends, recvs)``: ``sends`` lists
    ``(kind, c, j, tensor)``, the outputs of ops, ``recvs`` lists ``(kind, c, j)``, the ops whose
    inputs to receive; it returns one tensor per receive, None where the op receives nothing (the
    first stage's F, the last stage's B).

    ``paired=False``: an output is sent as soon as its op has run, an input received just before
    its op. ``paired=True`` (Megatron's ``send_forward_recv_backward`` and
    ``send_backward_recv_forward``): an output waits for the next op's receive when both go to the
    same neighbour (an F's activation and the next B's gradient, a B's gradient and the next F's
    activation), and the two travel in one ``p2p`` call, so that neighbours never wait on each
    other's blocking send; otherwise it is sent alone first.
    """
    waiting = None  # paired: an output held back to travel with the next op's receive
    for kind, c, j in order:
        if waiting is not None and (kind == "W" or _SENDS_TO[waiting[0]] != _RECEIVES_FROM[kind]):
            steps.p2p([waiting], [])
            waiting = None
        if kind == "W":
            steps.weight_grad(c, j)
            continue
        (x,) = steps.p2p([waiting] if waiting is not None else [], [(kind, c, j)])
        waiting = None
        out = steps.forward(c, j, x) if kind == "F" else steps.backward(c, j, x)
        if out is not None and paired:
            waiting = (kind, c, j, out)
        elif out is not None:
            steps.p2p([(kind, c, j, out)], [])
    if waiting is not None:
        steps.p2p([waiting], [])


def run_steps(steps_of_order, steps) -> None:
    """Run one rank's order cut into iterations (:func:`helpers.pipeline_schedule.interleaved_steps`)
    as Megatron-LM's interleaved schedule does: before the first iteration its inputs are received;
    after each iteration its outputs are sent and the next iteration's inputs received, all in one
    ``p2p`` call (``send_forward_recv_forward``, ``send_forward_backward_recv_forward_backward``,
    ``send_backward_recv_backward``). With ``v`` chunks the neighbours form a ring (the last rank's
    chunk ``c`` feeds the first rank's chunk ``c + 1``), and :func:`run_schedule`'s sends that wait
    alone for their receiver would deadlock; these batches do not, each send waiting for its receive
    (tests/test_pipeline_schedule.py: p up to 8, v up to 4, m = p, 2p, 3p; p up to 16, v up to 8,
    m up to 4p were checked once). ``steps``: as :func:`run_schedule`'s (no W)."""
    groups = [list(g) for g in steps_of_order]
    if any(kind == "W" for g in groups for kind, _, _ in g):
        raise ValueError("run_steps runs forwards and backwards only (no split backward)")
    xs = steps.p2p([], groups[0]) if groups else []
    for n, group in enumerate(groups):
        outs = []
        for (kind, c, j), x in zip(group, xs):
            out = steps.forward(c, j, x) if kind == "F" else steps.backward(c, j, x)
            if out is not None:
                outs.append((kind, c, j, out))
        xs = steps.p2p(outs, groups[n + 1] if n + 1 < len(groups) else [])


# ---- the pipeline on the ranks --------------------------------------------------------------------

def _tag(kind: int, vstage: int, mb: int, V: int, m: int) -> int:
    return (kind * V + vstage) * m + mb


class _RankStages:
    """This rank's chunks of the pipeline during one step, the steps of :func:`run_schedule`: its
    F, B and W ops and their sends and receives; keeps each (chunk, micro-batch)'s activations
    alive from its F to its last backward op."""

    def __init__(self, rank, p, v, m, layers, ranges, X, y, batch, split, sleep_s):
        self.rank, self.p, self.v, self.m, self.V = rank, p, v, m, p * v
        self.layers, self.ranges, self.X, self.y, self.batch = layers, ranges, X, y, batch
        self.mb, self.width, self.n_layers = batch // m, X.shape[1], len(layers)
        self.split, (self.f_s, self.b_s, self.w_s) = split, sleep_s
        self.state, self.sends = {}, []
        self.live = self.peak_live = self.live_bytes = self.peak_bytes = 0
        self.loss_total = 0.0

    def _stage(self, c: int) -> int:
        return c * self.p + self.rank

    def _pause(self, seconds):
        if seconds > 0:
            time.sleep(float(seconds) / self.v)

    def p2p(self, sends, recvs):
        """Send each output on (``dist.isend``, waited for at the end of the step) and receive
        each input (``dist.recv``); messages are tagged (direction, receiving stage, micro-batch)."""
        import torch
        import torch.distributed as dist


        for kind, c, j, t in sends:
            direction, dst = (0, self._stage(c) + 1) if kind == "F" else (1, self._stage(c) - 1)
            self.sends.append((dist.isend(t, dst=dst % self.p, tag=_tag(direction, dst, j, self.V, self.m)), t))
        out = []
        for kind, c, j in recvs:
            s = self._stage(c)
            if (kind == "F" and s == 0) or (kind == "B" and s == self.V - 1):
                out.append(None)  # the first stage takes the batch; the last computes the loss
                continue
            direction, src = (0, s - 1) if kind == "F" else (1, s + 1)
            buf = torch.empty(self.mb, self.width, dtype=torch.float64, device=self.X.device)
            with span("recv"):
                dist.recv(buf, src=src % self.p, tag=_tag(direction, s, j, self.V, self.m))
            out.append(buf)
        return out

    def forward(self, c: int, j: int, x):
        """F: run the chunk on the received activation (or the batch rows), return the output to
        send on (or add the loss), and count the bytes autograd keeps for this micro-batch."""
        import torch


        s, rows = self._stage(c), slice(j * self.mb, (j + 1) * self.mb)
        x = self.X[rows] if s == 0 else x.requires_grad_(True)
        saved = []
        with span("F"):
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
                out, acts, zs = forward_layers(self.layers, self.ranges[s], x, self.n_layers)
                if s == self.V - 1:
                    out = ((out - self.y[rows]) ** 2).sum() / self.batch
            self._pause(self.f_s)
        nbytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in saved}.values())
        self.state[(c, j)] = {"x": x, "out": out, "acts": acts, "zs": zs, "bytes": nbytes}
        self.live += 1
        self.live_bytes += nbytes
        self.peak_live, self.peak_bytes = max(self.peak_live, self.live), max(self.peak_bytes, self.live_bytes)
        if s == self.V - 1:
            self.loss_total += out.item()
            return None
        return out.detach()

    def backward(self, c: int, j: int, g):
        """B: backpropagate the output's gradient ``g`` (the whole backward, or with the B/W split
        only the input and pre-activation gradients) and return the input's gradient."""
        import torch


        s, st = self._stage(c), self.state[(c, j)]
        with span("B"):
            if self.split:
                targets = ([st["x"]] if s > 0 else []) + st["zs"]
                grads = torch.autograd.grad(st["out"], targets, grad_outputs=g)
                gx = grads[0] if s > 0 else None
                st["dz"] = grads[-len(st["zs"]):]
                st["acts"] = [a.detach() for a in st["acts"]]
                del st["out"], st["zs"]  # the autograd graph is no longer needed
                self._pause(self.b_s)
            else:
                st["out"].backward(g)
                gx = st["x"].grad if s > 0 else None
                self._pause(self.b_s + self.w_s)
        if not self.split:
            self._release(c, j)
        return gx

    def weight_grad(self, c: int, j: int):
        """W (B/W split only): the weight gradients from what B kept, dW = dZ^T A and db = sum(dZ)."""
        import torch


        st = self.state[(c, j)]
        with span("W"):
            with torch.no_grad():
                for i, a, dz in zip(self.ranges[self._stage(c)], st["acts"], st["dz"]):
                    self.layers[i].weight.grad += dz.T @ a
                    self.layers[i].bias.grad += dz.sum(0)
            self._pause(self.w_s)
        self._release(c, j)

    def _release(self, c: int, j: int):
        """The micro-batch's last backward op has run: its activations are freed."""
        self.live -= 1
        self.live_bytes -= self.state.pop((c, j))["bytes"]


def pipeline_step_worker(
    schedule: str = "1f1b",
    m: int = 4,
    v: int = 1,
    n_layers: int = 8,
    width: int = 16,
    batch: int = 32,
    seed: int = 0,
    f_s=0.0,
    b_s=0.0,
    w_s=0.0,
):
    """One training step's forward and backward on the ranks, in the schedule's order (P.9, 12.2.2).

    Run with ``launch(pipeline_step_worker, schedule, m, world_size=p)``. ``f_s``, ``b_s``,
    ``w_s``: seconds of sleep added to each forward, input-gradient and weight-gradient op on each
    stage (scalar or one per rank), standing for stage compute time; schedules without a split
    sleep ``b_s + w_s`` in their one backward. Returns this rank's ``grads`` ``{layer: (dW, db)}``,
    the ``ops`` it ran in order, its peak count of live (chunk, micro-batch) activations and the
    peak bytes autograd held for them, and (last stage) the loss. The ops themselves are
    :class:`_RankStages`' ``forward``, ``backward`` and ``weight_grad``, run by :func:`run_schedule`.
    """
    import torch
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    if p < 2:
        raise ValueError("a pipeline needs at least 2 ranks (world_size >= 2)")
    check_schedule(schedule, p, m, v)
    if batch % m:
        raise ValueError(f"m = {m} micro-batches must divide the batch of {batch}")
    sleep_s = [per_stage(n, t, p, allow_zero=True)[rank] for n, t in (("f_s", f_s), ("b_s", b_s), ("w_s", w_s))]
    dev = device()
    ranges = layer_ranges(n_layers, p, v)
    layers = [l.to(dev) for l in make_layers(n_layers, width, seed)]
    mine = [i for c in range(v) for i in ranges[c * p + rank]]
    for i in mine:
        for t in (layers[i].weight, layers[i].bias):
            t.grad = torch.zeros_like(t)
    X, y = (t.to(dev) for t in make_data(batch, width, seed + 1))
    order = op_orders(schedule, p, m, v)[rank]
    stages = _RankStages(rank, p, v, m, layers, ranges, X, y, batch, schedule == "zb-h1", sleep_s)
    dist.barrier()
    run_schedule(order, stages)
    for work, _ in stages.sends:
        work.wait()
    return {
        "grads": {i: (layers[i].weight.grad, layers[i].bias.grad) for i in mine},
        "ops": order,
        "peak_live": stages.peak_live,
        "peak_bytes": stages.peak_bytes,
        "loss": stages.loss_total if rank == (p * v - 1) % p else None,
    }


def timeline_from_run(run, schedule: str, m: int, v: int = 1):
    """The measured :class:`~helpers.pipeline_schedule.Timeline` of a :func:`pipeline_step_worker` run.

    Pairs each rank's ``F``/``B``/``W`` spans with the ops it ran, on the ranks' common clock.
    """
    records = []
    for r in range(run.world_size):
        spans = [s for s in run.spans[r] if s.name in KINDS]
        ops = run.results[r]["ops"]
        if len(spans) != len(ops) or any(s.name != o[0] for s, o in zip(spans, ops)):
            raise ValueError(f"rank {r}: its spans do not match the ops it ran")
        off = run.rank_times[r][0] if run.rank_times else 0.0
        records += [(k, r, c, j, off + s.start, off + s.end) for s, (k, c, j) in zip(spans, ops)]
    return from_records(schedule, run.world_size, m, v, records)


def stage_times(tl) -> dict:
    """Mean measured duration of F, B and W per device (for a chunk, times v: the device's share).

    The keys ``f``, ``b``, ``w`` are lists of one value per device, ready for ``simulate(...)``;
    ``w`` is 0 where the schedule has no W op.
    """
    out = {}
    for kind in KINDS:
        vals = []
        for d in range(tl.p):
            ds = [o.duration for o in tl.ops if o.device == d and o.kind == kind]
            vals.append(tl.v * sum(ds) / len(ds) if ds else 0.0)
        out[kind.lower()] = vals
    return out


def measured_vs_simulated(tl) -> dict:
    """The measured timeline beside the simulator run at the measured stage times.

    Rows: ``measured``; ``simulated`` (same per-stage F/B/W times, hand-offs free);
    ``simulated + hand-off`` (each cross-device hand-off costs the measured median gap, see
    :func:`helpers.pipeline_schedule.handoff_delays`). Each row: makespan (s) and both bubbles.
    """
    import statistics

    st = stage_times(tl)
    w = st["w"] if tl.split_backward else 0.0
    gaps = handoff_delays(tl)
    comm = max(0.0, statistics.median(gaps)) if gaps else 0.0
    rows = {"measured": tl}
    rows["simulated"] = simulate(tl.schedule, tl.p, tl.m, v=tl.v, f=st["f"], b=st["b"], w=w)
    rows["simulated + hand-off"] = simulate(tl.schedule, tl.p, tl.m, v=tl.v, f=st["f"], b=st["b"], w=w, comm=comm)
    out = {k: {"makespan_s": float(t.makespan), "bubble idle/total": float(t.bubble("total")),
               "bubble idle/useful": float(t.bubble("useful"))} for k, t in rows.items()}
    out["hand-off_s"] = comm
    return out


def gather_grads(results) -> dict:
    """All ranks' ``grads`` dicts merged into one ``{layer: (dW, db)}``."""
    merged = {}
    for res in results:
        merged.update(res["grads"])
    return merged


# ---- torch.distributed.pipelining on the same model ---------------------------------------------

def _chunk_module(layers, idx, n_layers):
    import torch

    class Chunk(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([layers[i] for i in idx])
            self.idx = list(idx)

        def forward(self, x):
            for i, layer in zip(self.idx, self.layers):
                x = layer(x)
                if i < n_layers - 1:
                    x = torch.tanh(x)
            return x

    return Chunk()


def torch_pipelining_worker(schedule: str = "1F1B", m: int = 4, n_layers: int = 8, width: int = 16,
                            batch: int = 32, seed: int = 0):
    """The same model and batch through a ``torch.distributed.pipelining`` schedule (P.9, 12.2.2).

    ``schedule`` is one of :data:`TORCH_SCHEDULES`. GPipe and 1F1B put one stage on each rank;
    Interleaved1F1B, LoopedBFS and InterleavedZeroBubble put stages ``d`` and ``d+p`` on rank ``d``;
    ZBVZeroBubble and DualPipeV put stages ``d`` and ``2p-1-d`` on rank ``d`` (the "V"; DualPipeV
    needs ``m >= 2p``). The loss is the
    micro-batch mean squared error and the schedule divides the summed gradients by ``m``
    (``scale_grads``), so with equal micro-batches the result is the full-batch gradient. Returns
    this rank's ``grads`` ``{layer: (dW, db)}`` and its stage indices.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining as pp

    if schedule not in TORCH_SCHEDULES:
        raise ValueError(f"schedule must be one of {TORCH_SCHEDULES}, got {schedule!r}")
    rank, p = dist.get_rank(), dist.get_world_size()
    if batch % m:
        raise ValueError(f"m = {m} micro-batches must divide the batch of {batch}")
    multi = schedule not in ("GPipe", "1F1B")
    V = 2 * p if multi else p
    if schedule == "DualPipeV" and m < V:
        raise ValueError(f"DualPipeV needs at least as many micro-batches as stages: m = {m} < {V}")
    if schedule in ("ZBVZeroBubble", "DualPipeV"):
        stage_ids = [rank, 2 * p - 1 - rank]
    elif multi:
        stage_ids = [rank, rank + p]
    else:
        stage_ids = [rank]
    dev = device()
    ranges = layer_ranges(n_layers, V, 1)
    layers = [l.to(dev) for l in make_layers(n_layers, width, seed)]
    stages = [pp.PipelineStage(_chunk_module(layers, ranges[s], n_layers), s, V, dev) for s in stage_ids]

    def loss_fn(out, target):
        return torch.nn.functional.mse_loss(out, target)

    cls = getattr(pp, f"Schedule{schedule}")
    sched = cls(stages if multi else stages[0], m, loss_fn=loss_fn)
    X, y = (t.to(dev) for t in make_data(batch, width, seed + 1))
    args = (X,) if 0 in stage_ids else ()
    target = y if V - 1 in stage_ids else None
    losses = [] if target is not None else None
    sched.step(*args, target=target, losses=losses)
    mine = [i for s in stage_ids for i in ranges[s]]
    return {
        "grads": {i: (layers[i].weight.grad.clone(), layers[i].bias.grad.clone()) for i in mine},
        "stages": stage_ids,
        "loss": float(sum(l.item() for l in losses) / m) if losses else None,
    }
