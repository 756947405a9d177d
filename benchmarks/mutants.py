"""The mutation suite (issue 15, point 4): planted bugs that the fast tests must catch.

Each :class:`Mutation` below is one deliberate bug in a closed form or a distributed mechanism of
``helpers/``: an exact snippet of the current source, what replaces it, and the fast tests that
should fail because of it. ``./workbook mutants`` (this script) copies the tree into a temporary
folder (never touching the working tree, where tests may be running), applies each mutation in
turn to the copy, runs its tests there with ``pytest -x -q``, and prints ``mutations caught: k/n``
and every survivor. Check strength is measured, not hoped for: a survivor is either a test to
strengthen or, if the mutant is equivalent, a line in ``docs/teaching.md``.

    ./workbook mutants               # every mutation, 2 at a time
    ./workbook mutants -k zero_hand  # the mutations whose name, file or tests contain "zero_hand"
                                     # (-k may be repeated)
    ./workbook mutants --list        # what would run

Why a curated list rather than mutmut or cosmic-ray: both run (mutmut 3.8.1 mutated
``helpers/amdahl.py`` into 406 mutants in 4.3 minutes here, 63 of them surviving, nearly all in
error-message strings), but (1) mutmut decides which tests cover a mutant by tracing calls in the
test process, so code that runs only inside the launcher's rank processes counts as untested
and its mutants are never run (on ``helpers/collectives.py``: 133 of 338 mutants "not covered",
every one in the hand ring and its workers); (2) the whole of ``helpers/`` would be some 20,000 mutants, hours
of rank tests, with hundreds of equivalent survivors to triage; cosmic-ray mutates the files in
place, which this workspace forbids. A list of meaningful bugs, each tied to the tests that own
it, runs in minutes and says what it checks.

The test ``tests/test_mutants_list.py`` keeps this list honest as the code changes: every snippet
must occur exactly once in its file, and every test file must exist.

Equivalent mutants are left out, not listed: rounding ``min_world_size_to_fit``'s first guess
down instead of up changes nothing, because the loop after it raises the world size until the
model fits.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300


@dataclass(frozen=True)
class Mutation:
    """One planted bug: in ``file``, ``original`` (occurring exactly once) becomes ``replacement``;
    ``tests`` (pytest arguments) must then fail."""

    name: str
    file: str
    original: str
    replacement: str
    tests: str
    why: str


M = Mutation
MUTATIONS = [
    # ---- costs: the closed forms every section shares ------------------------------------------
    M("costs-allreduce-factor", "helpers/costs.py", "return 2 * (n - 1) / n * payload_bytes",
      "return (n - 1) / n * payload_bytes", "tests/test_costs.py", "ring all-reduce sends (N-1)/N S, not 2(N-1)/N S"),
    M("costs-allreduce-steps", "helpers/costs.py", "        return 2 * (n - 1)\n", "        return 2 * n\n",
      "tests/test_costs.py", "alpha paid 2N times instead of 2(N-1)"),
    M("costs-korthikanti-tp", "helpers/costs.py", "total = s * b * h * (10 + 24 / t + scores / t)",
      "total = s * b * h * (10 + 24 / t + scores)", "tests/test_costs.py tests/test_sequence_parallel.py -k 'activation or formulas'",
      "attention scores not divided by t under TP"),
    M("costs-gqa-kv-heads", "helpers/costs.py", "return h * heads * d * 2 + 2 * h * kv * d",
      "return h * heads * d * 2 + 2 * h * heads * d", "tests/test_costs.py tests/test_planner.py -k 'params or counts'",
      "K and V sized by the query heads (GQA ignored)"),
    M("costs-fp32-master", "helpers/costs.py", '"fp32": (4, 4, 0, 4),', '"fp32": (4, 4, 4, 4),',
      "tests/test_costs.py tests/test_memory.py", "an fp32 recipe charged a master copy"),
    M("costs-attention-training-flops", "helpers/costs.py", "return 6 * params + 3 * integer_at_least",
      "return 6 * params + 2 * integer_at_least", "tests/test_costs.py", "attention's backward left out of 12 L s w"),
    # ---- amdahl, efficiency, scaling, dag ------------------------------------------------------
    M("amdahl-speedup", "helpers/amdahl.py", "return _out(1.0 / ((1 - p) + p / n))",
      "return _out(1.0 / ((1 - p) + p / (n + 1)))", "tests/test_amdahl.py -k 'not on_ranks'", "Amdahl's N off by one"),
    M("amdahl-karp-flatt", "helpers/amdahl.py", "return _out((1 / s - 1 / n) / (1 - 1 / n))",
      "return _out((1 / s - 1 / n) / (1 - 1 / s))", "tests/test_amdahl.py -k 'not on_ranks'", "Karp-Flatt's denominator"),
    M("amdahl-gustafson", "helpers/amdahl.py", "return _out(n - (1 - p) * (n - 1))", "return _out(n - (1 - p) * n)",
      "tests/test_amdahl.py -k 'not on_ranks'", "Gustafson's (N-1)"),
    M("efficiency-idle-fraction", "helpers/efficiency.py", "return sum(barrier_waits(d)) / (len(d) * max(d))",
      "return sum(barrier_waits(d)) / sum(d)", "tests/test_efficiency.py -k 'model or split'",
      "idle share over busy time instead of N x step"),
    M("efficiency-task-counts", "helpers/efficiency.py", "return [q + 1 if w < r else q for w in range(workers)]",
      "return [q + 1 if w <= r else q for w in range(workers)]", "tests/test_efficiency.py -k 'model or split'",
      "one task too many dealt out"),
    M("scaling-weak-speedup", "helpers/scaling.py", "s = n * baseline / t", "s = baseline / t",
      "tests/test_scaling.py -k 'analysis or weak or baseline'", "weak scaling read as strong scaling"),
    M("dag-greedy-bound", "helpers/dag.py", '"greedy_upper": (t1 - tinf) / n + tinf,', '"greedy_upper": t1 / n + tinf,',
      "tests/test_dag.py -k 'bounds or figure'", "Graham's bound without the span term removed"),
    M("dag-simultaneous-finishes", "helpers/dag.py", "while running and running[0][0] == now:",
      "if running and running[0][0] == now:", "tests/test_dag.py -k 'not pool and not gloo'",
      "tasks that end together released one per event"),
    M("dag-critical-priority", "helpers/dag.py", "return lambda n: (-lvl[n], rank[n])", "return lambda n: (lvl[n], rank[n])",
      "tests/test_dag.py -k critical", "critical-path priority inverted"),
    # ---- pipelines: the simulator and the ranks ------------------------------------------------
    M("schedule-1f1b-warmup", "helpers/pipeline_schedule.py", "warm = min(p - d - 1, m)", "warm = min(p - d, m)",
      "tests/test_pipeline_parallel.py -k on_ranks", "1F1B warm-up one forward too long (the ranks run the same order)"),
    M("schedule-interleaved-warmup", "helpers/pipeline_schedule.py", "warm = min((p - d - 1) * 2 + (v - 1) * p, total)",
      "warm = min((p - d - 1) * 2 + (v - 1) * p + 1, total)", "tests/test_pipeline_parallel.py -k 'on_ranks and interleaved'",
      "interleaved warm-up one chunk too long"),
    M("schedule-zb-defer", "helpers/pipeline_schedule.py", "o = _one_f_one_b(p, m, d, defer_w=d)",
      "o = _one_f_one_b(p, m, d, defer_w=max(d - 1, 0))", "tests/test_pipeline_schedule.py", "ZB-H1 holds back one W too few"),
    M("schedule-useful-bubble", "helpers/pipeline_schedule.py", "return Fraction(p - 1, v * m)\n",
      "return Fraction(p - 1, v * m + p - 1)\n", "tests/test_pipeline_schedule.py", "12.2.2's bubble definition confused with P.9's"),
    M("pipeline-w-bias-grad", "helpers/pipeline_parallel.py", "self.layers[i].bias.grad += dz.sum(0)",
      "self.layers[i].bias.grad += dz.mean(0)", "tests/test_pipeline_parallel.py -k 'on_ranks and zb'",
      "ZB-H1's W pass: bias gradient averaged over the micro-batch"),
    M("pipeline-split-backward", "helpers/pipeline_parallel.py", "dW = grad_out.T @ x  # W: may wait",
      "dW = x.T @ grad_out  # W: may wait", "tests/test_pipeline_parallel.py -k split_backward", "dW transposed"),
    # ---- memory, ZeRO --------------------------------------------------------------------------
    M("memory-stage-1-shards-grads", "helpers/memory.py", '"gradients": n_params * b.gradients / shard(2),',
      '"gradients": n_params * b.gradients / shard(1),', "tests/test_memory.py tests/test_memory_zero.py",
      "stage 1 credited with sharded gradients"),
    M("memory-reserve-ignored", "helpers/memory.py", "return (device_bytes - reserve_bytes) / per_device_total(1.0,",
      "return device_bytes / per_device_total(1.0,", "tests/test_memory_zero.py", "the largest model that fits ignores the activation reserve"),
    M("zero-numpy-stage3-gathers", "helpers/zero_numpy.py", 'parts["all_gather"] = (2 if zero_stage == 3 else 1) * unit',
      'parts["all_gather"] = unit', "tests/test_zero.py -k comm_model", "stage 3's backward all-gather forgotten"),
    M("zero-numpy-adam-bias-correction", "helpers/zero_numpy.py", "denom = np.sqrt(v) / math.sqrt(1 - b2**t) + eps",
      "denom = np.sqrt(v) + eps", "tests/test_zero.py -k adamw_numpy", "AdamW without the second moment's bias correction"),
    M("zero-numpy-zero1-average", "helpers/zero_numpy.py", "owned = reduce_scatter(grads) / n_dev",
      "owned = reduce_scatter(grads)", "tests/test_zero.py -k identity_in_numpy",
      "ZeRO-1 sums instead of averaging (AdamW nearly cancels it)"),
    M("zero-hand-stage0-average", "helpers/zero_hand.py", "zip(flat.div_(self.world).split(", "zip(flat.split(",
      "tests/test_zero.py -k 'each_stage and 0'", "hand DDP sums gradients instead of averaging"),
    M("zero-hand-stage1-average", "helpers/zero_hand.py", "return self.shard_grads.div_(self.world).split(chunks)",
      "return self.shard_grads.split(chunks)", "tests/test_zero.py -k 'each_stage and 1'", "stage 1 sums instead of averaging"),
    M("zero-hand-stage2-average", "helpers/zero_hand.py", ".add_(out.div_(self.world))", ".add_(out)",
      "tests/test_zero.py -k 'each_stage and 2'", "stage 2's hook sums instead of averaging"),
    M("zero-hand-stage3-average", "helpers/zero_hand.py", "return gx, g_shard.div_(unit.world), None, None",
      "return gx, g_shard, None, None", "tests/test_zero.py -k 'each_stage and 3'", "stage 3's reduce-scatter not averaged"),
    M("zero-hand-all-gather", "helpers/zero_hand.py", "dist.all_gather_single(gathered, mine)",
      "gathered.copy_(mine.repeat(self.world))", "tests/test_zero.py -k 'each_stage and 1'",
      "stages 1-2 never share the updated chunks (each rank repeats its own)"),
    # ---- planner -------------------------------------------------------------------------------
    M("planner-1f1b-in-flight", "helpers/planner_assess.py", "layer_units = min(m, p) * lps",
      "layer_units = min(m, p - 1) * lps", "tests/test_planner.py", "1F1B's stage 0 holds p - 1 micro-batches"),
    M("planner-bubble-definition", "helpers/planner_assess.py", 'bubble_formula(L.pp, m, L.v, definition="useful")',
      'bubble_formula(L.pp, m, L.v, definition="total")', "tests/test_planner.py", "bubble time from the wrong definition"),
    M("planner-tied-embeddings", "helpers/planner_specs.py", '"embeddings": self.vocab * h * (1 if self.tied_embeddings else 2),',
      '"embeddings": self.vocab * h * 2,', "tests/test_planner.py -k 'counts or case_studies'", "tied embeddings counted twice"),
    M("planner-rule-of-thumb-m", "helpers/planner_recipes.py", "if a.m >= 4 * p:", "if a.m >= p:",
      "tests/test_planner.py", "12.4.1's m >= 4p rule relaxed to m >= p"),
    # ---- intensity, failures, inference ---------------------------------------------------------
    M("intensity-matmul-bytes", "helpers/intensity.py", "(m * k + k * n + m * n) * b", "(m * k + k * n) * b",
      "tests/test_intensity.py -k 'example or elementwise or prefill or roofline'", "the output matrix never written"),
    M("intensity-roofline", "helpers/intensity.py", "return min(peak_flops, intensity * bandwidth)",
      "return max(peak_flops, intensity * bandwidth)", "tests/test_intensity.py -k roofline", "roofline upside down"),
    M("failures-young", "helpers/failures_numpy.py", 'return math.sqrt(2 * _pos_real(ckpt_cost, "ckpt_cost")',
      'return math.sqrt(_pos_real(ckpt_cost, "ckpt_cost")', "tests/test_failures.py -k 'young or mtbf'",
      "Young's interval without the 2"),
    M("failures-token-weighting", "helpers/failures_numpy.py",
      "weighted = (np.array(grads) * counts[:, None]).sum(axis=0) / counts.sum()",
      "weighted = np.array(grads).sum(axis=0) / len(counts)", "tests/test_failures.py -k numpy",
      "token-weighted mean computed as the plain mean"),
    M("failures-restart-cost", "helpers/failures_numpy.py", "return float(((M + R) * np.expm1(s / M)).sum())",
      "return float((M * np.expm1(s / M) + R).sum())", "tests/test_failures.py -k 'simulation or young'",
      "restart paid once per segment instead of once per failure"),
    M("inference-tp-weight-read", "helpers/inference.py", "memory, comm = W / t / B, n_ar * per_ar",
      "memory, comm = W / B, n_ar * per_ar", "tests/test_inference.py -k 'example or latency'",
      "tensor parallelism does not split the weight read"),
    M("inference-allreduces-at-tp1", "helpers/inference.py", "n_ar = L * k if t > 1 else 0", "n_ar = L * k",
      "tests/test_inference.py -k 'example or latency'", "one device charged all-reduces"),
    M("inference-continuous-admission", "helpers/inference.py", "while queue and len(active[s]) < B:",
      "while queue and len(active[s]) < B - 1:", "tests/test_inference.py -k 'continuous'", "continuous batching leaves a slot empty"),
    # ---- attention: partitions, the online softmax, the ring -----------------------------------
    M("ring-partition-zigzag", "helpers/ring_partition.py", "chunks[2 * p - 1 - k]", "chunks[p + k]",
      "tests/test_ring_attention.py -k 'partitions or causal_work'", "zig-zag pairs chunk k with p + k"),
    M("ring-partition-causal", "helpers/ring_partition.py", "ok &= q_pos[:, None] >= k_pos[None, :]",
      "ok &= q_pos[:, None] > k_pos[None, :]", "tests/test_ring_attention.py -k 'block_kernel'", "a query cannot see itself"),
    M("ring-partition-bytes", "helpers/ring_partition.py", 'return costs.ring_steps("all_gather", p) * (2 * (s / p)',
      'return costs.ring_steps("all_reduce", p) * (2 * (s / p)', "tests/test_ring_attention.py -k 'cost_models or bytes_sent'",
      "ring attention's bytes with 2(p-1) steps"),
    M("attention-numpy-merge", "helpers/attention_numpy.py", "np.exp(b.m - m_safe), 0)", "np.exp(m_safe - b.m), 0)",
      "tests/test_attention_numpy.py", "online-softmax merge rescales by the wrong sign"),
    M("attention-numpy-scale", "helpers/attention_numpy.py", "scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale",
      "scale = 1.0 / q.shape[-1] if scale is None else scale", "tests/test_attention_numpy.py", "scores scaled by 1/d"),
    M("ring-kernel-merge", "helpers/ring_kernel.py", "torch.exp(blk_lse - safe)", "torch.exp(safe - blk_lse)",
      "tests/test_ring_attention.py -k 'block_kernel or ring_forward'", "the ring's merge rescales by the wrong sign"),
    M("ring-core-source", "helpers/ring_core.py",
      '        src = (rank - j) % p\n        reqs, nxt = None, None\n        if j < p - 1:\n            nxt = track(cfg.meter, torch.empty_like(cur), "kv")\n            if cfg.overlap:',
      '        src = (rank + j) % p\n        reqs, nxt = None, None\n        if j < p - 1:\n            nxt = track(cfg.meter, torch.empty_like(cur), "kv")\n            if cfg.overlap:',
      "tests/test_ring_attention.py -k 'ring_forward_and_backward'", "the forward ring masks K/V as if they came the other way"),
    M("ring-core-dv", "helpers/ring_core.py", "dcur[1] += bv", "dcur[1] += bk",
      "tests/test_ring_attention.py -k 'ring_forward_and_backward'", "dV accumulates dK"),
    # ---- tensor and sequence parallelism --------------------------------------------------------
    M("tp-numpy-gelu-grad", "helpers/tp_numpy.py", "dU = dY * gelu_grad(U)", "dU = dY", "tests/test_tp_numpy.py",
      "the MLP backward skips GeLU's derivative"),
    M("tp-numpy-row-split", "helpers/tp_numpy.py", "zip(np.split(X, t, axis=-1), row_split(W, t))",
      "zip(np.split(X, t, axis=-1), row_split(W, t)[::-1])", "tests/test_tp_numpy.py", "row shards paired with the wrong inputs"),
    M("tp-f-backward", "helpers/tp_layers.py", "return all_reduce_sum(grad, ctx.group), None", "return grad, None",
      "tests/test_tensor_parallel.py -k '4_ranks'", "f's backward does not all-reduce"),
    M("tp-column-shard", "helpers/tp_layers.py", "blk[..., rank * n:(rank + 1) * n]",
      "blk[..., (t - 1 - rank) * n:(t - rank) * n]", "tests/test_tensor_parallel.py -k '4_ranks'",
      "column shards dealt in reverse while row shards are not"),
    M("tp-head-offset-t8", "helpers/tp_block.py", "self.head_offset = self.rank * (cfg.heads // self.t)",
      "self.head_offset = (self.rank % 4) * (cfg.heads // self.t)", "tests/test_tensor_parallel.py -k '8_ranks'",
      "a bug that bites only at t = 8: ranks 4-7 take ranks 0-3's dropout masks"),
    M("tp-attention-scale", "helpers/tp_block.py", "* (1.0 / math.sqrt(d))", "* (1.0 / d)",
      "tests/test_tensor_parallel.py -k numpy_block", "every torch block scales scores by 1/d"),
    M("sp-gather-linear-backward", "helpers/tp_layers.py", "gx = reduce_scatter_seq(gy @ weight.t(), ctx.group)",
      "gx = split_seq(gy @ weight.t(), ctx.group)", "tests/test_sequence_parallel.py -k sp_block",
      "SP's all-gather-then-matmul: backward takes its rows of dX without summing them"),
    M("sp-gather-operator-backward", "helpers/tp_layers.py", "return reduce_scatter_seq(grad, ctx.group), None",
      "return split_seq(grad, ctx.group), None", "tests/test_tensor_parallel.py -k operators",
      "the all-gather operator's backward takes its rows without summing"),
    M("sp-replicated-grads", "helpers/tp_block.py", "    for name in REPLICATED:\n        g = params[name].grad",
      "    for name in REPLICATED[:-1]:\n        g = params[name].grad", "tests/test_sequence_parallel.py -k 'sp_block or replicated'",
      "under SP the last replicated gradient (b_fc2) is left a partial sum"),
    # ---- collectives and data parallelism -------------------------------------------------------
    M("collectives-numpy-all-gather", "helpers/collectives.py", 'offset = -s if phase == "reduce-scatter" else 1 - s',
      'offset = -s', "tests/test_collectives.py -k 'not hand'", "all-gather forwards the wrong chunk"),
    M("collectives-hand-recv-chunk", "helpers/collectives.py", "recv_idx = (send_idx - 1) % n", "recv_idx = send_idx",
      "tests/test_collectives.py -k hand", "the hand ring adds into the chunk it just sent"),
    M("collectives-hand-all-gather", "helpers/collectives.py", "chunks[recv_idx].copy_(incoming)", "chunks[recv_idx].add_(incoming)",
      "tests/test_collectives.py -k hand", "the hand ring's all-gather adds instead of copying"),
    M("data-parallel-mse-sign", "helpers/data_parallel.py", "return X.T @ (X @ w - y) / len(y)",
      "return X.T @ (y - X @ w) / len(y)", "tests/test_data_parallel.py -k 'mse_grad or shards'", "P.6's gradient with its sign flipped"),
    M("data-parallel-weighted", "helpers/data_parallel.py", "return sum(len(i) * mse_grad(X[i], y[i], w) for i in shards) / n",
      "return sum(len(i) * mse_grad(X[i], y[i], w) for i in shards) / len(shards)", "tests/test_data_parallel.py -k shards",
      "weighted shard mean divided by the shard count"),
    M("data-parallel-ddp-scale", "helpers/data_parallel.py", "scale = world * sizes[rank] / batch if weighted else 1.0",
      "scale = sizes[rank] / batch if weighted else 1.0", "tests/test_data_parallel.py -k ddp_equals",
      "DDP's loss scale for unequal shards without the world size"),
]


# ---- the runner -------------------------------------------------------------------------------------

def tree_files() -> list[str]:
    """The files of the working tree (tracked, and untracked but not ignored)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return [f for f in out if f and (ROOT / f).is_file()]


def make_copy(dest: Path, files: list[str]) -> Path:
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest / f)
    return dest


def env_for(tree: Path) -> dict:
    """The copy's helpers first on the path, in the test process and in every rank it starts."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


CHECK_COPY = """
import helpers, sys
from helpers.launcher import launch
def where():
    import helpers
    return helpers.__file__
files = [helpers.__file__] + launch(where, world_size=2, quiet=True).results
bad = [f for f in files if not f.startswith(sys.argv[1])]
assert not bad, f"imported from outside the copy: {bad}"
"""


def check_copy(tree: Path) -> None:
    """The tests and their ranks must import the copy's helpers, not the working tree's."""
    r = subprocess.run([sys.executable, "-c", CHECK_COPY, str(tree)], cwd=tree, env=env_for(tree),
                       capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise SystemExit(f"the copy of the tree is not what gets imported:\n{r.stdout}{r.stderr}")


def run_tests(tree: Path, tests: str) -> tuple[str, float, str]:
    """('passed' | 'failed' | 'error' | 'timeout', seconds, tail of the output)."""
    import shlex

    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *shlex.split(tests)]
    try:
        r = subprocess.run(cmd, cwd=tree, env=env_for(tree), capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0, ""
    status = {0: "passed", 1: "failed"}.get(r.returncode, "error")
    return status, time.perf_counter() - t0, (r.stdout + r.stderr)[-1500:]


def baseline_selections(selections: list[str]) -> list[str]:
    """The same tests in fewer pytest runs: selections over the same files merged, their ``-k``
    expressions joined with ``or`` (a selection without ``-k`` takes the whole files)."""
    import shlex

    by_files: dict = {}
    for sel in selections:
        words = shlex.split(sel)
        k = words[words.index("-k") + 1] if "-k" in words else None
        files = tuple(w for i, w in enumerate(words) if not w.startswith("-") and (i == 0 or words[i - 1] != "-k"))
        by_files.setdefault(files, set()).add(k)
    out = []
    for files, ks in sorted(by_files.items()):
        k = "" if None in ks else " -k " + shlex.quote(" or ".join(f"({e})" for e in sorted(ks)))
        out.append(" ".join(files) + k)
    return out


def apply(tree: Path, mut: Mutation) -> str:
    path = tree / mut.file
    text = path.read_text()
    if text.count(mut.original) != 1:
        raise ValueError(f"{mut.name}: the snippet occurs {text.count(mut.original)} times in {mut.file}, not once")
    path.write_text(text.replace(mut.original, mut.replacement))
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", dest="only", action="append", default=[],
                    help="only mutations whose name, file or tests contain this (repeatable)")
    ap.add_argument("--jobs", type=int, default=2, help="mutations tested at once (default 2)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--no-baseline", action="store_true", help="skip running each test selection unmutated first")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or any(k in m.name or k in m.file or k in m.tests for k in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.name:34s} {m.file:30s} {m.tests}\n{'':34s} {m.why}")
        return 0
    if not chosen:
        print(f"no mutation matches {args.only!r}")
        return 2
    files = tree_files()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        trees: Queue = Queue()
        for i in range(max(1, args.jobs)):
            trees.put(make_copy(Path(tmp) / f"tree{i}", files))
        first = trees.get()
        check_copy(first)
        trees.put(first)

        def on_a_tree(fn, *a):
            tree = trees.get()
            try:
                return fn(tree, *a)
            finally:
                trees.put(tree)

        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            if not args.no_baseline:
                selections = baseline_selections([m.tests for m in chosen])
                broken = [(s, r) for s, r in zip(selections, pool.map(lambda s: on_a_tree(run_tests, s), selections))
                          if r[0] != "passed"]
                if broken:
                    for s, (status, _, tail) in broken:
                        print(f"baseline {status}: {s}\n{tail}")
                    print("the tests must pass unmutated before mutants mean anything")
                    return 2
                print(f"baseline: {len(selections)} test selections pass unmutated "
                      f"({time.perf_counter() - t_start:.0f} s)", flush=True)

            def one(tree, mut):
                try:
                    original = apply(tree, mut)
                except ValueError as e:
                    print(f"ERROR    {mut.name}: {e}", flush=True)
                    return mut, False, "error", str(e)
                try:
                    status, secs, tail = run_tests(tree, mut.tests)
                finally:
                    (tree / mut.file).write_text(original)
                caught = status in ("failed", "timeout")
                print(f"{'caught  ' if caught else status.upper():8s} {mut.name:34s} {secs:5.1f} s   {mut.tests}", flush=True)
                return mut, caught, status, tail

            outcomes = list(pool.map(lambda m: on_a_tree(one, m), chosen))
    survivors = [(m, status, tail) for m, caught, status, tail in outcomes if not caught]
    print(f"\nmutations caught: {len(chosen) - len(survivors)}/{len(chosen)}   "
          f"({time.perf_counter() - t_start:.0f} s, {args.jobs} at a time)")
    for m, status, tail in survivors:
        print(f"  {'survived' if status == 'passed' else status}: {m.name} ({m.file}): {m.why}\n"
              f"    {m.original!r} -> {m.replacement!r}\n    tests: {m.tests}")
        if status == "error":
            print("    " + tail.replace("\n", "\n    "))
    return 0 if not survivors else 1


if __name__ == "__main__":
    sys.exit(main())
