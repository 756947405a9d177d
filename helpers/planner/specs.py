"""What the layout planner plans for: a model's shapes and a cluster (12.4.1; also P.11, P.15, 12.4.2).

:class:`Model` holds a decoder-only transformer's shapes (dense or mixture-of-experts) and counts
its parameters and training FLOPs per token with :mod:`helpers.costs`; :class:`Cluster` holds the
devices, their memory and speed and the links inside and between servers. :func:`h100_cluster`
builds one from ``data/hardware.json`` (each figure with its source); :func:`book_70b`,
:func:`book_100b`, :func:`p11_40b` and :func:`p11_cluster` are the chapters' examples.
The planner itself is :mod:`helpers.planner`.

Units: bytes, seconds, FLOPs.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from .. import costs
from ..validate import integer_at_least, positive_number

DATA = Path(__file__).resolve().parents[2] / "data"


def divisors(n: int) -> list:
    """The divisors of n in increasing order."""
    n = integer_at_least(n, "n")
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
            integer_at_least(getattr(self, f), f)
        for f in ("kv_heads", "head_dim", "vocab", "moe_layers", "experts", "top_k", "expert_ffn", "shared_experts"):
            integer_at_least(getattr(self, f), f, 0)
        if self.mlp_matrices not in (2, 3):
            raise ValueError(f"mlp_matrices must be 2 (plain MLP) or 3 (gated MLP), got {self.mlp_matrices!r}")
        positive_number(self.n_params, "n_params", allow_zero=True)
        positive_number(self.attention_params, "attention_params", allow_zero=True)
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
        attn = self.attention_params or costs.attention_params(h, self.heads, self.kv, d)
        expert = costs.mlp_params(h, self.expert_ffn, self.mlp_matrices) if self.experts else 0
        dense_layers = self.layers - self.moe_layers
        return {
            "attention": self.layers * attn,
            "dense mlp": dense_layers * costs.mlp_params(h, self.ffn, self.mlp_matrices),
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
        return costs.training_flops_per_token(self.active_params, self.layers, self.seq_len, self.heads * self.hd)


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
    hbm_bytes_per_s: float = 0.0  # 0: unknown (the optimizer step's time is then not modelled)

    def __post_init__(self):
        integer_at_least(self.n_devices, "n_devices")
        integer_at_least(self.devices_per_node, "devices_per_node")
        for f in ("memory_bytes", "peak_flops", "intra_bw", "inter_bw"):
            positive_number(getattr(self, f), f)
        for f in ("alpha_intra", "alpha_inter", "reserve_bytes", "hbm_bytes_per_s"):
            positive_number(getattr(self, f), f, allow_zero=True)
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


def _cluster(device: str, link: str, n_devices: int, name: str, overrides: dict) -> Cluster:
    """A cluster of ``data/hardware.json``'s ``device`` servers joined by its ``link``, with the
    file's modelling assumptions (latencies, efficiency, reserve); ``overrides`` replace any field."""
    hw = hardware()
    d, net, mod = hw[device], hw[link], hw["modelling"]
    kw = dict(name=name, n_devices=n_devices, devices_per_node=d["devices_per_node"],
              memory_bytes=d["memory_bytes"], peak_flops=d["bf16_dense_flops"], intra_bw=d["nvlink_bytes_per_s"],
              inter_bw=net["bytes_per_s"], alpha_intra=mod["alpha_intra_s"], alpha_inter=mod["alpha_inter_s"],
              efficiency=mod["efficiency"], reserve_bytes=mod["reserve_bytes"], hbm_bytes_per_s=d["hbm_bytes_per_s"])
    kw.update(overrides)
    return Cluster(**kw)


def h100_cluster(n_devices: int, name: str | None = None, **overrides) -> Cluster:
    """H100 SXM 80 GB servers of 8, NVLink inside (450 GB/s each way), 400 Gb/s per GPU between."""
    return _cluster("h100_sxm", "infiniband_ndr_400", n_devices, name or f"{n_devices} x H100 80GB", overrides)


def a100_cluster(n_devices: int, name: str | None = None, **overrides) -> Cluster:
    """12.2.2's cluster: A100 SXM 80 GB servers of 8 (312 TF/s BF16, NVLink 300 GB/s each way),
    HDR InfiniBand 25 GB/s per GPU between servers; latencies, efficiency, reserve as for H100."""
    return _cluster("a100_sxm", "infiniband_hdr_200", n_devices, name or f"{n_devices} x A100 80GB", overrides)


# ---- models used by the notebooks ------------------------------------------------------------------------

def book_70b(seq_len: int = 4096) -> Model:
    """12.4.1's 70B dense model: h 8192, 80 layers, 64 heads, 70e9 parameters (Llama-3-70B-like FFN)."""
    return Model("70B (12.4.1)", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, mlp_matrices=3,
                 seq_len=seq_len, vocab=128256, n_params=70e9)


def book_175b(seq_len: int = 2048) -> Model:
    """12.2.2's worked example: h 12288, 96 layers, FFN 49152 (a GPT-3-175B shape: 96 heads of 128),
    175e9 parameters; s = 2048 is what its 201 MB hand-off implies."""
    return Model("175B (12.2.2)", layers=96, hidden=12288, heads=96, ffn=49152, seq_len=seq_len, n_params=175e9)


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
