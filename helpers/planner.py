"""A layout planner for hybrid parallelism: which (DP, TP, PP, CP, EP, ZeRO, micro-batch) to use (12.4.1;
also P.11, P.15 and 12.4.2).

Given a model (:class:`Model`), a cluster (:class:`Cluster`) and a global batch (sequences per
optimizer step), :func:`plan` enumerates the layouts (:class:`Layout`), rejects those that break a
divisibility, placement or memory constraint, with the reason, and ranks the rest by an estimated
step time. :func:`explain` says why the chosen degrees are what they are; :func:`neighbours` shows
what changing one knob would cost. :func:`decision_sequence` follows P.15's questions in order and
:func:`rule_of_thumb` 12.4.1's recipe (TP first, then PP or ZeRO-3, then DP), so their answers can
be set beside the planner's.

**The constraints** (each rejection names the one it broke):

* DP x TP x PP x CP is the device count (P.11); EP groups are carved out of the DP x CP ranks;
* TP divides the attention heads, the KV heads (or is a multiple of them: KV heads are then
  replicated), the FFN width; a TP group lives inside one server unless ``tp_within_node=False``
  (P.11, 12.4.1); PP (x V for interleaving) divides the layers unless ``allow_uneven_stages``;
  2 CP divides the sequence (load-balanced causal attention, as in Llama 3);
  DP x micro-batch divides the global batch (P.11), leaving m micro-batches per replica;
* model state (via :func:`helpers.memory.per_device_bytes`, ZeRO over the DP x CP ranks) plus
  activations (Korthikanti et al.'s per-layer formula, :func:`helpers.sequence_parallel.activation_bytes_per_layer`,
  times the layers' worth of micro-batches a 1F1B stage keeps; without the two dropout masks
  when ``dropout=False``) plus a reserve fit in the device.

**The step-time model** (per device; every device does the same work; seconds):

* compute: (6 N_active + 12 L s d_attn) FLOPs per token (forward + backward, PaLM's accounting;
  x 4/3 with full recomputation) x tokens / devices / (peak x efficiency);
* tensor parallelism: per layer and micro-batch 4 all-reduces (or reduce-scatter + all-gather
  pairs under SP, same bytes) of s b h x 2 bytes, 6 with full recomputation, on the critical path;
  alpha-beta ring time (:func:`helpers.collectives.alpha_beta_time`) at the server's links, or
  the inter-server links when the group spans servers;
* context parallelism: an all-gather of K and V per layer and micro-batch forward, a
  reduce-scatter of their gradients backward, exposed (Llama 3's all-gather CP);
* expert parallelism: 4 all-to-alls of the routed tokens (top-k copies; each TP rank sends its
  s/t tokens under SP) per MoE layer and micro-batch, exposed unless ``overlap_ep`` (DualPipe);
* pipeline bubble: (p-1)/(v m) x the stage's busy time (12.2.2's idle/useful ratio, 1F1B or
  interleaved), plus 2(p-1) exposed activation hand-offs (fill and drain);
* data parallelism: the gradient ring (all-reduce, or reduce-scatter + all-gather: same bytes)
  over the DP x CP ranks, overlapped with the backward of the last micro-batch (ZeRO 0-2); under
  ZeRO-3 every layer's weights are gathered twice and its gradients reduce-scattered for every
  micro-batch (3 half-rings per layer, each paying its (d-1) alpha latency), overlapped with all
  of the compute.

Everything is an estimate with stated assumptions (efficiency, alpha, reserve); ranks between
layouts are what the model is for, not absolute seconds.

Units: bytes, seconds, FLOPs; "GB" is 1e9 bytes (:data:`helpers.memory.GB`).
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path

from .collectives import alpha_beta_time
from .memory import GB, per_device_bytes

DATA = Path(__file__).resolve().parent.parent / "data"
RECOMPUTE = ("none", "full")


def _pos_int(name, v, lo=1):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _pos_num(name, v, allow_zero=False):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (v > 0 or (allow_zero and v == 0)):
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, got {v!r}")
    return v


def divisors(n: int) -> list:
    """The divisors of n in increasing order."""
    n = _pos_int("n", n)
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


# ---- the model ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Model:
    """Shapes of a decoder-only transformer (dense, or mixture-of-experts when ``experts > 0``).

    ``ffn`` is the width of one MLP matrix; ``mlp_matrices`` is 2 for a plain MLP, 3 for a gated
    one (SwiGLU, GeGLU). ``n_params`` (optional) replaces the counted total by a round figure (the
    chapter's "70B"); the counted split between dense and expert parameters is kept.
    ``attention_params`` (optional) replaces the per-layer attention count (multi-head latent
    attention). MoE: ``moe_layers`` of the ``layers`` have ``experts`` routed experts of width
    ``expert_ffn`` (``top_k`` per token) and ``shared_experts`` always-on ones; the other layers
    have a dense MLP of width ``ffn``.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    seq_len: int
    kv_heads: int = 0
    head_dim: int = 0
    mlp_matrices: int = 2
    vocab: int = 0
    tied_embeddings: bool = False
    n_params: float = 0.0
    attention_params: float = 0.0
    moe_layers: int = 0
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0

    def __post_init__(self):
        for f in ("layers", "hidden", "heads", "ffn", "seq_len"):
            _pos_int(f, getattr(self, f))
        for f in ("kv_heads", "head_dim", "vocab", "moe_layers", "experts", "top_k", "expert_ffn", "shared_experts"):
            _pos_int(f, getattr(self, f), lo=0)
        if self.mlp_matrices not in (2, 3):
            raise ValueError(f"mlp_matrices must be 2 (plain MLP) or 3 (gated MLP), got {self.mlp_matrices!r}")
        _pos_num("n_params", self.n_params, allow_zero=True)
        _pos_num("attention_params", self.attention_params, allow_zero=True)
        if self.kv_heads and self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads} (grouped-query attention)")
        if self.head_dim == 0 and self.hidden % self.heads:
            raise ValueError(f"heads={self.heads} must divide hidden={self.hidden} unless head_dim is given")
        if self.experts:
            if not (0 < self.moe_layers <= self.layers and 0 < self.top_k <= self.experts and self.expert_ffn > 0):
                raise ValueError("a mixture-of-experts model needs 0 < moe_layers <= layers, 0 < top_k <= experts and expert_ffn > 0")
        elif self.moe_layers or self.top_k:
            raise ValueError("moe_layers and top_k need experts > 0")

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def counted(self) -> dict:
        """Parameter counts by part, from the shapes (norms and biases left out)."""
        h, d = self.hidden, self.hd
        attn = self.attention_params or (h * self.heads * d * 2 + 2 * h * self.kv * d)
        expert = self.mlp_matrices * h * self.expert_ffn
        dense_layers = self.layers - self.moe_layers
        return {
            "attention": self.layers * attn,
            "dense mlp": dense_layers * self.mlp_matrices * h * self.ffn,
            "routed experts": self.moe_layers * self.experts * expert,
            "shared experts and routers": self.moe_layers * (self.shared_experts * expert + h * self.experts),
            "embeddings": self.vocab * h * (1 if self.tied_embeddings else 2),
        }

    @property
    def total_params(self) -> float:
        return self.n_params or float(sum(self.counted().values()))

    @property
    def expert_params(self) -> float:
        """Routed-expert parameters (the part expert parallelism shards)."""
        c = self.counted()
        return self.total_params * c["routed experts"] / sum(c.values())

    @property
    def dense_params(self) -> float:
        return self.total_params - self.expert_params

    @property
    def active_params(self) -> float:
        """Parameters one token uses: everything but the routed experts it is not sent to."""
        if not self.experts:
            return self.total_params
        return self.dense_params + self.expert_params * self.top_k / self.experts

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 N_active + 12 L s (heads x head_dim) (PaLM, appendix B)."""
        return 6 * self.active_params + 12 * self.layers * self.seq_len * self.heads * self.hd


@dataclass(frozen=True)
class Cluster:
    """Devices, memory, speed and links. Bandwidths in bytes/s per device and direction."""

    name: str
    n_devices: int
    devices_per_node: int
    memory_bytes: float
    peak_flops: float
    intra_bw: float
    inter_bw: float
    alpha_intra: float = 5e-6
    alpha_inter: float = 15e-6
    efficiency: float = 0.5
    reserve_bytes: float = 0.0

    def __post_init__(self):
        _pos_int("n_devices", self.n_devices)
        _pos_int("devices_per_node", self.devices_per_node)
        for f in ("memory_bytes", "peak_flops", "intra_bw", "inter_bw"):
            _pos_num(f, getattr(self, f))
        for f in ("alpha_intra", "alpha_inter", "reserve_bytes"):
            _pos_num(f, getattr(self, f), allow_zero=True)
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency!r}")
        if self.n_devices % self.devices_per_node and self.n_devices > self.devices_per_node:
            raise ValueError(f"{self.n_devices} devices do not fill servers of {self.devices_per_node}")
        if self.reserve_bytes >= self.memory_bytes:
            raise ValueError("reserve_bytes must be smaller than memory_bytes")

    def link(self, spans_nodes: bool) -> tuple:
        """(alpha, bandwidth) of a group inside one server (False) or across servers (True)."""
        return (self.alpha_inter, self.inter_bw) if spans_nodes else (self.alpha_intra, self.intra_bw)


def hardware() -> dict:
    """The figures of ``data/hardware.json`` (each with its source)."""
    return json.loads((DATA / "hardware.json").read_text())


def h100_cluster(n_devices: int, name: str | None = None, **overrides) -> Cluster:
    """H100 SXM 80 GB servers of 8, NVLink inside (450 GB/s each way), 400 Gb/s per GPU between."""
    hw = hardware()
    h, ib, mod = hw["h100_sxm"], hw["infiniband_ndr_400"], hw["modelling"]
    kw = dict(name=name or f"{n_devices} x H100 80GB", n_devices=n_devices, devices_per_node=h["devices_per_node"],
              memory_bytes=h["memory_bytes"], peak_flops=h["bf16_dense_flops"], intra_bw=h["nvlink_bytes_per_s"],
              inter_bw=ib["bytes_per_s"], alpha_intra=mod["alpha_intra_s"], alpha_inter=mod["alpha_inter_s"],
              efficiency=mod["efficiency"], reserve_bytes=mod["reserve_bytes"])
    kw.update(overrides)
    return Cluster(**kw)


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
            _pos_int(f, getattr(self, f))
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"zero must be a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}")
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
            parts.append("recompute")
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
    activation_model: str = "korthikanti"

    def __post_init__(self):
        if self.activation_model not in ACTIVATION_MODELS:
            raise ValueError(f"activation_model must be one of {ACTIVATION_MODELS}, got {self.activation_model!r}")


# "korthikanti": Korthikanti et al.'s per-layer inventory, for GPT-3's shapes (K and V as wide as Q,
# a 4h GeLU MLP) and Megatron's sequence parallelism; "shapes": the same inventory with the
# model's own widths (grouped-query K and V, the FFN width, a gated MLP's four kept tensors) and
# the K/V all-gather of context parallelism; "pytorch": "shapes" plus what PyTorch's
# SequenceParallel keeps (the all-gathered inputs of the QKV and first MLP projections, whole,
# where Megatron keeps their 1/t shards and gathers again in backward). Measured equal to
# PyTorch's own code on a fake world in helpers.fake_world.
ACTIVATION_MODELS = ("korthikanti", "shapes", "pytorch")


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


def activation_bytes(model: Model, layout: Layout, m: int, rules: Rules = Rules()) -> dict:
    """Activation bytes on the busiest pipeline stage (stage 0 of 1F1B): per layer, in flight, total."""
    from .sequence_parallel import activation_bytes_per_layer

    s = model.seq_len // layout.cp
    sp = layout.sequence_parallel and layout.tp > 1
    per_layer = activation_bytes_per_layer(s, layout.micro_batch, model.hidden, model.heads, t=layout.tp,
                                           sequence_parallel=sp, attention_scores=not rules.flash_attention)
    if not rules.dropout:  # the two 1-byte masks after attention and after the MLP
        per_layer -= 2 * s * layout.micro_batch * model.hidden / (layout.tp if sp else 1)
    if rules.activation_model != "korthikanti":
        per_layer += _shape_terms(model, layout, sp, rules.activation_model == "pytorch")
    kept = per_layer
    if layout.recompute == "full":
        kept = 2 * s * layout.micro_batch * model.hidden / (layout.tp if sp else 1)  # only each layer's input
    p, v = layout.pp, layout.v
    lps = _layers_per_stage(model, p)
    if p == 1:
        layer_units = lps  # gradient accumulation runs micro-batches one after another
    elif v == 1:
        layer_units = min(m, p) * lps  # 1F1B: stage 0 holds p micro-batches
    else:  # Megatron's interleaved 1F1B warm-up on rank 0, in chunks of L/(p v) layers
        layer_units = min(m * v, 2 * (p - 1) + (v - 1) * p + 1) * lps / v
    total = kept * layer_units + (per_layer if layout.recompute == "full" else 0.0)
    return {"per layer": per_layer, "kept per layer": kept, "layers in flight": layer_units, "total": total}


def assess(model: Model, cluster: Cluster, global_batch: int, layout: Layout, rules: Rules = Rules()) -> Assessment:
    """Check one layout against every constraint and, if it passes, estimate its step time."""
    _pos_int("global_batch", global_batch)
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
    # memory
    lps = _layers_per_stage(model, L.pp)
    share = lps / model.layers
    dense_dev = model.dense_params * share / L.tp
    expert_dev = model.expert_params * share / (L.tp * L.ep)
    d = L.dp * L.cp
    state = per_device_bytes(dense_dev, d, L.zero, rules.precision)
    if expert_dev:
        es = per_device_bytes(expert_dev, max(1, d // L.ep), L.zero, rules.precision)
        state = {k: state[k] + es[k] for k in state}
    act = activation_bytes(model, L, m, rules)
    mem = {"weights": state["weights"], "gradients": state["gradients"],
           "optimizer": state["master"] + state["moments"], "activations": act["total"], "reserve": cluster.reserve_bytes}
    mem["total"] = sum(mem.values())
    mem["capacity"] = cluster.memory_bytes
    out.memory = mem
    if mem["total"] > cluster.memory_bytes:
        parts = ", ".join(f"{k} {mem[k] / GB:.1f}" for k in ("weights", "gradients", "optimizer", "activations", "reserve"))
        reasons.append(f"needs {mem['total'] / GB:.1f} GB per device ({parts}), more than {cluster.memory_bytes / GB:.0f} GB")
    # time
    out.time = step_time(model, cluster, global_batch, L, m, rules)
    out.mfu = model.flops_per_token() * global_batch * model.seq_len / (n * cluster.peak_flops * out.time["total"])
    out.ok = not reasons
    return out


def step_time(model: Model, cluster: Cluster, global_batch: int, layout: Layout, m: int, rules: Rules = Rules()) -> dict:
    """The step-time estimate of the module docstring, by part (seconds per step)."""
    L, n, dpn = layout, cluster.n_devices, cluster.devices_per_node
    s = model.seq_len // L.cp
    lps = _layers_per_stage(model, L.pp)
    flops = model.flops_per_token() * global_batch * model.seq_len / n
    if L.recompute == "full":
        flops *= 4 / 3
    compute = flops / (cluster.peak_flops * cluster.efficiency)
    # tensor parallelism: on the critical path
    tp = 0.0
    if L.tp > 1:
        a, bw = cluster.link(L.tp > dpn)
        per = alpha_beta_time(L.tp, s * L.micro_batch * model.hidden * 2, a, bw)
        tp = (6 if L.recompute == "full" else 4) * lps * m * float(per)
    # context parallelism: all-gather K, V forward; reduce-scatter dK, dV backward
    cp = 0.0
    if L.cp > 1:
        a, bw = cluster.link(L.tp * L.cp > dpn)
        shard = 2 * s * L.micro_batch * model.kv * model.hd * 2 / min(L.tp, model.kv)
        cp = 2 * lps * m * ((L.cp - 1) * a + (L.cp - 1) * shard / bw)
    # expert parallelism: dispatch + combine, forward and backward
    ep = 0.0
    if L.ep > 1:
        a, bw = cluster.link(L.ep * L.tp > dpn)
        moe_dev = model.moe_layers * lps / model.layers
        tokens = s * L.micro_batch / (L.tp if (L.sequence_parallel and L.tp > 1) else 1)  # SP splits the tokens over TP
        sent = tokens * model.top_k * model.hidden * 2 * (L.ep - 1) / L.ep
        ep = 4 * moe_dev * m * ((L.ep - 1) * a + sent / bw)
        if rules.overlap_ep:
            ep = max(0.0, ep - compute)
    busy = compute + tp + cp + ep
    bubble = float(Fraction(L.pp - 1, L.v * m)) * busy
    # pipeline hand-offs exposed at fill and drain
    pp = 0.0
    if L.pp > 1:
        a, bw = cluster.link(L.tp * L.cp >= dpn)
        hop = s * L.micro_batch * model.hidden * 2 / (L.tp if (L.sequence_parallel and L.tp > 1) else 1)
        pp = 2 * (L.pp - 1) * (a + hop / bw)
    # data parallelism (over the DP x CP ranks, which hold the same weights)
    d = L.dp * L.cp
    dp = 0.0
    if d > 1:
        a, bw = cluster.link(n > dpn)
        share = lps / model.layers
        groups = [(model.dense_params * share / L.tp, d)]
        if model.experts:
            groups.append((model.expert_params * share / (L.tp * L.ep), d // L.ep))
        for params, size in groups:
            if size < 2:
                continue
            if L.zero < 3:  # one ring over all the (BF16) gradients, bucketed
                dp += float(alpha_beta_time(size, params * 2, a, bw))
            else:  # per micro-batch and per layer: all-gather (forward), all-gather (backward), reduce-scatter
                half_ring = (size - 1) * a + (size - 1) / size * params * 2 / lps / bw
                dp += 3 * lps * m * half_ring
    window = compute if L.zero == 3 else compute * 2 / 3 / m
    dp_exposed = max(0.0, dp - window)
    total = busy + bubble + pp + dp_exposed
    return {"compute": compute, "tp": tp, "cp": cp, "ep": ep, "bubble": bubble, "pp hand-off": pp,
            "dp (total)": dp, "dp exposed": dp_exposed, "total": total}


# ---- enumerating and ranking ---------------------------------------------------------------------------

@dataclass
class Plan:
    """Every layout considered: ``ranked`` (valid, fastest first) and ``rejected`` (with reasons)."""

    model: Model
    cluster: Cluster
    global_batch: int
    rules: Rules
    ranked: list
    rejected: list

    @property
    def best(self) -> Assessment:
        if not self.ranked:
            raise ValueError("no layout satisfies every constraint; see .rejected for the reasons")
        return self.ranked[0]

    def find(self, layout: Layout) -> Assessment:
        for a in self.ranked + self.rejected:
            if a.layout == layout:
                return a
        return assess(self.model, self.cluster, self.global_batch, layout, self.rules)

    def rank_of(self, layout: Layout) -> int | None:
        """1-based position of ``layout`` among the valid layouts (None if rejected or absent)."""
        for i, a in enumerate(self.ranked, 1):
            if a.layout == layout:
                return i
        return None

    def reasons(self) -> dict:
        """How many rejected layouts failed each kind of constraint (first reason only)."""
        out = {}
        for a in self.rejected:
            key = _reason_kind(a.reasons[0])
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _reason_kind(reason: str) -> str:
    for key, words in (("memory", "GB per device"), ("TP across servers", "servers"), ("heads / FFN", "heads"),
                       ("heads / FFN", "FFN"), ("layers", "layers"), ("batch", "global batch"),
                       ("interleaving", "interleaved"), ("sequence", "chunks"), ("experts", "EP=")):
        if words in reason:
            return key
    return "other"


def enumerate_layouts(model: Model, cluster: Cluster, global_batch: int, *, zero_stages=(0, 1, 2, 3),
                      micro_batches=(1, 2, 4, 8), cps=(1,), eps=(1,), vs=(1,), recomputes=RECOMPUTE,
                      max_tp: int | None = None, sequence_parallel=(True,)) -> list:
    """Every layout with DP x TP x PP x CP = devices from the given option lists (TP and PP over
    the divisors of the device count; TP up to ``max_tp``, default twice the server size)."""
    n = cluster.n_devices
    max_tp = max_tp or 2 * cluster.devices_per_node
    out = []
    for tp in divisors(n):
        if tp > max_tp:
            continue
        for cp in cps:
            for pp in divisors(n // tp) if n % tp == 0 else []:
                if (n // tp // pp) % cp or pp > model.layers:
                    continue
                dp = n // (tp * pp * cp)
                for ep in eps:
                    for z in (zero_stages if dp * cp > 1 else (0,)):  # ZeRO needs replicas to shard over
                        for mb in micro_batches:
                            for v in (vs if pp > 1 else (1,)):
                                for rc in recomputes:
                                    for sp in (sequence_parallel if tp > 1 else (True,)):
                                        out.append(Layout(dp, tp, pp, cp, ep, z, mb, v, sp, rc))
    return out


def plan(model: Model, cluster: Cluster, global_batch: int, rules: Rules = Rules(), **options) -> Plan:
    """Assess every layout of :func:`enumerate_layouts` (``options`` go there) and rank the valid ones."""
    done = [assess(model, cluster, global_batch, lay, rules) for lay in enumerate_layouts(model, cluster, global_batch, **options)]
    ranked = sorted((a for a in done if a.ok), key=lambda a: (a.step_s, a.layout.zero, a.layout.pp, a.layout.tp))
    return Plan(model, cluster, global_batch, rules, ranked, [a for a in done if not a.ok])


def table(assessments, k: int = 10) -> str:
    """A plain-text table of the first ``k`` assessments."""
    rows = [a.row() for a in list(assessments)[:k]]
    if not rows:
        return "(none)"
    head = f"{'layout':40s} {'m':>5s} {'GB/dev':>7s} {'step s':>8s} {'MFU':>6s}  why not"
    lines = [head]
    for r in rows:
        step = f"{r['step s']:8.2f}" if r["step s"] is not None else f"{'-':>8s}"
        mfu = f"{r['MFU']:6.3f}" if r["MFU"] is not None else f"{'-':>6s}"
        m = f"{r['m']:5d}" if r["m"] is not None else f"{'-':>5s}"
        lines.append(f"{r['layout']:40s} {m} {r['GB/device']:7.1f} {step} {mfu}  {r['why not']}")
    return "\n".join(lines)


def report(p: Plan, k: int = 10) -> str:
    """The ``k`` fastest valid layouts, the count of rejections by kind, and the best one explained."""
    lines = [table(p.ranked, k), "", f"rejected: {p.reasons()}"]
    if p.ranked:
        lines += [""] + explain(p.best, p.model, p.cluster)
    return "\n".join(lines)


def format_steps(steps: list, width: int = 95) -> str:
    """The steps of :func:`decision_sequence` or :func:`rule_of_thumb`, one line each."""
    return "\n".join(f"  {s['question']:58s} {'yes' if s['answer'] else 'no ':3s}  {s['detail'][:width]}" for s in steps)


# ---- explaining a choice ------------------------------------------------------------------------------

def neighbours(p: Plan, layout: Layout) -> list:
    """Layouts one knob away from ``layout`` (TP or PP doubled/halved against DP, ZeRO +-1,
    micro-batch doubled/halved, recomputation toggled), each assessed: what each choice avoided."""
    out = []

    def add(what, **changes):
        try:
            alt = replace(layout, **changes)
        except ValueError:
            return
        a = p.find(alt)
        out.append((what, a))

    for dim in ("tp", "pp"):
        cur = getattr(layout, dim)
        if layout.dp % 2 == 0:
            add(f"{dim.upper()} x2 (DP /2)", **{dim: cur * 2, "dp": layout.dp // 2})
        if cur % 2 == 0:
            add(f"{dim.upper()} /2 (DP x2)", **{dim: cur // 2, "dp": layout.dp * 2, **({"v": 1} if dim == "pp" and cur == 2 else {})})
    for z in (layout.zero - 1, layout.zero + 1):
        if 0 <= z <= 3:
            add(f"ZeRO-{z}", zero=z)
    add("micro-batch x2", micro_batch=layout.micro_batch * 2)
    if layout.micro_batch % 2 == 0:
        add("micro-batch /2", micro_batch=layout.micro_batch // 2)
    add("recompute toggled", recompute="full" if layout.recompute == "none" else "none")
    return out


def explain(a: Assessment, model: Model, cluster: Cluster) -> list:
    """Sentences that say why each degree of ``a.layout`` is what it is (12.4.1's reading of a table)."""
    L, dpn = a.layout, cluster.devices_per_node
    lines = []
    if not a.ok:
        return [f"{L.label()} is rejected: " + "; ".join(a.reasons)]
    t, mem = a.time, a.memory
    pct = lambda x: f"{100 * x / t['compute']:.1f}% of compute"
    if L.tp > 1:
        lines.append(f"TP={L.tp}: {model.heads // L.tp} of {model.heads} heads and {model.ffn // L.tp} of {model.ffn} FFN columns per device; "
                     f"{'inside one server' if L.tp <= dpn else 'ACROSS servers'}; its all-reduces cost {t['tp']:.2f} s per step ({pct(t['tp'])}).")
    else:
        lines.append("TP=1: no tensor parallelism; the layers fit whole on a device.")
    if L.pp > 1:
        lines.append(f"PP={L.pp}{f' x {L.v} chunks' if L.v > 1 else ''}: {math.ceil(model.layers / L.pp)} layers per stage; with m = {a.m} micro-batches "
                     f"the bubble costs {t['bubble']:.2f} s ({pct(t['bubble'])}; (p-1)/(v m) = {L.pp - 1}/{L.v * a.m}).")
    else:
        lines.append("PP=1: no pipeline, no bubble.")
    if L.cp > 1:
        lines.append(f"CP={L.cp}: {model.seq_len // L.cp} tokens per device; K/V gathers cost {t['cp']:.2f} s ({pct(t['cp'])}).")
    if L.ep > 1:
        lines.append(f"EP={L.ep}: {model.experts // L.ep} of {model.experts} experts per device; all-to-alls cost {t['ep']:.2f} s ({pct(t['ep'])}).")
    lines.append(f"DP={L.dp} with ZeRO-{L.zero}: {a.m} micro-batches of {L.micro_batch} per replica; the gradient sync takes "
                 f"{t['dp (total)']:.2f} s of which {t['dp exposed']:.2f} s is not hidden behind the backward pass.")
    lines.append(f"Memory per device: {mem['total'] / GB:.1f} of {mem['capacity'] / GB:.0f} GB (weights {mem['weights'] / GB:.1f}, "
                 f"gradients {mem['gradients'] / GB:.1f}, optimizer {mem['optimizer'] / GB:.1f}, activations {mem['activations'] / GB:.1f}, "
                 f"reserve {mem['reserve'] / GB:.1f}){'; full recomputation' if L.recompute == 'full' else ''}.")
    lines.append(f"Step {t['total']:.2f} s = compute {t['compute']:.2f} + TP {t['tp']:.2f} + CP {t['cp']:.2f} + EP {t['ep']:.2f} + bubble "
                 f"{t['bubble']:.2f} + hand-offs {t['pp hand-off']:.3f} + exposed DP {t['dp exposed']:.2f}; model FLOPs utilisation {a.mfu:.1%}.")
    return lines


# ---- the chapters' recipes ---------------------------------------------------------------------------------

def _fits(model, cluster, global_batch, layout, rules):
    a = assess(model, cluster, global_batch, layout, rules)
    return a, a.ok


def _state_fits(a: Assessment, cluster: Cluster) -> bool:
    m = a.memory
    return bool(m) and m["weights"] + m["gradients"] + m["optimizer"] + m["reserve"] <= cluster.memory_bytes


def _try(model, cluster, global_batch, layout, rules):
    """Assess ``layout``; if only activations overflow, try again with full recomputation."""
    a = assess(model, cluster, global_batch, layout, rules)
    if not a.ok and layout.recompute == "none" and _state_fits(a, cluster) and all("GB per device" in r for r in a.reasons):
        b = assess(model, cluster, global_batch, replace(layout, recompute="full"), rules)
        if b.ok:
            return b
    return a


def _detail(a: Assessment) -> str:
    if a.ok:
        return f"{a.memory['total'] / GB:.1f} GB per device" + (", recomputing activations" if a.layout.recompute == "full" else "")
    return a.reasons[0]


def decision_sequence(model: Model, cluster: Cluster, global_batch: int, rules: Rules = Rules(),
                      bubble_target: float = 0.1, micro_batch: int = 1, activation_share: float = 0.5) -> tuple:
    """P.15's questions, asked in order of increasing cost; returns (layout or None, steps).

    1. Does the model fit on one device with its training state and a micro-batch of
       activations? Then data parallelism alone.
    6. Long sequences are a separate axis: asked once, right after question 1, because the answer
       changes every later layout. Context parallelism of the smallest degree c (a power of two)
       for which one micro-batch's activations, at TP = server size with sequence parallelism and
       full recomputation, take at most ``activation_share`` of a device.
    2. Reduce the footprint without a new communication pattern: ZeRO-1, then ZeRO-2, over all
       data-parallel devices (recomputing activations when only they overflow).
    3. Tensor parallelism inside a server: the smallest degree that fits, up to the server size.
    4. Pipeline stages across servers (TP = server size): the fewest that fit; then the bubble
       (p-1)/(m+p-1) (P.9's definition) with the most micro-batches the batch allows is checked
       against ``bubble_target``.
    5. Data parallelism over the remaining devices (the DP of every layout above).
    Each step is a dict: question, answer (bool), detail, layout (the layout chosen, if any).
    """
    n, dpn = cluster.n_devices, cluster.devices_per_node
    steps = []
    one = Cluster(**{**cluster.__dict__, "n_devices": 1, "name": "one device"})
    a = assess(model, one, micro_batch, Layout(dp=1, micro_batch=micro_batch), rules)
    steps.append({"question": "1. Fits on one device (training state + one micro-batch)?", "answer": a.ok,
                  "detail": f"{a.memory['total'] / GB:.1f} GB needed of {cluster.memory_bytes / GB:.0f} GB", "layout": None})
    if a.ok:
        lay = Layout(dp=n, micro_batch=micro_batch)
        steps.append({"question": "=> data parallelism alone", "answer": True, "detail": lay.label(), "layout": lay})
        return lay, steps
    tps = [t for t in divisors(dpn) if t > 1 and n % t == 0 and model.heads % t == 0]
    tmax = max(tps) if tps else 1
    cp = 1
    while True:
        act = activation_bytes(model, Layout(dp=1, tp=tmax, cp=cp, micro_batch=micro_batch, recompute="full"), 1, rules)["total"]
        if act <= activation_share * cluster.memory_bytes or n % (tmax * cp * 2) or model.seq_len % (4 * cp):
            break
        cp *= 2
    steps.append({"question": f"6. Long sequence: one micro-batch's activations (TP={tmax}, recomputed) need CP?", "answer": cp > 1,
                  "detail": f"{act / GB:.1f} GB at CP={cp} (limit {activation_share:.0%} of {cluster.memory_bytes / GB:.0f} GB)", "layout": None})
    for z in (1, 2):
        lay = Layout(dp=n // cp, cp=cp, zero=z, micro_batch=micro_batch)
        a = _try(model, cluster, global_batch, lay, rules)
        steps.append({"question": f"2. DP={n // cp}{f' x CP={cp}' if cp > 1 else ''} with ZeRO-{z} fits?", "answer": a.ok,
                      "detail": _detail(a), "layout": a.layout if a.ok else None})
        if a.ok:
            return a.layout, steps
    for rc in RECOMPUTE:  # more TP before recomputing activations
        for t in tps:
            if n % (t * cp):
                continue
            lay = Layout(dp=n // (t * cp), tp=t, cp=cp, zero=1, micro_batch=micro_batch, recompute=rc)
            a = assess(model, cluster, global_batch, lay, rules)
            if rc == "full" and not _state_fits(a, cluster):
                continue
            steps.append({"question": f"3. TP={t} inside a server (ZeRO-1{', recompute' if rc == 'full' else ''}) fits?",
                          "answer": a.ok, "detail": _detail(a), "layout": a.layout if a.ok else None})
            if a.ok:
                return a.layout, steps
    for rc in RECOMPUTE:  # more stages before recomputing activations
        for p in divisors(n // (tmax * cp)):
            if p == 1 or p > model.layers:
                continue
            lay = Layout(dp=n // (tmax * p * cp), tp=tmax, pp=p, cp=cp, zero=1, micro_batch=micro_batch, recompute=rc)
            a = assess(model, cluster, global_batch, lay, rules)
            if not a.ok and any("GB per device" not in r for r in a.reasons):
                continue  # p does not divide the layers (or the batch): not a candidate
            if rc == "full" and not _state_fits(a, cluster):
                continue
            steps.append({"question": f"4. TP={tmax} x PP={p} across servers{' (recompute)' if rc == 'full' else ''} fits?",
                          "answer": a.ok, "detail": _detail(a), "layout": a.layout if a.ok else None})
            if not a.ok:
                continue
            bubble = Fraction(p - 1, a.m + p - 1)
            steps.append({"question": f"4b. Bubble (p-1)/(m+p-1) <= {bubble_target:.0%}?", "answer": bubble <= bubble_target,
                          "detail": f"p = {p}, m = {a.m}: {float(bubble):.1%}" + ("" if bubble <= bubble_target else
                                    " (more micro-batches need a bigger batch or a smaller micro-batch; or interleave)"),
                          "layout": a.layout})
            return a.layout, steps
    steps.append({"question": "no layout in the sequence fits", "answer": False, "detail": "", "layout": None})
    return None, steps


def rule_of_thumb(model: Model, cluster: Cluster, global_batch: int, rules: Rules = Rules(), zero: int = 1,
                  micro_batch: int = 1) -> tuple:
    """12.4.1's recipe: TP = the server size first; then PP (or ZeRO-3 when the batch cannot give
    m >= 4p) until the model fits; then DP for the rest, ZeRO-1. Returns (layout or None, steps)."""
    n, dpn = cluster.n_devices, cluster.devices_per_node
    t = max(d for d in divisors(dpn) if model.heads % d == 0 and model.ffn % d == 0 and n % d == 0)
    steps = [{"question": "1. TP up to the server size", "answer": True, "detail": f"TP = {t}", "layout": None}]
    lay = Layout(dp=n // t, tp=t, zero=zero, micro_batch=micro_batch)
    a, ok = _fits(model, cluster, global_batch, lay, rules)
    steps.append({"question": f"2. Fits with TP={t}, PP=1?", "answer": ok,
                  "detail": a.reasons[0] if a.reasons else f"{a.memory['total'] / GB:.1f} GB", "layout": lay if ok else None})
    if ok:
        steps.append({"question": "3. DP for the rest", "answer": True, "detail": lay.label(), "layout": lay})
        return lay, steps
    for p in divisors(n // t):
        if p == 1:
            continue
        lay = Layout(dp=n // (t * p), tp=t, pp=p, zero=zero, micro_batch=micro_batch)
        a, ok = _fits(model, cluster, global_batch, lay, rules)
        if not ok and a.reasons and "layers" in a.reasons[0] and "GB" not in a.reasons[0]:
            continue
        if ok:
            if a.m >= 4 * p:
                steps.append({"question": f"2. PP={p}: fits, and m = {a.m} >= 4p = {4 * p}", "answer": True, "detail": lay.label(), "layout": lay})
                return lay, steps
            z3 = Layout(dp=n // t, tp=t, zero=3, micro_batch=micro_batch)
            a3, ok3 = _fits(model, cluster, global_batch, z3, rules)
            steps.append({"question": f"2. PP={p} fits but m = {a.m} < 4p = {4 * p}: ZeRO-3 instead?", "answer": ok3,
                          "detail": a3.reasons[0] if a3.reasons else z3.label(), "layout": z3 if ok3 else lay})
            return (z3 if ok3 else lay), steps
        steps.append({"question": f"2. Fits with TP={t}, PP={p}?", "answer": False, "detail": a.reasons[0], "layout": None})
    return None, steps


# ---- the worked examples of P.11 and 12.4.1 -------------------------------------------------------------

def book_p11() -> list:
    """P.11's 40B example (16 devices as DP2 x TP4 x PP2, 32 layers, 32 heads): rows (quantity, book, computed)."""
    from .pipeline_schedule import bubble_formula

    N, dp, tp, pp = 40e9, 2, 4, 2
    shard = N / (tp * pp)
    z1 = per_device_bytes(shard, dp, 1)
    return [
        ("devices DP x TP x PP", 16, dp * tp * pp),
        ("layers per stage 32/PP", 16, 32 // pp),
        ("heads per device 32/TP", 8, 32 // tp),
        ("share of the weights per device", "1/8", str(Fraction(1, tp * pp))),
        ("training state, 16 B/param (GB)", 640, 16 * N / GB),
        ("per device without sharding (GB)", 80, 16 * shard / GB),
        ("weights + gradients, 4 x 40e9 / 8 (GB)", 20, (z1["weights"] + z1["gradients"]) / GB),
        ("optimizer state over DP=2, 12 x 40e9 / 16 (GB)", 30, (z1["master"] + z1["moments"]) / GB),
        ("total per device with ZeRO-1 (GB)", 50, sum(z1.values()) / GB),
        ("left for activations of 80 GB (GB)", 30, 80 - sum(z1.values()) / GB),
        ("global batch 2 x 8 x 4 (sequences)", 64, dp * 8 * 4),
        ("bubble (p-1)/(m+p-1), p=2, m=8", "1/9 = 11.1%", f"{bubble_formula(2, 8)} = {float(bubble_formula(2, 8)):.1%}"),
    ]


def book_12_4_1() -> dict:
    """12.4.1's worked numbers recomputed: the 70B example, the 405B step-up, the 100B answer, the
    bubble rule. Each entry: (book, computed, comment)."""
    from .pipeline_schedule import bubble_formula

    out = {}
    P70, tp, dp = 70e9, 8, 32
    out["70B BF16 weights (GB)"] = (140, P70 * 2 / GB, "")
    out["70B weights per GPU at TP=8 (GB)"] = (17.5, P70 * 2 / tp / GB, "")
    out["replica per node -> DP"] = (32, 256 // tp, "")
    out["sequences per replica"] = (64, 2048 // dp, "")
    out["Adam moments, fp32, whole model (GB)"] = (560, P70 * 8 / GB, "")
    out["moments per GPU, sharded over DP=32 (GB)"] = (17.5, P70 * 8 / (tp * dp) / GB,
                                                       "each GPU holds a TP shard (1/8) of the model; ZeRO shards that over 32")
    z1 = per_device_bytes(P70 / tp, dp, 1)
    out["per-GPU model state, ZeRO-1 (GB)"] = (52.5, sum(z1.values()) / GB, "BF16 weights + BF16 grads + FP32 master and moments / 32")
    grads_gpu = P70 * 2 / tp
    sent = 2 * (dp - 1) / dp * grads_gpu
    out["gradient bytes each GPU sends per step (GB)"] = (4.4, sent / GB, "reduce-scatter + all-gather of its 17.5 GB shard's gradients over 32 ranks")
    out["gradient sync at 25 GB/s (s)"] = (0.175, sent / 25e9, "")
    flops_gpu = 6 * P70 * 2048 * 4096 / 256
    out["forward+backward per step at 100% of 989 TFLOP/s (s)"] = ("0.2-0.25", flops_gpu / 989e12, "6 N tokens / 256 GPUs")
    out["405B BF16 weights (GB)"] = (810, 405e9 * 2 / GB, "")
    out["405B weights per GPU at TP=8 (GB)"] = (101, 405e9 * 2 / 8 / GB, "")
    out["405B weights per GPU at TP=8, PP=8 (GB)"] = (12.6, 405e9 * 2 / 64 / GB, "")
    out["100B weights per GPU at TP=8 (GB)"] = (25, 100e9 * 2 / 8 / GB, "")
    out["100B on 512 GPUs: DP"] = (64, 512 // 8, "")
    out["100B: sequences per replica"] = (32, 2048 // 64, "")
    out["bubble (p-1)/m at m = 4p, p = 8"] = ("< ~20%", float(bubble_formula(8, 32, definition="useful")), "7/32")
    out["bubble (p-1)/(m+p-1) at m = 4p, p = 8"] = ("< ~20%", float(bubble_formula(8, 32)), "7/39, P.9's definition")
    return out


# ---- models used by the notebooks ------------------------------------------------------------------------

def book_70b(seq_len: int = 4096) -> Model:
    """12.4.1's 70B dense model: h 8192, 80 layers, 64 heads, 70e9 parameters (Llama-3-70B-like FFN)."""
    return Model("70B (12.4.1)", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, mlp_matrices=3,
                 seq_len=seq_len, vocab=128256, n_params=70e9)


def book_100b(seq_len: int = 4096) -> Model:
    """12.4.1's 100B dense model. The section gives only the size: we take 80 layers of h 10240
    (80 heads of 128), 12 L h^2 = 100.7e9, and use 100e9."""
    return Model("100B (12.4.1, shapes assumed)", layers=80, hidden=10240, heads=80, ffn=40960, seq_len=seq_len, n_params=100e9)


def p11_40b(seq_len: int = 2048) -> Model:
    """P.11's 40B model: 32 layers and 32 heads are the section's; h 10240 and s 2048 are ours
    (12 L h^2 = 40.3e9)."""
    return Model("40B (P.11, h and s assumed)", layers=32, hidden=10240, heads=32, ffn=40960, seq_len=seq_len, n_params=40e9)


def p11_cluster() -> Cluster:
    """P.11's toy cluster: 16 devices, 4 per server, 80 GB each (the section's 'illustrative' figures);
    speeds are H100's (data/hardware.json)."""
    return h100_cluster(16, name="16 devices, 4 per server (P.11)", devices_per_node=4, reserve_bytes=0.0)
