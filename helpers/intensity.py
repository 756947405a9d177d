"""Three dependency structures counted, arithmetic intensity, and a measured roofline (P.3).

Counting (exact integers, no hardware involved):

* :func:`elementwise` -- n independent tasks, span one element's work, bytes = every element read
  and written once;
* :func:`matmul` -- C = A @ B with A m x k and B k x n: m*n independent dot products of length k,
  2*m*k*n FLOPs, minimum traffic = each matrix moved once;
* :func:`autoregressive` / :func:`prefill` -- a model's forward passes: about 2 FLOPs per
  parameter per token, the weights read once per pass. Decode is a chain of ``tokens`` passes.

``span`` is counted in steps of dependent work: one element's operation (elementwise), one
multiply-add (matmul, or ``ceil(log2 k)`` add levels with a tree reduction), one forward pass
(autoregressive). ``tasks`` is the number of pieces that may run at the same moment.

Measuring this machine: :func:`measure_matmul` (FLOP/s), :func:`measure_bandwidth` (bytes/s), and
:func:`measure_kernels` (a batched matmul, an elementwise op and a token-by-token chain, each with
its achieved FLOP/s and its intensity) for :func:`roofline_plot`.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from .launcher.commlog import span
from .launcher.worker import device
from .validate import equal_parts, integer_at_least, positive_number


@dataclass(frozen=True)
class Cost:
    """What a computation costs: floating-point operations, bytes moved to/from memory,
    independent tasks (how many pieces may run at once) and span (dependent steps)."""

    name: str
    flops: float
    bytes: float
    tasks: int
    span: int

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved."""
        return self.flops / self.bytes


def elementwise(n: int, flops_per_element: int = 1, dtype_bytes: int = 4, inputs: int = 1, outputs: int = 1) -> Cost:
    """y = f(x) on ``n`` elements: n tasks, span = one element's work, each element read and written once."""
    n = integer_at_least(n, "n")
    f = integer_at_least(flops_per_element, "flops_per_element")
    b = integer_at_least(dtype_bytes, "dtype_bytes")
    integer_at_least(inputs, "inputs")
    integer_at_least(outputs, "outputs", 0)
    return Cost("elementwise", n * f, n * b * (inputs + outputs), n, f)


def matmul(m: int, k: int, n: int, dtype_bytes: int = 4, reduction: str = "sequential") -> Cost:
    """C = A @ B, A (m x k), B (k x n): m*n independent dot products of length k.

    FLOPs 2*m*k*n (a multiply and an add per term); bytes (m*k + k*n + m*n) * dtype_bytes (each
    matrix moved once: the least traffic any implementation can have). Span: k multiply-adds one
    after another (``reduction="sequential"``), or 1 multiply + ceil(log2 k) add levels
    (``"tree"``).
    """
    m, k, n = integer_at_least(m, "m"), integer_at_least(k, "k"), integer_at_least(n, "n")
    b = integer_at_least(dtype_bytes, "dtype_bytes")
    if reduction not in ("sequential", "tree"):
        raise ValueError(f"reduction must be 'sequential' or 'tree', got {reduction!r}")
    span = k if reduction == "sequential" else 1 + math.ceil(math.log2(k))
    return Cost("matmul", 2 * m * k * n, (m * k + k * n + m * n) * b, m * n, span)


def forward(params: float, tokens_per_pass: int, passes: int = 1, bytes_per_param: int = 2,
            flops_per_param_token: int = 2, name: str = "forward") -> Cost:
    """``passes`` forward passes of a model with ``params`` parameters over ``tokens_per_pass``
    tokens each: FLOPs = flops_per_param_token * params * tokens, weights read once per pass
    (attention and KV-cache traffic ignored, as in P.3). ``span`` = passes, ``tasks`` = tokens per pass."""
    positive_number(params, "params")
    t = integer_at_least(tokens_per_pass, "tokens_per_pass")
    p = integer_at_least(passes, "passes")
    b = integer_at_least(bytes_per_param, "bytes_per_param")
    f = integer_at_least(flops_per_param_token, "flops_per_param_token")
    return Cost(name, f * params * t * p, params * b * p, t, p)


def prefill(params: float, prompt_tokens: int, bytes_per_param: int = 2) -> Cost:
    """The whole prompt in one pass: every prompt token is known, so all go through together."""
    return forward(params, prompt_tokens, 1, bytes_per_param, name="prefill")


def autoregressive(params: float, tokens: int, batch: int = 1, bytes_per_param: int = 2) -> Cost:
    """Decode: ``tokens`` passes one after another (a chain), each handling one new token for
    each of ``batch`` independent sequences; the weights are read again on every pass."""
    return forward(params, batch, tokens, bytes_per_param, name="decode")


def _check_roofline(**values):
    for name, v in values.items():
        positive_number(v, name)


def attainable(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """Roofline: the FLOP/s a kernel of this intensity can reach, min(peak, intensity * bandwidth)."""
    _check_roofline(intensity=intensity, peak_flops=peak_flops, bandwidth=bandwidth)
    return min(peak_flops, intensity * bandwidth)


def ridge(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) above which a kernel is compute-bound: peak / bandwidth."""
    _check_roofline(peak_flops=peak_flops, bandwidth=bandwidth)
    return peak_flops / bandwidth


def bound_by(intensity: float, peak_flops: float, bandwidth: float) -> str:
    """``"compute"`` or ``"memory"``: which roof limits a kernel of this intensity."""
    _check_roofline(intensity=intensity)
    return "compute" if intensity >= ridge(peak_flops, bandwidth) else "memory"


# ---- measuring this machine --------------------------------------------------------------------

def _median_time(fn, repeats: int, warmup: int = 1) -> tuple[float, float]:
    integer_at_least(repeats, "repeats")
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), max(ts) - min(ts)


def measure_matmul(n: int = 1024, repeats: int = 5, dtype: str = "float32") -> dict:
    """Time an n x n by n x n matmul in torch; return FLOP/s (2 n^3 / median time)."""
    import torch

    n = integer_at_least(n, "n")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    dt = getattr(torch, dtype)
    a, b = torch.rand(n, n, dtype=dt), torch.rand(n, n, dtype=dt)
    c = torch.empty(n, n, dtype=dt)
    t, spread = _median_time(lambda: torch.mm(a, b, out=c), repeats)
    return {"flops_per_s": 2 * n**3 / t, "seconds": t, "spread_s": spread, "n": n, "threads": torch.get_num_threads()}


def measure_bandwidth(mib: int = 256, repeats: int = 5) -> dict:
    """Time copying a ``mib`` MiB float32 array (filled, so pages are real) into another; the
    program moves 2 * mib MiB (read + write). Pick ``mib`` well above the last-level cache."""
    import torch

    mib = integer_at_least(mib, "mib")
    x = torch.rand(mib << 18)
    y = torch.rand(mib << 18)
    t, spread = _median_time(lambda: y.copy_(x), repeats)
    return {"bytes_per_s": 2 * x.numel() * 4 / t, "seconds": t, "spread_s": spread, "mib": mib}


def measure_kernels(d: int = 4096, tokens: int = 256, elements: int = 2**25, chain_steps: int = 16,
                    repeats: int = 3) -> dict:
    """Three kernels with their counted cost and measured time (float32, torch):

    * ``"matmul"``: ``tokens`` token vectors through a d x d weight at once (prefill-like);
    * ``"elementwise"``: ReLU (one max per element) over ``elements`` values;
    * ``"token loop"``: x <- tanh(W x) for ``chain_steps`` steps, each needing the previous one
      (decode-like: one mat-vec per step, W re-read every step).

    Returns ``{name: {"cost": Cost, "seconds": median, "flops_per_s": achieved}}``, and the chain's
    final vector under ``"chain_result"`` (to check it against numpy).
    """
    import torch

    d, tokens = integer_at_least(d, "d"), integer_at_least(tokens, "tokens")
    elements, chain_steps = integer_at_least(elements, "elements"), integer_at_least(chain_steps, "chain_steps")
    g = torch.Generator().manual_seed(0)
    W = torch.randn(d, d, generator=g) / math.sqrt(d)
    X = torch.randn(tokens, d, generator=g)
    Y = torch.empty(tokens, d)
    e_in, e_out = torch.randn(elements, generator=g), torch.empty(elements)
    x0 = torch.randn(d, generator=g)

    def chain():
        v = x0
        for _ in range(chain_steps):
            v = torch.tanh(W @ v)
        return v

    # the chain's tanh adds d FLOPs per step next to 2 d^2 for the mat-vec: counted, and negligible
    chain_cost = Cost("token loop", chain_steps * (2 * d * d + d), chain_steps * (d * d + 2 * d) * 4, 1, chain_steps)
    kernels = {
        "matmul": (matmul(tokens, d, d, 4), lambda: torch.mm(X, W.T, out=Y)),
        "elementwise": (elementwise(elements, 1, 4), lambda: torch.clamp(e_in, min=0.0, out=e_out)),
        "token loop": (chain_cost, chain),
    }
    out = {}
    for name, (cost, fn) in kernels.items():
        t, spread = _median_time(fn, repeats)
        out[name] = {"cost": cost, "seconds": t, "spread_s": spread, "flops_per_s": cost.flops / t}
    out["chain_result"] = chain().numpy()
    out["chain_inputs"] = (W.numpy(), x0.numpy())
    return out


def roofline_plot(peak_flops: float, bandwidth: float, points: dict | None = None, marks: dict | None = None,
                  ax=None, title: str = "roofline of this machine"):
    """Log-log roofline: min(peak, I * bandwidth) over intensity I, with measured ``points``
    ({label: (intensity, FLOP/s)}) and vertical ``marks`` ({label: intensity}); drawn by
    :func:`helpers.plots.roofline`."""
    from .plots import roofline

    _check_roofline(peak_flops=peak_flops, bandwidth=bandwidth)
    return roofline(peak_flops, bandwidth, ridge(peak_flops, bandwidth), points, marks, ax, title=title)


# ---- on ranks: independent outputs spread out, a chain handed along -----------------------------

def matmul_rows_worker(A, B):
    """C = A @ B on the launcher's ranks (P.3): the m*n outputs are independent, so rank r computes
    its block of m/W rows with no communication at all; one ``all_gather_single`` assembles C on
    every rank. ``m`` must be divisible by the world size."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    m = A.shape[0]
    rows = equal_parts(m, world, "the world size {k} must divide the {n} rows of A")[rank]
    a = torch.as_tensor(A[rows.start:rows.stop], device=device())
    b = torch.as_tensor(B, device=device())
    with span("compute"):
        block = (a @ b).contiguous()
    out = torch.empty((m, B.shape[1]), dtype=block.dtype, device=device())
    with span("all_gather"):
        dist.all_gather_single(out, block)
    return out.cpu().numpy()


def chain_worker(W, x0, steps_per_rank: int):
    """The autoregressive chain x <- tanh(W x) spread over ranks (P.3): rank r can start only when
    rank r-1 hands it the state, so the ranks work one after another, never at once. Each rank
    runs ``steps_per_rank`` steps. Returns the final state on the last rank, None elsewhere; spans
    ``wait`` and ``compute`` show the staircase."""
    import torch
    import torch.distributed as dist

    integer_at_least(steps_per_rank, "steps_per_rank")
    rank, world = dist.get_rank(), dist.get_world_size()
    w = torch.as_tensor(W, device=device())
    v = torch.as_tensor(x0, device=device()).to(w.dtype).clone()
    if rank > 0:
        with span("wait"):
            dist.recv(v, src=rank - 1)
    with span("compute"):
        for _ in range(steps_per_rank):
            v = torch.tanh(w @ v)
    if rank < world - 1:
        dist.send(v.contiguous(), dst=rank + 1)
        return None
    return v.cpu().numpy()
