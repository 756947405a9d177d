"""The cost model of tensor parallelism and the sections' worked examples (P.8, 12.2.1), torch-free.

Each TP all-reduce carries one (s, b, h) activation (:func:`activation_tensor_bytes`); a ring sends
2(t-1)/t of it per device (:func:`allreduce_bytes_per_device`, on :mod:`helpers.costs`). One
layer's forward FLOPs per rank (:func:`per_rank_layer_flops`) against its all-reduce time gives
the compute-vs-communication sweep over TP degrees (:func:`tp_layer_times`, :func:`tp_sweep`),
with the sections' links (:func:`book_link`); :func:`book_p8` and :func:`book_12_2_1` recompute
their worked examples.
"""
from __future__ import annotations

from .. import costs
from ..tp_numpy import check_degree
from ..validate import integer_at_least, positive_number

H100_BF16_FLOPS = 989e12  # dense BF16 peak the section uses
NVLINK_ALLREDUCE_BPS = 600e9  # "NVLink effective AllReduce bandwidth ~600 GB/s" (12.2.1)
INFINIBAND_BPS = 25e9  # "InfiniBand (25 GB/s)" (12.2.1)
P8_LINK_BPS = 400e9  # "an assumed 400 GB/s intra-node link" (P.8)


def activation_tensor_bytes(s: int, b: int, h: int, bytes_per_element: int = 2) -> int:
    """Bytes of one (s, b, h) activation: the payload of every TP all-reduce."""
    for name, v in (("s", s), ("b", b), ("h", h), ("bytes_per_element", bytes_per_element)):
        integer_at_least(v, name)
    return s * b * h * bytes_per_element


def allreduce_bytes_per_device(s: int, b: int, h: int, t: int, bytes_per_element: int = 2) -> float:
    """What each device sends in a ring all-reduce of the (s, b, h) activation: 2(t-1)/t s b h bytes."""
    t = check_degree(t)
    return costs.allreduce_bytes(t, activation_tensor_bytes(s, b, h, bytes_per_element))


def per_rank_layer_flops(s: int, b: int, h: int, ffn: int, t: int = 1, mlp_matrices: int = 2) -> float:
    """Forward FLOPs of one transformer layer on one of t TP ranks (2 FLOPs per multiply-add).

    QKV 6sbh^2, output projection 2sbh^2, MLP 2 x mlp_matrices x sbh*ffn (2 for GeLU MLPs, 3 for
    SwiGLU), attention scores and weighted values 4bs^2h (:func:`helpers.costs.layer_forward_flops`
    on the s b tokens); all divided by t.
    """
    t = check_degree(t)
    return costs.layer_forward_flops(s * b, h, ffn, s, mlp_matrices) / t


def tp_layer_times(s, b, h, ffn, t, flops_per_s, link_bytes_per_s, alpha_s: float = 0.0,
                   bytes_per_element: int = 2, mlp_matrices: int = 2, allreduces: int = 2) -> dict:
    """Forward compute vs communication time of one layer at TP degree t (no overlap).

    compute = per_rank_layer_flops / flops_per_s; comm = allreduces x (2(t-1) alpha +
    2(t-1)/t S / link), S = s b h bytes (the ring model of P.7, the convention of P.8 and 12.2.1).
    """
    positive_number(flops_per_s, "flops_per_s")
    positive_number(link_bytes_per_s, "link_bytes_per_s")
    positive_number(alpha_s, "alpha_s", allow_zero=True)
    compute = per_rank_layer_flops(s, b, h, ffn, t, mlp_matrices) / flops_per_s
    one = 0.0 if t == 1 else costs.alpha_beta_time(t, activation_tensor_bytes(s, b, h, bytes_per_element), alpha_s, link_bytes_per_s)
    return {"t": t, "compute_s": compute, "comm_s": allreduces * one, "comm_fraction": allreduces * one / (compute + allreduces * one)}


def tp_sweep(s, b, h, ffn, degrees, flops_per_s, link_for_degree, alpha_s: float = 0.0, **kw) -> list[dict]:
    """:func:`tp_layer_times` over TP degrees; ``link_for_degree(t)`` gives the link bandwidth."""
    return [tp_layer_times(s, b, h, ffn, t, flops_per_s, link_for_degree(t), alpha_s, **kw) for t in degrees]


def book_link(t: int, node_size: int = 8) -> float:
    """12.2.1's links: NVLink (600 GB/s) within an 8-GPU node, InfiniBand (25 GB/s) across nodes."""
    return NVLINK_ALLREDUCE_BPS if t <= node_size else INFINIBAND_BPS


# ---- the sections' worked examples, recomputed ------------------------------------------------------

def book_p8(tokens: int = 8192, h: int = 4096, t: int = 4, layers: int = 32, link_bps: float = P8_LINK_BPS,
            bytes_per_element: int = 2) -> dict:
    """P.8's illustrative layer: activation MB, ring MB per device, ms per all-reduce, ms per forward."""
    S = activation_tensor_bytes(tokens, 1, h, bytes_per_element)
    sent = allreduce_bytes_per_device(tokens, 1, h, t, bytes_per_element)
    return {"activation MB": S / 1e6, "sent per device MB": sent / 1e6, "ms per all-reduce": sent / link_bps * 1e3,
            "all-reduces per forward": 2 * layers, "ms per forward": 2 * layers * sent / link_bps * 1e3}


def book_12_2_1(s: int = 2048, b: int = 32, h: int = 8192, ffn: int = 28672, t: int = 8, layers: int = 80,
                params: float = 70e9, hbm_gb: float = 80.0) -> dict:
    """12.2.1's 70B example recomputed (decimal GB; BF16; H100 989 TF/s; NVLink 600 GB/s; IB 25 GB/s)."""
    S = activation_tensor_bytes(s, b, h)
    sent = allreduce_bytes_per_device(s, b, h, t)
    gemm = 2 * s * b * h * (ffn / t)  # one MLP GEMM on this rank's 1/t of the FFN width
    mlp = 2 * gemm  # up- and down-projection (a GeLU MLP); SwiGLU has three such GEMMs
    return {
        "all-reduce payload, GB": S / 1e9,
        "sent per device per all-reduce, GB": sent / 1e9,
        "ms per all-reduce on NVLink": sent / NVLINK_ALLREDUCE_BPS * 1e3,
        "TFLOP, one MLP GEMM on 1/t of the FFN": gemm / 1e12,
        "TFLOP, MLP forward (two GEMMs) on 1/t": mlp / 1e12,
        "TFLOP, one GEMM on the full FFN width": gemm * t / 1e12,
        "ms, MLP forward (two GEMMs) at 989 TF/s": mlp / H100_BF16_FLOPS * 1e3,
        "comm / compute, one all-reduce per MLP forward": (sent / NVLINK_ALLREDUCE_BPS) / (mlp / H100_BF16_FLOPS),
        "ms per all-reduce on InfiniBand": sent / INFINIBAND_BPS * 1e3,
        "IB all-reduce / MLP compute": (sent / INFINIBAND_BPS) / (mlp / H100_BF16_FLOPS),
        "parameter GB per device": params * 2 / t / 1e9,
        "GB left of 80": hbm_gb - params * 2 / t / 1e9,
        "heads per GPU, 64 heads": 64 / t,
        "heads per GPU, 40 heads": 40 / t,
        "all-reduce payload per step, GB": layers * 4 * S / 1e9,
        "bytes sent per device per step, GB": layers * 4 * sent / 1e9,
        "s per step at 600 GB/s (sent bytes)": layers * 4 * sent / NVLINK_ALLREDUCE_BPS,
    }
