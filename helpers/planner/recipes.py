"""The chapters' own recipes for a layout, and their worked examples (P.15, 12.4.1, P.11).

:func:`decision_sequence` asks P.15's questions in order of increasing cost; :func:`rule_of_thumb`
follows 12.4.1's recipe (TP first, then PP or ZeRO-3, then DP). Each answer is checked with
:func:`helpers.planner.assess.assess`, so it can be set beside the planner's ranking
(:func:`helpers.planner.plan`). :func:`book_p11` and :func:`book_12_4_1` recompute the sections'
worked numbers.
"""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from .. import costs
from ..memory import GB, per_device_bytes
from ..pipeline_schedule import bubble_formula
from .assess import RECOMPUTE, Assessment, Layout, Rules, assess, stage_activation_bytes
from .specs import Cluster, Model, divisors

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
        act = stage_activation_bytes(model, Layout(dp=1, tp=tmax, cp=cp, micro_batch=micro_batch, recompute="full"), 1, rules)["total"]
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
            bubble = bubble_formula(p, a.m)
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
    sent = costs.allreduce_bytes(dp, grads_gpu)
    out["gradient bytes each GPU sends per step (GB)"] = (4.4, sent / GB, "reduce-scatter + all-gather of its 17.5 GB shard's gradients over 32 ranks")
    out["gradient sync at 25 GB/s (s)"] = (0.175, sent / 25e9, "")
    flops_gpu = costs.training_flops_per_token(P70) * 2048 * 4096 / 256
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
