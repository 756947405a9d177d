"""Published training configurations read back with the planner (12.4.2): Llama 3 405B, DeepSeek-V3, Gemma 2.

The configurations live in ``data/configs/*.json`` with the paper (and table or section) each
figure comes from, and a list of what is uncertain. This module turns them into
:class:`helpers.planner.Model`, :class:`~helpers.planner.Cluster` and
:class:`~helpers.planner.Layout` objects, checks the parameter counts against the published
totals, and recomputes 12.4.2's numbers beside the published ones.
"""
from __future__ import annotations

import json
from fractions import Fraction

from . import costs
from .memory import GB
from .pipeline_schedule import bubble_formula, min_microbatches
from .planner.assess import Layout, Rules, assess
from .planner.specs import DATA, Cluster, Model, h100_cluster, hardware

CONFIGS = DATA / "configs"
NAMES = ("llama3_405b", "deepseek_v3", "gemma2")


def load(name: str) -> dict:
    """The JSON of ``data/configs/<name>.json`` (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise ValueError(f"unknown configuration {name!r}: allowed are {NAMES}")
    return json.loads((CONFIGS / f"{name}.json").read_text())


def sources(name: str) -> dict:
    """The publications a configuration file cites."""
    return load(name)["sources"]


# ---- Llama 3 405B --------------------------------------------------------------------------------

def llama3_model(seq_len: int = 8192) -> Model:
    m = load("llama3_405b")["model"]
    return Model("Llama 3 405B", layers=m["layers"], hidden=m["hidden"], heads=m["heads"], kv_heads=m["kv_heads"],
                 ffn=m["ffn"], mlp_matrices=m["mlp_matrices"], seq_len=seq_len, vocab=m["vocab"],
                 tied_embeddings=m["tied_embeddings"])


def llama3_phases() -> list:
    """Table 4's three rows: dicts with the phase, GPUs, the layout (micro-batch 1, ZeRO-2 for
    'FSDP sharding optimizer state and gradients'), the global batch in sequences, the model at
    that sequence length and the published MFU."""
    cfg = load("llama3_405b")["parallelism"]
    out = []
    for ph in cfg["phases"]:
        lay = Layout(dp=ph["dp"], tp=ph["tp"], pp=ph["pp"], cp=ph["cp"], zero=2, micro_batch=1)
        out.append({"phase": ph["phase"], "gpus": ph["gpus"], "layout": lay, "global_batch": ph["dp"] * ph["batch_per_dp"],
                    "model": llama3_model(ph["seq_len"]), "mfu": ph["bf16_mfu"], "tokens": ph["dp"] * ph["batch_per_dp"] * ph["seq_len"]})
    return out


LLAMA_RULES = Rules(allow_uneven_stages=True, dropout=False)  # 126 layers on 16 stages (8 each, one fewer on the first and last); no dropout


# ---- DeepSeek-V3 ---------------------------------------------------------------------------------

def mla_params(hidden: int, heads: int, head_dim: int, kv_compression: int, query_compression: int, rope_head_dim: int) -> int:
    """Weights of one multi-head latent attention block (DeepSeek-V2/V3): query down and up
    projections, the joint KV down projection with the decoupled RoPE key, the KV up projection,
    the output projection, and the two RMSNorms on the compressed vectors."""
    q_down = hidden * query_compression + query_compression
    q_up = query_compression * heads * (head_dim + rope_head_dim)
    kv_down = hidden * (kv_compression + rope_head_dim) + kv_compression
    kv_up = kv_compression * heads * (head_dim + head_dim)  # keys (no RoPE part) and values
    out = heads * head_dim * hidden
    return q_down + q_up + kv_down + kv_up + out


def deepseek_model(seq_len: int = 4096) -> Model:
    m = load("deepseek_v3")["model"]
    attn = mla_params(m["hidden"], m["heads"], m["head_dim"], m["mla"]["kv_compression"], m["mla"]["query_compression"],
                      m["mla"]["rope_head_dim"])
    return Model("DeepSeek-V3", layers=m["layers"], hidden=m["hidden"], heads=m["heads"], head_dim=m["head_dim"],
                 ffn=m["dense_ffn"], mlp_matrices=m["mlp_matrices"], seq_len=seq_len, vocab=m["vocab"],
                 tied_embeddings=m["tied_embeddings"], attention_params=attn, moe_layers=m["moe_layers"],
                 experts=m["routed_experts"], top_k=m["top_k"], expert_ffn=m["expert_ffn"], shared_experts=m["shared_experts"])


def deepseek_cluster() -> Cluster:
    """2048 H800s, 8 per node; links at the report's achieved 160 GB/s (NVLink) and 50 GB/s (IB).
    Compute and memory as H100 SXM (assumed: the H800 differs from the H100 in its links)."""
    hw = load("deepseek_v3")["hardware"]
    return h100_cluster(hw["devices"], name="2048 x H800", intra_bw=hw["nvlink_achieved_GBps"] * 1e9, inter_bw=hw["ib_GBps"] * 1e9)


def deepseek_layouts() -> dict:
    """The published layout (PP16, EP64 inside DP128, no TP, ZeRO-1) and a dense-style one
    (TP8 inside the node, EP8, DP16) on the same 2048 GPUs; both recompute activations."""
    return {"published: PP16 EP64 DP128, no TP": Layout(dp=128, tp=1, pp=16, ep=64, zero=1, recompute="full"),
            "dense recipe: TP8 PP16 EP8 DP16": Layout(dp=16, tp=8, pp=16, ep=8, zero=1, recompute="full")}


DEEPSEEK_RULES = Rules(allow_uneven_stages=True, dropout=False)  # 61 layers on 16 stages; no dropout


def deepseek_ratio(global_batch: int = 15360) -> dict:
    """Computation against cross-node all-to-all time in the published layout, from the planner's
    model: each token's ``top_k`` copies over IB, and with node-limited routing (at most 4 nodes
    per token, forwarded inside a node over NVLink) only up to 4 copies over IB."""
    model, cl = deepseek_model(), deepseek_cluster()
    lay = deepseek_layouts()["published: PP16 EP64 DP128, no TP"]
    a = assess(model, cl, global_batch, lay, DEEPSEEK_RULES)
    nodes = load("deepseek_v3")["model"]["max_nodes_per_token"]
    # the recomputed forward does not repeat the all-to-alls in this model; compare with plain compute
    compute = a.time["compute"] * 3 / 4
    return {"compute s": compute, "all-to-all s (top-8 copies over IB)": a.time["ep"],
            "all-to-all s (<= 4 node copies over IB)": a.time["ep"] * nodes / model.top_k,
            "ratio, 8 copies": compute / a.time["ep"], "ratio, 4 copies": compute / (a.time["ep"] * nodes / model.top_k)}


def deepseek_ep(seq_len: int = 4096, micro_batch: int = 1) -> dict:
    """DeepSeek-V3's expert parallelism read back from the shapes (12.4.2): parameters per GPU under
    PP 16 x EP 64 without TP, and the bytes each GPU sends in one MoE layer's forward for a micro-batch
    of ``micro_batch`` x ``seq_len`` tokens, beside tensor parallelism over the same experts.

    Dispatch travels in FP8 and combine in BF16 (report Section 3.3.3; the backward's two
    all-to-alls the same). EP sends each token's top-k copies, (EP-1)/EP of them to other GPUs
    (:func:`helpers.costs.moe_all_to_all_sent`, even routing). TP over the experts instead splits
    every expert's matrices t ways and all-reduces the layer's output, s b h BF16 values, once
    forward (and once backward); its t GPUs share one micro-batch, so for the same tokens per GPU
    each sends t all-reduces' worth (:func:`helpers.costs.allreduce_bytes`). Returns two dicts of
    name -> value: ``params`` (counts) and ``bytes`` (bytes sent per GPU).
    """
    cfg = load("deepseek_v3")
    m, ep, pp, comm = cfg["model"], cfg["parallelism"]["ep"], cfg["parallelism"]["pp"], cfg["moe_communication"]
    c = deepseek_model(seq_len).counted()
    h, k, E = m["hidden"], m["top_k"], m["routed_experts"]
    tokens = seq_len * micro_batch
    routed, rest = c["routed experts"], sum(c.values()) - c["routed experts"]
    expert = E // ep * costs.mlp_params(h, m["expert_ffn"], m["mlp_matrices"])
    other = c["attention"] / m["layers"] + c["shared experts and routers"] / m["moe_layers"]
    params = {"experts per GPU per MoE layer": E // ep,
              "one MoE layer on one GPU: routed experts": expert,
              "one MoE layer on one GPU: attention, shared expert, router": other,
              "one MoE layer on one GPU: the same with TP 8 on the non-expert parts": expert + other / 8,
              "per GPU, 16 stages averaged: routed experts": routed / (pp * ep),
              "per GPU, 16 stages averaged: everything else": rest / pp,
              "per GPU, 16 stages averaged: total": routed / (pp * ep) + rest / pp}
    sent = {b: costs.moe_all_to_all_sent(tokens, k, h, ep, b) for b in (1, 2)}
    out = costs.allreduce_bytes
    nbytes = {"EP 64 dispatch (FP8)": sent[comm["dispatch_bytes_per_value"]],
              "EP 64 combine (BF16)": sent[comm["combine_bytes_per_value"]],
              "EP 64 dispatch + combine, as published": sent[comm["dispatch_bytes_per_value"]] + sent[comm["combine_bytes_per_value"]],
              "EP 64 dispatch + combine, both BF16": 2 * sent[2],
              "TP 64 over the experts, per micro-batch (shared by 64 GPUs)": out(ep, tokens * h * 2),
              "TP 64 over the experts, same tokens per GPU as EP": ep * out(ep, tokens * h * 2),
              "TP 8 over the experts (in the node), same tokens per GPU": 8 * out(8, tokens * h * 2)}
    return {"params": params, "bytes": nbytes}


# ---- Gemma 2 -------------------------------------------------------------------------------------

def gemma2_model(size: str = "27B", seq_len: int | None = None) -> Model:
    """Gemma 2 from Table 1. Table 1's 'Feedforward dim' counts both gated GeGLU branches, so one
    matrix is ffn/2 wide (this reproduces Table 2's parameter counts exactly, see
    :func:`gemma2_param_check`)."""
    cfg = load("gemma2")["models"]
    if size not in ("2B", "9B", "27B"):
        raise ValueError(f"size must be '2B', '9B' or '27B', got {size!r}")
    m = cfg[size]
    return Model(f"Gemma 2 {size}", layers=m["layers"], hidden=m["hidden"], heads=m["heads"], kv_heads=m["kv_heads"],
                 head_dim=m["head_dim"], ffn=m["ffn"] // 2, mlp_matrices=3, seq_len=seq_len or cfg["common"]["seq_len"],
                 vocab=m["vocab"], tied_embeddings=True)


def gemma2_param_check(size: str = "27B") -> dict:
    """Counted parameters (plus 4 RMSNorms per layer and the final one) against Table 2."""
    m, pub = gemma2_model(size), load("gemma2")["models"][size]
    c = m.counted()
    norms = (4 * m.layers + 1) * m.hidden
    non_emb = c["attention"] + c["dense mlp"] + norms
    return {"non-embedding, counted": non_emb, "non-embedding, Table 2": pub["non_embedding_params"],
            "embedding, counted": c["embeddings"], "embedding, Table 2": pub["embedding_params"]}


def gemma2_cluster(size: str = "27B") -> Cluster:
    """The TPU slice of Table 3 as one flat domain (no server boundary: a 3D torus).

    TPU v5p figures from Google's documentation; each chip's 1200 GB/s bidirectional ICI spread
    over 6 torus links: a ring along one axis uses 2 of them, 200 GB/s each way (assumed)."""
    cfg = load("gemma2")
    infra, v5p = cfg["training_infrastructure"][size], cfg["tpu_v5p"]
    if infra["tpu"] != "TPUv5p":
        raise ValueError(f"only the 27B (TPU v5p) slice is modelled here; {size} trained on {infra['tpu']}")
    mod = hardware()["modelling"]
    bw = v5p["ici_GBps_bidirectional_per_chip"] * 1e9 / 6
    return Cluster(f"{infra['chips']} x TPU v5p ({infra['topology']})", n_devices=infra["chips"], devices_per_node=infra["chips"],
                   memory_bytes=v5p["hbm_GB"] * 1e9, peak_flops=v5p["bf16_tflops"] * 1e12, intra_bw=bw, inter_bw=bw,
                   alpha_intra=mod["alpha_intra_s"], alpha_inter=mod["alpha_intra_s"], efficiency=mod["efficiency"],
                   reserve_bytes=mod["reserve_bytes"])


def gemma2_published_layout(size: str = "27B", zero: int = 3, micro_batch: int = 1) -> Layout:
    infra = load("gemma2")["training_infrastructure"][size]
    return Layout(dp=infra["data_replicas"], tp=infra["model_shards"], zero=zero, micro_batch=micro_batch)


# ---- 12.4.2's numbers beside the published ones ---------------------------------------------------

def book_12_4_2() -> list:
    """Rows (claim, book, recomputed or published, source) for 12.4.2's Llama 3 and DeepSeek figures."""
    L = load("llama3_405b")
    mdl, par = L["model"], L["parallelism"]["phases"]
    row2, row3 = par[1], par[2]
    dsv = load("deepseek_v3")
    dm = deepseek_model()
    rows = [
        ("Llama 3: layers, hidden", "126, 16,384", f"{mdl['layers']}, {mdl['hidden']:,}", "Table 3"),
        ("BF16 weights per GPU at TP=8 (GB)", "~101", f"{405e9 * 2 / 8 / GB:.1f}", "arithmetic"),
        ("layers per stage at PP=16", "~8", f"{mdl['layers']}/16 = {mdl['layers'] / 16}; 8 with one fewer on the first and last stage", "Section 3.3.2"),
        ("BF16 weights per GPU at TP=8, PP=16 (GB)", "~12.6", f"{405e9 * 2 / 128 / GB:.2f}", "arithmetic (12.6 is 810/64: PP=8)"),
        ("DP at ~16K GPUs", "~125", f"{row2['dp']} on {row2['gpus']:,} GPUs", "Table 4"),
        ("tokens per step", "125 x 4 x 4096 ~ 2M", f"{row2['dp']} x {row2['batch_per_dp']} x {row2['seq_len']:,} = {row2['dp'] * row2['batch_per_dp'] * row2['seq_len'] / 1e6:.1f}M",
         "Table 4 (16M; the schedule starts at 4M, Section 3.4.1)"),
        ("micro-batches per replica", "4", f"{row2['batch_per_dp']} sequences per DP rank", "Table 4"),
        ("pipeline bubble (p-1)/m of that batch", "(not computed)", f"book's m=4: 15/4 = {15 / 4:.2f}; published m=16, V=1: {15 / 16:.2f}", "12.2.2's formula"),
        ("CP degree for 128K", "8", f"{row3['cp']}", "Table 4"),
        ("long-context phase", "fine-tuning", "continued pre-training ('long-context pre-training')", "Sections 2, 3.4.2"),
        ("faulty-GPU interruptions", "148", f"{L['reliability']['faulty_gpu']} in a {L['reliability']['period_days']}-day snapshot "
                                              f"({L['reliability']['unexpected']} unexpected of {L['reliability']['interruptions']})", "Table 5"),
        ("DeepSeek-V3: PP, EP, TP", "16, 64, none", f"{dsv['parallelism']['pp']}, {dsv['parallelism']['ep']}, none", "Section 3.2"),
        ("DeepSeek-V3: total / active parameters (B)", "671 / 37", f"{dm.total_params / 1e9:.1f} / {dm.active_params / 1e9:.1f} counted", "Section 4.2 shapes"),
        ("routed-expert share of the parameters", "'dominate'", f"{dm.expert_params / dm.total_params:.1%}", "counted"),
        ("EP 'sized to the expert count'", "EP = experts", f"EP {dsv['parallelism']['ep']} for {dsv['model']['routed_experts']} experts: "
                                                             f"{dsv['model']['routed_experts'] // dsv['parallelism']['ep']} per GPU", "Section 4.2"),
    ]
    return rows


def pp32_rule() -> dict:
    """12.4.2's 1T answer: PP=32 'demands m >= 128 to stay under 20%' under (p-1)/m."""

    return {"(p-1)/m at p=32, m=128": float(bubble_formula(32, 128, definition="useful")),
            "m for (p-1)/m <= 20%": min_microbatches(32, Fraction(1, 5), "useful"),
            "(p-1)/(m+p-1) at p=32, m=128": float(bubble_formula(32, 128)),
            "m for (p-1)/(m+p-1) <= 20%": min_microbatches(32, Fraction(1, 5), "total")}
