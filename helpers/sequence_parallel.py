"""Sequence parallelism with tensor parallelism (12.3.1; Korthikanti et al. 2022).

The mechanism lives in :mod:`helpers.tensor_parallel` (``sequence_parallel=True`` on the layers
and on :class:`~helpers.tensor_parallel.ParallelBlock`: reduce-scatter + all-gather along the
sequence in place of each all-reduce, LayerNorm and dropout on s/t positions). This module adds:

* :class:`SavedActivations`: the bytes autograd actually keeps for backward, measured with
  ``torch.autograd.graph.saved_tensors_hooks`` (each storage counted once, parameters excluded);
* :func:`activation_memory_worker`: that measurement on the ranks for plain TP and TP+SP;
* the activation-memory formulas of Korthikanti et al. 2022 (per layer, 16-bit activations,
  1-byte dropout masks; :func:`helpers.costs.activation_bytes_per_layer`): ``sbh(34 + 5as/h)``
  on one device, ``sbh(10 + 24/t + 5as/(ht))`` with TP, ``sbh/t (34 + 5as/h)`` with TP+SP; their
  inventory, and the section's own printed version, for comparison;
* the communication of a step, summed from the collectives the ranks recorded.
"""
from __future__ import annotations

import torch

from . import costs
from .costs import activation_bytes_per_layer  # noqa: F401 (12.3.1's formula, used by the notebook)
from .launcher.worker import device
from .tensor_parallel import block_inputs
from .tensor_parallel.block import BlockConfig, ParallelBlock, as_config, check_tp_shapes, make_block_params
from .tensor_parallel.layers import split_seq, tp_rank_size
from .tp_numpy import check_degree

# ---- formulas -------------------------------------------------------------------------------------
# activation_bytes_per_layer (Korthikanti et al.'s formula, every variant) is helpers.costs' (imported above).

def book_tp_formula(s: int, b: int, h: int, t: int) -> float:
    """12.3.1's printed "without sequence parallelism" formula: s b h x 34/t + s b h x 10."""
    t = check_degree(t)
    return s * b * h * 34 / t + s * b * h * 10


def korthikanti_inventory(s: int, b: int, h: int, a: int) -> list[tuple[str, float]]:
    """Where the 34 s b h + 5 a s^2 b bytes of one layer come from (Korthikanti et al. 2022, 4.1)."""
    sbh, as2b = s * b * h, a * s * s * b
    return [
        ("LayerNorm 1 input", 2 * sbh), ("QKV input (LayerNorm 1 output)", 2 * sbh),
        ("Q and K (for Q K^T)", 4 * sbh), ("softmax output", 2 * as2b), ("attention dropout mask", as2b),
        ("dropped probabilities (for x V)", 2 * as2b), ("V", 2 * sbh),
        ("output projection input", 2 * sbh), ("dropout mask after attention", sbh),
        ("LayerNorm 2 input", 2 * sbh), ("fc1 input (LayerNorm 2 output)", 2 * sbh),
        ("GeLU input", 8 * sbh), ("fc2 input (GeLU output)", 8 * sbh), ("dropout mask after MLP", sbh),
    ]


# ---- measuring what autograd keeps ----------------------------------------------------------------

class SavedActivations:
    """Context manager: record every tensor autograd saves for backward, once per storage.

    ``exclude`` are tensors (the parameters) whose storages are not activations. After the block,
    ``entries`` lists (shape, dtype, storage bytes) and ``total_bytes`` sums them.
    """

    def __init__(self, exclude=()):
        self._exclude = {p.untyped_storage().data_ptr() for p in exclude}
        self._seen: dict[int, tuple[tuple[int, ...], str, int]] = {}
        self._ctx = None

    def _pack(self, x):
        st = x.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self._exclude and ptr not in self._seen:
            self._seen[ptr] = (tuple(x.shape), str(x.dtype).replace("torch.", ""), st.nbytes())
        return x

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda x: x)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        return False

    @property
    def entries(self) -> list[tuple[tuple[int, ...], str, int]]:
        return list(self._seen.values())

    @property
    def total_bytes(self) -> int:
        return sum(e[2] for e in self._seen.values())


def is_layernorm_stat(entry, s_local: int, b: int) -> bool:
    """LayerNorm's saved mean / rstd: one number per token (shape (s_local, b, 1))."""
    shape, _, _ = entry
    return shape == (s_local, b, 1)


def measure_block_activations(cfg: BlockConfig, s: int, b: int, group=None, sequence_parallel: bool = False,
                              regather_input: bool = True, dtype=torch.bfloat16, device=None) -> dict:
    """Run one forward of :class:`ParallelBlock` under :class:`SavedActivations`; on this rank.

    Works on one process (t = 1) and inside a launched job. Returns the total saved bytes, the
    part that is LayerNorm statistics (mean and rstd per token, which the formula leaves out),
    the rest ("activations") and the entries.
    """
    rank, t = tp_rank_size(group)
    check_tp_shapes(cfg, t, s if sequence_parallel else None)
    P = {k: v.to(device) for k, v in make_block_params(cfg, 0, dtype).items()}
    block = ParallelBlock(P, cfg, group, sequence_parallel=sequence_parallel, regather_input=regather_input)
    x = block_inputs(cfg, s, b, 1, dtype)[0].to(device)
    if sequence_parallel:
        x = split_seq(x, group)
    x = x.clone().requires_grad_()
    with SavedActivations(exclude=list(block.parameters())) as log:
        out = block(x)
    s_local = x.shape[0]
    stats = sum(e[2] for e in log.entries if is_layernorm_stat(e, s_local, b))
    out.sum().backward()  # the saved tensors are usable: backward runs
    return {"total": log.total_bytes, "layernorm_stats": stats, "activations": log.total_bytes - stats,
            "entries": log.entries, "t": t, "s_local": s_local}


def activation_memory_worker(cfg: BlockConfig | dict | None = None, s: int = 16, b: int = 2,
                             sequence_parallel: bool = False, regather_input: bool = True):
    """:func:`measure_block_activations` on this rank of the launcher's (or torchrun's) world, bf16,
    on this rank's device."""

    return measure_block_activations(as_config(cfg), s, b, None, sequence_parallel, regather_input, device=device())


# ---- communication of a step ------------------------------------------------------------------------

def ring_bytes(ops) -> float:
    """Ring-model bytes sent per rank for a list of (op, payload bytes, group size) (P.7's model)."""
    return sum(costs.ring_bytes_sent(op, nbytes, n) for op, nbytes, n in ops)


def payload_bytes(ops) -> int:
    """Sum of the payloads (bytes of the whole buffer each op concerns)."""
    return sum(nbytes for _, nbytes, _ in ops)


# ---- the section's worked example --------------------------------------------------------------------

def book_12_3_1(s: int = 4096, b: int = 4, h: int = 5120, layers: int = 40, t: int = 8, a: int = 80) -> dict:
    """Recompute 12.3.1's 13B example with Korthikanti et al.'s formulas (decimal GB)."""
    check_degree(t)
    sbh = s * b * h
    GB = 1e9
    stranded = 10 * sbh  # replicated per layer under TP alone (bytes; the 10 already counts 2-byte values)
    return {
        "sbh": sbh,
        "stranded per layer, GB": stranded / GB,
        "stranded over layers, GB": layers * stranded / GB,
        "share of 80 GB": layers * stranded / 80e9,
        "with SP over layers, GB": layers * stranded / t / GB,
        "saved by SP, GB": layers * stranded * (1 - 1 / t) / GB,
        "book's per-layer figure (sbh x 10 x 2 bytes), GiB": 2 * stranded / 2**30,
        "TP+SP+flash per layer (34 sbh / t), GB": 34 * sbh / t / GB,
        "TP+SP+flash over layers, GB": layers * 34 * sbh / t / GB,
        "all-reduce sent per device, GB": costs.allreduce_bytes(t, sbh * 2) / GB,
        "reduce-scatter + all-gather sent per device, GB": (costs.ring_bytes_sent("reduce_scatter", sbh * 2, t)
                                                            + costs.ring_bytes_sent("all_gather", sbh * 2, t)) / GB,
        "5as/h (attention-scores term without flash)": 5 * a * s / h,
    }
