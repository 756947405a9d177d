"""One layout checked and timed: the planner's constraints and its step-time model (12.4.1; also P.11, P.15).

:func:`assess` checks a :class:`Layout` of a :class:`~helpers.planner.specs.Model` on a
:class:`~helpers.planner.specs.Cluster` against every constraint and, if it passes, estimates
its memory per device (:func:`stage_activation_bytes` for the activations) and its step time
(:func:`step_time_breakdown`). :mod:`helpers.planner` enumerates and ranks the layouts.

**The constraints** (each rejection names the one it broke):

* DP x TP x PP x CP is the device count (P.11); EP groups are carved out of the DP x CP ranks;
* TP divides the attention heads, the KV heads (or is a multiple of them: KV heads are then
  replicated), the FFN width; a TP group lives inside one server unless ``tp_within_node=False``
  (P.11, 12.4.1); PP (x V for interleaving) divides the layers unless ``allow_uneven_stages``;
  2 CP divides the sequence (load-balanced causal attention, as in Llama 3);
  DP x micro-batch divides the global batch (P.11), leaving m micro-batches per replica;
* model state (via :func:`helpers.memory.per_device_bytes`, ZeRO over the DP x CP ranks) plus
  activations (Korthikanti et al.'s per-layer formula, :func:`helpers.costs.activation_bytes_per_layer`,
  times the layers' worth of micro-batches a 1F1B stage keeps; without the two dropout masks
  when ``dropout=False``; with recomputation, :func:`helpers.costs.recompute_kept_bytes` per
  layer plus one layer's :func:`helpers.costs.recompute_rematerialised_bytes`) plus a reserve fit
  in the device. ``Rules(memory_model="fsdp2")``: the state and the peak of PyTorch's FSDP2 recipe
  instead (:func:`fsdp2_memory`, :func:`loss_bytes`), as the fake world measures them.

**The step-time model** (per device; every device does the same work; seconds):

* compute: (6 N_active + 12 L s d_attn) FLOPs per token (forward + backward, PaLM's accounting;
  x 4/3 with full recomputation, + 4 L s d_attn with selective recomputation:
  :func:`helpers.costs.recompute_flops_per_token`) x tokens / devices / (peak x efficiency);
* tensor parallelism: per layer and micro-batch 4 all-reduces (or reduce-scatter + all-gather
  pairs under SP, same bytes) of s b h x 2 bytes, 6 with full recomputation, on the critical path;
  alpha-beta ring time (:func:`helpers.costs.alpha_beta_time`) at the server's links, or
  the inter-server links when the group spans servers;
* context parallelism: an all-gather of K and V per layer and micro-batch forward, a
  reduce-scatter of their gradients backward, exposed (Llama 3's all-gather CP);
* expert parallelism: 4 all-to-alls of the routed tokens (top-k copies; each TP rank sends its
  s/t tokens under SP) per MoE layer and micro-batch, exposed unless ``overlap_ep`` (DualPipe);
* pipeline bubble: (p-1)/(v m) x the stage's busy time (12.2.2's idle/useful ratio, 1F1B or
  interleaved), plus 2(p-1) exposed activation hand-offs (fill and drain);
* data parallelism: the gradient ring (all-reduce, or reduce-scatter + all-gather: same bytes)
  over the DP x CP ranks, overlapped with the backward of the last micro-batch (ZeRO 0-1); under
  ZeRO-2 the gradients are sharded, so each micro-batch's are reduce-scattered behind its own
  backward (m reduce-scatters, one all-gather of the weights); gradients in BF16, or in FP32 (FSDP2's
  reduce_dtype) with ``Rules(memory_model="fsdp2")``, which also adds the optimizer step
  (:func:`optimizer_step_s`, memory-bound AdamW); under
  ZeRO-3 every layer's weights are gathered twice and its gradients reduce-scattered for every
  micro-batch (3 half-rings per layer, each paying its (d-1) alpha latency), overlapped with all
  of the compute.

Everything is an estimate with stated assumptions (efficiency, alpha, reserve); ranks between
layouts are what the model is for, not absolute seconds.

Units: bytes, seconds, FLOPs; "GB" is 1e9 bytes (:data:`helpers.memory.GB`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import costs
from ..memory import GB, per_device_bytes
from ..pipeline_schedule import bubble_formula
from ..validate import integer_at_least, one_of
from ..validate import zero_stage as check_zero_stage
from .specs import Cluster, Model

RECOMPUTE = ("none", "full")  # what the planner enumerates by default
RECOMPUTE_POLICIES = costs.RECOMPUTE_POLICIES  # what a Layout accepts: also "selective" (Korthikanti et al.)


# ---- a layout and its assessment -------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Degrees of parallelism and the knobs that go with them."""

    dp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    micro_batch: int = 1
    v: int = 1
    sequence_parallel: bool = True
    recompute: str = "none"

    def __post_init__(self):
        for f in ("dp", "tp", "pp", "cp", "ep", "micro_batch", "v"):
            integer_at_least(getattr(self, f), f)
        check_zero_stage(self.zero, "zero")
        one_of(self.recompute, "recompute", RECOMPUTE_POLICIES)
        if self.v > 1 and self.pp == 1:
            raise ValueError("interleaving (v > 1) needs pipeline parallelism (pp > 1)")

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def label(self) -> str:
        parts = [f"DP{self.dp}", f"TP{self.tp}", f"PP{self.pp}"]
        if self.v > 1:
            parts[-1] += f"x{self.v}"
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        parts += [f"ZeRO-{self.zero}", f"mb{self.micro_batch}"]
        if self.recompute != "none":
            parts.append("recompute" if self.recompute == "full" else "sel-recompute")
        if self.tp > 1 and not self.sequence_parallel:
            parts.append("no-SP")
        return " ".join(parts)


@dataclass(frozen=True)
class Rules:
    """Switches of the constraint checks and the time model."""

    tp_within_node: bool = True
    allow_uneven_stages: bool = False
    flash_attention: bool = True
    dropout: bool = True
    precision: str = "bf16-mixed"
    overlap_ep: bool = False
    activation_model: str = "korthikanti"  # ACTIVATION_MODELS
    memory_model: str = "book"  # MEMORY_MODELS: the chapters' state, or FSDP2's at the peak
    stage_layers: tuple = ()  # layers of each pipeline stage (e.g. Llama 3's uneven ones); () for ceil(L / PP)

    def __post_init__(self):
        one_of(self.activation_model, "activation_model", ACTIVATION_MODELS)
        one_of(self.memory_model, "memory_model", MEMORY_MODELS)
        if not isinstance(self.stage_layers, tuple):
            raise ValueError(f"stage_layers must be a tuple of layer counts (or ()), got {type(self.stage_layers).__name__}")
        for n in self.stage_layers:
            integer_at_least(n, "stage_layers entries")
        if self.memory_model == "fsdp2" and self.precision != "bf16-mixed":
            raise ValueError(f"memory_model='fsdp2' is FSDP2's BF16 mixed precision (FP32 master and reduction): "
                             f"precision={self.precision!r} is not modelled with it")


# "korthikanti": Korthikanti et al.'s per-layer inventory, for GPT-3's shapes (K and V as wide as Q,
# a 4h GeLU MLP) and Megatron's sequence parallelism; "shapes": the same inventory with the
# model's own widths (grouped-query K and V, the FFN width, a gated MLP's four kept tensors) and
# the K/V all-gather of context parallelism; "pytorch": "shapes" plus what PyTorch's
# SequenceParallel keeps (the all-gathered inputs of the QKV and first MLP projections, whole,
# where Megatron keeps their 1/t shards and gathers again in backward). Measured equal to
# PyTorch's own code on a fake world in helpers.fake_world.
ACTIVATION_MODELS = ("korthikanti", "shapes", "pytorch")

# "book": the chapters' model state (helpers.memory.per_device_bytes: BF16 weights and gradients,
# FP32 master and moments, ZeRO sharding them) and a peak that adds every part; "fsdp2": what
# PyTorch's FSDP2 recipe of helpers.fake_world.step holds (MixedPrecisionPolicy(param_dtype=bf16,
# reduce_dtype=fp32), AdamW, FP32-upcast loss) at the step's peak, :func:`fsdp2_memory`.
MEMORY_MODELS = ("book", "fsdp2")


@dataclass
class Assessment:
    """What :func:`assess` found: ``ok`` or the ``reasons`` it is rejected; memory (bytes) and
    time (s) by part; ``m`` micro-batches per replica; ``mfu`` model FLOPs utilisation."""

    layout: Layout
    ok: bool
    reasons: list
    notes: list
    m: int | None = None
    memory: dict = field(default_factory=dict)
    time: dict = field(default_factory=dict)
    mfu: float = 0.0

    @property
    def step_s(self) -> float:
        return self.time.get("total", math.inf)

    def row(self) -> dict:
        mem = self.memory.get("total", float("nan")) / GB
        return {"layout": self.layout.label(), "ok": self.ok, "m": self.m, "GB/device": round(mem, 1),
                "step s": round(self.step_s, 2) if self.ok else None, "MFU": round(self.mfu, 3) if self.ok else None,
                "why not": "" if self.ok else self.reasons[0]}


def _layers_per_stage(model: Model, pp: int) -> int:
    return math.ceil(model.layers / pp)


def _stage0_layers(model: Model, layout: Layout, rules: Rules) -> int:
    """Layers of stage 0, the stage whose memory the planner models (1F1B keeps the most
    micro-batches in flight there): ``rules.stage_layers[0]`` when the stages are given (Llama 3's
    uneven stages: one layer fewer on the first and the last), else the largest stage."""
    if rules.stage_layers:
        if len(rules.stage_layers) != layout.pp or sum(rules.stage_layers) != model.layers:
            raise ValueError(f"stage_layers must give PP = {layout.pp} layer counts summing to the {model.layers} "
                             f"layers, got {rules.stage_layers}")
        return rules.stage_layers[0]
    return _layers_per_stage(model, layout.pp)


def _busiest_layers(model: Model, layout: Layout, rules: Rules) -> int:
    """Layers of the stage with the most (the one that sets the pipeline's pace): the largest of
    ``rules.stage_layers`` when given (checked by :func:`_stage0_layers`), else ceil(L / PP)."""
    if rules.stage_layers:
        _stage0_layers(model, layout, rules)
        return max(rules.stage_layers)
    return _layers_per_stage(model, layout.pp)


def _block_params(model: Model) -> float:
    """Parameters of one transformer block (attention and MLP; the chapter's round n_params, when
    given, scales the counted figure as it does the total)."""
    c = model.counted()
    scale = model.total_params / sum(c.values())
    return scale * (c["attention"] + c["dense mlp"] + c["routed experts"] + c["shared experts and routers"]) / model.layers


def fsdp2_memory(model: Model, layout: Layout, m: int, rules: Rules, activations: float) -> dict:
    """Bytes per device at the step's peak under PyTorch's FSDP2 recipe (``memory_model="fsdp2"``,
    as :mod:`helpers.fake_world.step` builds it), by the categories its ``MemTracker`` files them
    in: ``weights`` (FP32 sharded parameters, which are AdamW's master copy, and BF16 unsharded
    ones), ``gradients``, ``optimizer`` (the two AdamW moments), ``activations``.

    P is the stage's parameters on this device (its share of the model / TP), P_l one block's,
    P_root = P - layers x P_l (embedding and head), d = DP x CP the ranks sharding them (ZeRO 1-3;
    ZeRO-0's ``replicate`` shards nothing: d = 1 below). Every step holds 4 P / d FP32 parameters
    and 8 P / d moments. The peak is the larger of the two ends of the last micro-batch's backward
    (the backward frees activations layer by layer as it makes gradients; a sum that is linear in
    the layers done peaks at an end):

    * start (the activations of every micro-batch in flight, ``activations``): BF16 weights held
      from forward to backward, 2 P under ZeRO 0-2 (reshard_after_forward=False); under ZeRO-3
      one block's, 2 P_l (the others resharded, the next not yet gathered), plus the root's 2
      P_root (FSDP2 keeps the root unsharded). Gradients: the FP32 accumulated ones of the earlier
      micro-batches, whole, 4 P, under ZeRO 0-1 with m > 1 (gradient sync deferred to the last
      micro-batch: FSDP2 accumulates unsharded in reduce_dtype); where a block is reduced in this
      backward (ZeRO 2-3, and ZeRO-1 with m = 1), its BF16 gradient and the FP32 copy FSDP2
      reduce-scatters, 6 P_l, and the sharded FP32 gradients of the earlier micro-batches, 4 P / d
      (m > 1);
    * end (activations freed, every gradient made): the gradients whole, 4 P (ZeRO-0,
      ``replicate``'s FP32 gradients, all-reduced), or sharded, 4 P / d; BF16 weights resharded.
    """
    lps = _stage0_layers(model, layout, rules)
    P = model.dense_params * lps / model.layers / layout.tp
    P_l = _block_params(model) / layout.tp
    P_root = max(0.0, P - lps * P_l)
    z = layout.zero
    d = layout.dp * layout.cp if z >= 1 else 1
    kept = 4 * P / d  # FP32 sharded parameters (AdamW's master)
    moments = 8 * P / d
    if z < 3:
        w_start = 2 * P
    else:
        w_start = 2 * P_l + 2 * P_root
    reduces_now = z >= 2 or (z == 1 and m == 1)
    g_start = 4 * P if (z <= 1 and m > 1) else 0.0
    if reduces_now:
        g_start += 6 * P_l + (4 * P / d if m > 1 else 0.0)
    start = {"weights": kept + w_start, "gradients": g_start, "optimizer": moments, "activations": activations}
    end = {"weights": kept, "gradients": 4 * P / d, "optimizer": moments, "activations": 0.0}
    return max(start, end, key=lambda x: sum(x.values()))


def loss_bytes(model: Model, layout: Layout, rules: Rules) -> float:
    """Bytes of the loss on FP32-upcast logits (``cross_entropy(logits.float(), ...)``, as
    torchtitan and the fake world compute it) at the start of the backward, on a stage that holds
    the output head (PP = 1 here; with a pipeline the planner's stage 0 has no head). Per logit
    (b x s / CP tokens x V / TP vocabulary entries): the BF16 logits (2 bytes) and the FP32
    log-probabilities log_softmax saves (4), kept from forward; in the loss's backward the FP32
    gradient nll_loss_backward makes (4) and log_softmax_backward's (4), measured so on plain
    ``cross_entropy``; under TP, ``loss_parallel`` holds one more FP32 tensor of the local logits
    (its own softmax, 4). 0 without a vocabulary or under ``memory_model="book"``."""
    if rules.memory_model == "book" or not model.vocab or layout.pp > 1:
        return 0.0
    logits = layout.micro_batch * (model.seq_len // layout.cp) * model.vocab / layout.tp
    return logits * (2 + 4 + 4 + 4 + (4 if layout.tp > 1 else 0))


def _shape_terms(model: Model, layout: Layout, sp: bool, pytorch_sp: bool) -> float:
    """Bytes per layer to add to Korthikanti's inventory (:data:`ACTIVATION_MODELS`). The terms
    it scales by 1/t: Q, K, V and the output projection's input (2 bytes per element each, all
    h wide there), the GeLU's input and output (4h wide)."""
    s, b, h, t = model.seq_len // layout.cp, layout.micro_batch, model.hidden, layout.tp
    q, kv = model.heads * model.hd, model.kv * model.hd
    kept_mlp = (2 if model.mlp_matrices == 2 else 4) * 2 * model.ffn  # a gated MLP keeps 4 tensors of its width
    out = s * b * ((2 * q + 4 * kv + 2 * q - 8 * h) + (kept_mlp - 16 * h)) / t
    if pytorch_sp and sp:  # the two all-gathered projection inputs, whole instead of 1/t
        out += 2 * 2 * s * b * h * (1 - 1 / t)
    if layout.cp > 1:  # K and V of the whole sequence, all-gathered (Llama 3's context parallelism)
        out += 2 * 2 * b * (model.seq_len - s) * kv / t
    return out


def stage_activation_bytes(model: Model, layout: Layout, m: int, rules: Rules = Rules()) -> dict:
    """Activation bytes on the busiest pipeline stage (stage 0 of 1F1B): per layer, in flight, total."""
    s = model.seq_len // layout.cp
    sp = layout.sequence_parallel and layout.tp > 1
    shape = (s, layout.micro_batch, model.hidden)
    kw = dict(t=layout.tp, sequence_parallel=sp, attention_scores=not rules.flash_attention, dropout=rules.dropout)
    per_layer = costs.activation_bytes_per_layer(*shape, model.heads, **kw)
    kept = costs.recompute_kept_bytes(layout.recompute, *shape, model.heads, **kw)  # full: only each layer's input
    if rules.activation_model != "korthikanti":  # the model's own widths (not recomputed unless full)
        extra = _shape_terms(model, layout, sp, rules.activation_model == "pytorch")
        per_layer += extra
        if layout.recompute != "full":
            kept += extra
    p, v = layout.pp, layout.v
    lps = _stage0_layers(model, layout, rules)
    if p == 1:
        layer_units = lps  # gradient accumulation runs micro-batches one after another
    elif v == 1:
        layer_units = min(m, p) * lps  # 1F1B: stage 0 holds p micro-batches
    else:  # Megatron's interleaved 1F1B warm-up on rank 0, in chunks of L/(p v) layers
        layer_units = min(m * v, 2 * (p - 1) + (v - 1) * p + 1) * lps / v
    total = kept * layer_units + costs.recompute_rematerialised_bytes(layout.recompute, *shape, model.heads, **kw)
    return {"per layer": per_layer, "kept per layer": kept, "layers in flight": layer_units, "total": total}


def assess(model: Model, cluster: Cluster, global_batch: int, layout: Layout, rules: Rules = Rules()) -> Assessment:
    """Check one layout against every constraint and, if it passes, estimate its step time."""
    integer_at_least(global_batch, "global_batch")
    L, n, dpn = layout, cluster.n_devices, cluster.devices_per_node
    reasons, notes = [], []
    if L.devices != n:
        reasons.append(f"DP x TP x PP x CP = {L.dp}x{L.tp}x{L.pp}x{L.cp} = {L.devices}, not the {n} devices")
    # tensor parallelism
    if model.heads % L.tp:
        reasons.append(f"TP={L.tp} does not divide the {model.heads} attention heads")
    elif model.kv % L.tp and L.tp % model.kv:
        reasons.append(f"TP={L.tp} neither divides nor is a multiple of the {model.kv} KV heads")
    elif L.tp > model.kv:
        notes.append(f"TP={L.tp} > {model.kv} KV heads: each KV head is replicated on {L.tp // model.kv} devices")
    if model.ffn % L.tp or (model.experts and model.expert_ffn % L.tp):
        reasons.append(f"TP={L.tp} does not divide the FFN width {model.ffn if model.ffn % L.tp else model.expert_ffn}")
    if L.tp > dpn:
        msg = f"TP={L.tp} spans {math.ceil(L.tp / dpn)} servers: its per-layer collectives cross the inter-server network"
        (reasons if rules.tp_within_node else notes).append(msg + (f" (TP is capped at the {dpn} devices of a server)" if rules.tp_within_node else ""))
    elif dpn % L.tp:
        reasons.append(f"TP={L.tp} groups would straddle servers of {dpn} devices")
    # pipeline parallelism
    stages = L.pp * L.v
    if stages > model.layers:
        reasons.append(f"PP x V = {stages} stages for only {model.layers} layers")
    elif model.layers % stages:
        msg = f"PP{' x V' if L.v > 1 else ''}={stages} does not divide the {model.layers} layers"
        if rules.allow_uneven_stages:
            notes.append(msg + f": stages of up to {math.ceil(model.layers / stages)} layers (uneven stages allowed)")
        else:
            reasons.append(msg)
    # context parallelism
    if L.cp > 1 and model.seq_len % (2 * L.cp):
        reasons.append(f"CP={L.cp} needs the {model.seq_len}-token sequence cut into 2 x CP = {2 * L.cp} equal chunks")
    # expert parallelism
    if L.ep > 1:
        if not model.experts:
            reasons.append(f"EP={L.ep} needs a mixture-of-experts model")
        elif model.experts % L.ep:
            reasons.append(f"EP={L.ep} does not divide the {model.experts} experts")
        if (L.dp * L.cp) % L.ep:
            reasons.append(f"EP={L.ep} must divide DP x CP = {L.dp * L.cp} (expert groups are carved out of the data-parallel ranks)")
    # the batch
    m = None
    if global_batch % (L.dp * L.micro_batch):
        reasons.append(f"DP x micro-batch = {L.dp}x{L.micro_batch} = {L.dp * L.micro_batch} does not divide the global batch of {global_batch} sequences")
    else:
        m = global_batch // (L.dp * L.micro_batch)
        if L.v > 1 and m % L.pp:
            reasons.append(f"the interleaved schedule needs m = {m} micro-batches to be a multiple of PP = {L.pp}")
        if L.pp > 1 and m < L.pp:
            notes.append(f"only m = {m} micro-batches for {L.pp} stages: the pipeline never fills")
    out = Assessment(L, False, reasons, notes, m)
    if m is None or L.devices != n or stages > model.layers:
        return out
    # memory (of stage 0: the most micro-batches in flight)
    lps = _stage0_layers(model, L, rules)
    share = lps / model.layers
    dense_dev = model.dense_params * share / L.tp
    expert_dev = model.expert_params * share / (L.tp * L.ep)
    d = L.dp * L.cp
    state = per_device_bytes(dense_dev, d, L.zero, rules.precision)
    if expert_dev:
        es = per_device_bytes(expert_dev, max(1, d // L.ep), L.zero, rules.precision)
        state = {k: state[k] + es[k] for k in state}
    act = stage_activation_bytes(model, L, m, rules)
    if rules.memory_model == "fsdp2" and not expert_dev:
        mem = fsdp2_memory(model, L, m, rules, act["total"] + loss_bytes(model, L, rules))
        mem["reserve"] = cluster.reserve_bytes
    elif rules.memory_model == "fsdp2":
        raise ValueError("memory_model='fsdp2' models dense models only (the fake world builds no experts)")
    else:
        mem = {"weights": state["weights"], "gradients": state["gradients"],
               "optimizer": state["master"] + state["moments"], "activations": act["total"], "reserve": cluster.reserve_bytes}
    mem["total"] = sum(mem.values())
    mem["capacity"] = cluster.memory_bytes
    out.memory = mem
    if mem["total"] > cluster.memory_bytes:
        parts = ", ".join(f"{k} {mem[k] / GB:.1f}" for k in ("weights", "gradients", "optimizer", "activations", "reserve"))
        reasons.append(f"needs {mem['total'] / GB:.1f} GB per device ({parts}), more than {cluster.memory_bytes / GB:.0f} GB")
    # time
    out.time = step_time_breakdown(model, cluster, global_batch, L, m, rules)
    out.mfu = model.flops_per_token() * global_batch * model.seq_len / (n * cluster.peak_flops * out.time["total"])
    out.ok = not reasons
    return out


def step_time_breakdown(model: Model, cluster: Cluster, global_batch: int, layout: Layout, m: int, rules: Rules = Rules()) -> dict:
    """The step-time estimate of the module docstring, by part (seconds per step)."""
    L, n, dpn = layout, cluster.n_devices, cluster.devices_per_node
    s = model.seq_len // L.cp
    lps = _busiest_layers(model, L, rules)
    extra = costs.recompute_flops_per_token(L.recompute, model.active_params, model.layers, model.seq_len, model.heads * model.hd)
    flops = (model.flops_per_token() + extra) * global_batch * model.seq_len / n
    compute = flops / (cluster.peak_flops * cluster.efficiency)
    # tensor parallelism: on the critical path
    tp = 0.0
    if L.tp > 1:
        a, bw = cluster.link(L.tp > dpn)
        per = costs.alpha_beta_time(L.tp, s * L.micro_batch * model.hidden * 2, a, bw)
        tp = (6 if L.recompute == "full" else 4) * lps * m * per
    # context parallelism: all-gather K, V forward; reduce-scatter dK, dV backward
    cp = 0.0
    if L.cp > 1:
        a, bw = cluster.link(L.tp * L.cp > dpn)
        shard = 2 * s * L.micro_batch * model.kv * model.hd * 2 / min(L.tp, model.kv)
        cp = 2 * lps * m * costs.alpha_beta_time(L.cp, L.cp * shard, a, bw, op="all_gather")
    # expert parallelism: dispatch + combine, forward and backward
    ep = 0.0
    if L.ep > 1 and model.experts:  # (EP on a dense model is rejected by assess)
        a, bw = cluster.link(L.ep * L.tp > dpn)
        moe_dev = model.moe_layers * lps / model.layers
        payload = costs.moe_dispatch_bytes(s * L.micro_batch, model.top_k, model.hidden, 2)
        payload /= L.tp if (L.sequence_parallel and L.tp > 1) else 1  # SP splits the tokens over TP
        ep = 4 * moe_dev * m * costs.alpha_beta_time(L.ep, payload, a, bw, op="all_to_all")
        if rules.overlap_ep:
            ep = max(0.0, ep - compute)
    busy = compute + tp + cp + ep
    bubble = float(bubble_formula(L.pp, m, L.v, definition="useful")) * busy
    # pipeline hand-offs exposed at fill and drain
    pp = 0.0
    if L.pp > 1:
        a, bw = cluster.link(L.tp * L.cp >= dpn)
        hop = s * L.micro_batch * model.hidden * 2 / (L.tp if (L.sequence_parallel and L.tp > 1) else 1)
        pp = 2 * (L.pp - 1) * costs.alpha_beta_time(2, hop, a, bw, op="send")
    # data parallelism (over the DP x CP ranks, which hold the same weights)
    d = L.dp * L.cp
    dp = 0.0
    window = compute if L.zero == 3 else compute * 2 / 3 / m  # ZeRO 0-2: one micro-batch's backward
    dp_exposed = 0.0
    # the gradients' dtype on the wire: BF16 in the chapters; FSDP2's reduce_dtype, FP32, in its recipe
    g_bytes = 4 if rules.memory_model == "fsdp2" else 2
    if d > 1:
        a, bw = cluster.link(n > dpn)
        share = lps / model.layers
        groups = [(model.dense_params * share / L.tp, d)]
        if model.experts:
            groups.append((model.expert_params * share / (L.tp * L.ep), d // L.ep))
        last, each_mb = 0.0, 0.0  # in the last micro-batch's backward; in every micro-batch's
        for params, size in groups:
            if size < 2:
                continue
            if L.zero == 0:  # one all-reduce of the gradients, bucketed, in the last backward
                last += costs.alpha_beta_time(size, params * g_bytes, a, bw)
            elif L.zero < 3:  # reduce-scatter of the gradients, all-gather of the (BF16) weights
                rs = costs.alpha_beta_time(size, params * g_bytes, a, bw, op="reduce_scatter")
                ag = costs.alpha_beta_time(size, params * 2, a, bw, op="all_gather")
                last += ag
                if L.zero == 1:  # gradients accumulated whole, reduced once, after the last micro-batch
                    last += rs
                else:  # ZeRO-2: the gradients are sharded, so every micro-batch's are reduce-scattered
                    each_mb += rs  # in its own backward
            else:  # per micro-batch and per layer: all-gather (forward), all-gather (backward), reduce-scatter
                per = lambda b: costs.alpha_beta_time(size, params * b / lps, a, bw, op="all_gather")
                dp += lps * m * (2 * per(2) + per(g_bytes))
        if L.zero == 3:
            dp_exposed = max(0.0, dp - window)
        else:
            dp = last + m * each_mb
            dp_exposed = (m - 1) * max(0.0, each_mb - window) + max(0.0, last + each_mb - window)
    opt = optimizer_step_s(model, cluster, L, rules)
    total = busy + bubble + pp + dp_exposed + opt
    return {"compute": compute, "tp": tp, "cp": cp, "ep": ep, "bubble": bubble, "pp hand-off": pp,
            "dp (total)": dp, "dp exposed": dp_exposed, "optimizer": opt, "total": total}


# HBM bytes per parameter of one step of PyTorch's single-tensor AdamW (foreach=False, as the fake
# world runs it), in FP32, op by op: exp_avg.lerp_(grad) reads m, g and writes m (12);
# exp_avg_sq.mul_(beta2) (8) and .addcmul_(grad, grad) (16); param.mul_(1 - lr wd) (8); the
# denominator exp_avg_sq.sqrt() (8), / sqrt(bias correction) (8), .add_(eps) (8); and
# param.addcdiv_(exp_avg, denom) reads p, m, d and writes p (16).
ADAMW_BYTES_PER_PARAM = 12 + 8 + 16 + 8 + 8 + 8 + 8 + 16


def optimizer_step_s(model: Model, cluster: Cluster, layout: Layout, rules: Rules = Rules()) -> float:
    """Seconds of the optimizer step, after the backward (nothing to hide it behind), told FSDP2's
    recipe (``memory_model="fsdp2"``): AdamW's memory traffic (:data:`ADAMW_BYTES_PER_PARAM`) over
    the parameters this device updates (its shard: P / (DP x CP) under ZeRO 1-3, P under ZeRO-0),
    at the device's HBM bandwidth; a memory-bound elementwise update. 0 under the chapters' model
    (``memory_model="book"``), which leaves it out, or on a cluster without an HBM bandwidth."""
    if rules.memory_model == "book" or not cluster.hbm_bytes_per_s:
        return 0.0
    share = _busiest_layers(model, layout, rules) / model.layers
    params = model.dense_params * share / layout.tp / (layout.dp * layout.cp if layout.zero >= 1 else 1)
    if model.experts:
        params += model.expert_params * share / (layout.tp * layout.ep) / (
            max(1, layout.dp * layout.cp // layout.ep) if layout.zero >= 1 else 1)
    return ADAMW_BYTES_PER_PARAM * params / cluster.hbm_bytes_per_s
