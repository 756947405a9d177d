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
    M("schedule-1f1b-warmup", "helpers/pipeline_schedule.py", "warm = min(p - d - 1 if warm is None else warm, m)",
      "warm = min(p - d if warm is None else warm, m)",
      "tests/test_pipeline_parallel.py -k on_ranks", "1F1B warm-up one forward too long (the ranks run the same order)"),
    M("schedule-interleaved-warmup", "helpers/pipeline_schedule.py", "min((p - d - 1) * 2 + (v - 1) * p, total)",
      "min((p - d - 1) * 2 + (v - 1) * p + 1, total)", "tests/test_pipeline_parallel.py -k 'on_ranks and interleaved'",
      "interleaved warm-up one chunk too long"),
    # Megatron's interleaved batching: each iteration's outputs sent alone before the next inputs are received
    M("pipeline-run-steps-send-alone", "helpers/pipeline_parallel.py",
      "        xs = steps.p2p(outs, groups[n + 1] if n + 1 < len(groups) else [])",
      "        steps.p2p(outs, [])\n        xs = steps.p2p([], groups[n + 1] if n + 1 < len(groups) else [])",
      "tests/test_pipeline_schedule.py -k deadlock",
      "interleaved sends that wait alone for their receiver: the ring of chunks deadlocks on gloo"),
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
    M("zero-numpy-stage3-gathers", "helpers/zero/reference.py", 'parts["all_gather"] = (2 if zero_stage == 3 else 1) * unit',
      'parts["all_gather"] = unit', "tests/test_zero.py -k comm_model", "stage 3's backward all-gather forgotten"),
    M("zero-numpy-adam-bias-correction", "helpers/zero/reference.py", "denom = np.sqrt(v) / math.sqrt(1 - b2**t) + eps",
      "denom = np.sqrt(v) + eps", "tests/test_zero.py -k adamw_numpy", "AdamW without the second moment's bias correction"),
    M("zero-numpy-zero1-average", "helpers/zero/reference.py", "owned = reduce_scatter(grads) / n_dev",
      "owned = reduce_scatter(grads)", "tests/test_zero.py -k identity_in_numpy",
      "ZeRO-1 sums instead of averaging (AdamW nearly cancels it)"),
    M("zero-hand-stage0-average", "helpers/zero/hand.py", "zip(flat.div_(self.world).split(", "zip(flat.split(",
      "tests/test_zero.py -k 'each_stage and 0'", "hand DDP sums gradients instead of averaging"),
    M("zero-hand-stage1-average", "helpers/zero/hand.py", "return self.shard_grads.div_(self.world).split(chunks)",
      "return self.shard_grads.split(chunks)", "tests/test_zero.py -k 'each_stage and 1'", "stage 1 sums instead of averaging"),
    M("zero-hand-stage2-average", "helpers/zero/hand.py", ".add_(out.div_(self.world))", ".add_(out)",
      "tests/test_zero.py -k 'each_stage and 2'", "stage 2's hook sums instead of averaging"),
    M("zero-hand-stage3-average", "helpers/zero/hand.py", "return gx, g_shard.div_(unit.world), None, None",
      "return gx, g_shard, None, None", "tests/test_zero.py -k 'each_stage and 3'", "stage 3's reduce-scatter not averaged"),
    M("zero-hand-all-gather", "helpers/zero/hand.py", "dist.all_gather_single(gathered, mine)",
      "gathered.copy_(mine.repeat(self.world))", "tests/test_zero.py -k 'each_stage and 1'",
      "stages 1-2 never share the updated chunks (each rank repeats its own)"),
    # ---- planner -------------------------------------------------------------------------------
    M("planner-1f1b-in-flight", "helpers/planner/assess.py", "layer_units = min(m, p) * lps",
      "layer_units = min(m, p - 1) * lps", "tests/test_planner.py", "1F1B's stage 0 holds p - 1 micro-batches"),
    M("planner-bubble-definition", "helpers/planner/assess.py", 'bubble_formula(L.pp, m, L.v, definition="useful")',
      'bubble_formula(L.pp, m, L.v, definition="total")', "tests/test_planner.py", "bubble time from the wrong definition"),
    M("planner-tied-embeddings", "helpers/planner/specs.py", '"embeddings": self.vocab * h * (1 if self.tied_embeddings else 2),',
      '"embeddings": self.vocab * h * 2,', "tests/test_planner.py -k 'counts or case_studies'", "tied embeddings counted twice"),
    M("planner-rule-of-thumb-m", "helpers/planner/recipes.py", "if a.m >= 4 * p:", "if a.m >= p:",
      "tests/test_planner.py", "12.4.1's m >= 4p rule relaxed to m >= p"),
    # ---- intensity, failures, inference ---------------------------------------------------------
    M("intensity-matmul-bytes", "helpers/intensity.py", "(m * k + k * n + m * n) * b", "(m * k + k * n) * b",
      "tests/test_intensity.py -k 'example or elementwise or prefill or roofline'", "the output matrix never written"),
    M("intensity-roofline", "helpers/intensity.py", "return min(peak_flops, intensity * bandwidth)",
      "return max(peak_flops, intensity * bandwidth)", "tests/test_intensity.py -k roofline", "roofline upside down"),
    M("failures-young", "helpers/failures/reference.py", 'return math.sqrt(2 * _pos_real(ckpt_cost, "ckpt_cost")',
      'return math.sqrt(_pos_real(ckpt_cost, "ckpt_cost")', "tests/test_failures.py -k 'young or mtbf'",
      "Young's interval without the 2"),
    M("failures-token-weighting", "helpers/failures/reference.py",
      "weighted = (np.array(grads) * counts[:, None]).sum(axis=0) / counts.sum()",
      "weighted = np.array(grads).sum(axis=0) / len(counts)", "tests/test_failures.py -k numpy",
      "token-weighted mean computed as the plain mean"),
    M("failures-restart-cost", "helpers/failures/reference.py", "return float(((M + R) * np.expm1(s / M)).sum())",
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
    M("ring-partition-zigzag", "helpers/ring_attention/partition.py", "chunks[2 * p - 1 - k]", "chunks[p + k]",
      "tests/test_ring_attention.py -k 'partitions or causal_work'", "zig-zag pairs chunk k with p + k"),
    M("ring-partition-causal", "helpers/ring_attention/partition.py", "ok &= q_pos[:, None] >= k_pos[None, :]",
      "ok &= q_pos[:, None] > k_pos[None, :]", "tests/test_ring_attention.py -k 'block_kernel'", "a query cannot see itself"),
    M("ring-partition-bytes", "helpers/ring_attention/partition.py", 'return costs.ring_steps("all_gather", p) * (2 * (s / p)',
      'return costs.ring_steps("all_reduce", p) * (2 * (s / p)', "tests/test_ring_attention.py -k 'cost_models or bytes_sent'",
      "ring attention's bytes with 2(p-1) steps"),
    M("attention-numpy-merge", "helpers/attention_numpy.py", "np.exp(b.m - m_safe), 0)", "np.exp(m_safe - b.m), 0)",
      "tests/test_attention_numpy.py", "online-softmax merge rescales by the wrong sign"),
    M("attention-numpy-scale", "helpers/attention_numpy.py", "scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale",
      "scale = 1.0 / q.shape[-1] if scale is None else scale", "tests/test_attention_numpy.py", "scores scaled by 1/d"),
    M("ring-kernel-merge", "helpers/ring_attention/kernel.py", "torch.exp(blk_lse - safe)", "torch.exp(safe - blk_lse)",
      "tests/test_ring_attention.py -k 'block_kernel or ring_forward'", "the ring's merge rescales by the wrong sign"),
    M("ring-core-source", "helpers/ring_attention/core.py",
      '        src = (rank - j) % p\n        reqs, nxt = None, None\n        if j < p - 1:\n            nxt = track(cfg.meter, torch.empty_like(cur), "kv")\n            if cfg.overlap:',
      '        src = (rank + j) % p\n        reqs, nxt = None, None\n        if j < p - 1:\n            nxt = track(cfg.meter, torch.empty_like(cur), "kv")\n            if cfg.overlap:',
      "tests/test_ring_attention.py -k 'ring_forward_and_backward'", "the forward ring masks K/V as if they came the other way"),
    M("ring-core-dv", "helpers/ring_attention/core.py", "dcur[1] += bv", "dcur[1] += bk",
      "tests/test_ring_attention.py -k 'ring_forward_and_backward'", "dV accumulates dK"),
    # ---- tensor and sequence parallelism --------------------------------------------------------
    M("tp-numpy-gelu-grad", "helpers/tp_numpy.py", "dU = dY * gelu_grad(U)", "dU = dY", "tests/test_tp_numpy.py",
      "the MLP backward skips GeLU's derivative"),
    M("tp-numpy-row-split", "helpers/tp_numpy.py", "zip(np.split(X, t, axis=-1), row_split(W, t))",
      "zip(np.split(X, t, axis=-1), row_split(W, t)[::-1])", "tests/test_tp_numpy.py", "row shards paired with the wrong inputs"),
    M("tp-f-backward", "helpers/tensor_parallel/layers.py", "return all_reduce_sum(grad, ctx.group), None", "return grad, None",
      "tests/test_tensor_parallel.py -k '4_ranks'", "f's backward does not all-reduce"),
    M("tp-column-shard", "helpers/tensor_parallel/layers.py", "blk[..., rank * n:(rank + 1) * n]",
      "blk[..., (t - 1 - rank) * n:(t - rank) * n]", "tests/test_tensor_parallel.py -k '4_ranks'",
      "column shards dealt in reverse while row shards are not"),
    M("tp-head-offset-t8", "helpers/tensor_parallel/block.py", "self.head_offset = self.rank * (cfg.heads // self.t)",
      "self.head_offset = (self.rank % 4) * (cfg.heads // self.t)", "tests/test_tensor_parallel.py -k '8_ranks'",
      "a bug that bites only at t = 8: ranks 4-7 take ranks 0-3's dropout masks"),
    M("tp-attention-scale", "helpers/tensor_parallel/block.py", "* (1.0 / math.sqrt(d))", "* (1.0 / d)",
      "tests/test_tensor_parallel.py -k numpy_block", "every torch block scales scores by 1/d"),
    M("sp-gather-linear-backward", "helpers/tensor_parallel/layers.py", "gx = reduce_scatter_seq(gy @ weight.t(), ctx.group)",
      "gx = split_seq(gy @ weight.t(), ctx.group)", "tests/test_sequence_parallel.py -k sp_block",
      "SP's all-gather-then-matmul: backward takes its rows of dX without summing them"),
    M("sp-gather-operator-backward", "helpers/tensor_parallel/layers.py", "return reduce_scatter_seq(grad, ctx.group), None",
      "return split_seq(grad, ctx.group), None", "tests/test_tensor_parallel.py -k operators",
      "the all-gather operator's backward takes its rows without summing"),
    M("sp-replicated-grads", "helpers/tensor_parallel/block.py", "    for name in REPLICATED:\n        g = params[name].grad",
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
    # ==== designed by a reviewer who had not seen the tests (issue 23, point 4) ====================

    # ---- area 1, the fake world: micro-batches, extrapolation, memory categories, mesh axes, FLOPs ----
    # fake world: the 1F1B warm-up traced one forward too long (stage s then holds PP - s + 1 micro-batches)
    M("fake-world-warmup", "helpers/fake_world/__init__.py", "    return min(layout.pp - stage_index - 1, m)",
      "    return min(layout.pp - stage_index, m)", "tests/test_fake_world.py",
      "the fake world's 1F1B warm-up one forward too long: every stage's activation peak one micro-batch high"),
    # fake world: the steady iterations not traced are copied from the first one (with the one-time weight gather)
    M("fake-world-steady-copy-first", "helpers/fake_world/__init__.py",
      'first, second, times = ("F", 0, warm + 1), ("F", 0, warm + 2), extra',
      'first, second, times = ("F", 0, warm), ("F", 0, warm + 1), extra', "tests/test_fake_world.py",
      "untraced micro-batches repeat the first steady one, whose ZeRO-1/2 weight all-gather happens once per step"),
    # fake world, interleaved: the untraced rounds copy the first steady round (a chunk's first backwards in it)
    M("fake-world-interleaved-copy-first-round", "helpers/fake_world/__init__.py",
      "first = (\"F\", *interleaved_unit(layout.pp, plan.v, rnd + warm, True))",
      "first = (\"F\", *interleaved_unit(layout.pp, plan.v, warm, True))", "tests/test_fake_world_interleaved.py",
      "interleaved steady rounds extrapolated from the first, which holds each chunk's first backwards"),
    # fake world: the parts of a phase never split (the peak of a whole phase put on one line, issue 26's 83.90 GB)
    M("fake-step-parts-never-split", "helpers/fake_world/step.py",
      "if b is not None and id(module) in b[first_or_last]:", "if b is None and id(module) in b[first_or_last]:",
      "tests/test_fake_world.py -k moves_within",
      "a phase's peak that moves from one part to another beyond the traced layers is put on the wrong line"),
    # fake world: a long warm-up scaled by copying the first forward (the one that gathers the weights)
    M("timing-warmup-copies-first-forward", "helpers/fake_world/timing.py",
      "out = repeat_phases(phases, fwd[1], fwd[2], warm - v)", "out = repeat_phases(phases, fwd[0], fwd[1], warm - v)",
      "tests/test_fake_world.py -k long_warm",
      "a scaled 1F1B warm-up's op trace repeats the forward that also gathers the weights"),
    # step time: a backward's gradient reduction on the hand-off path (the drain replays the last backward's sync)
    M("timing-tail-on-the-handoff", "helpers/fake_world/timing.py",
      'done[(kind, d, c, i)] = free[d] - (0.0 if kind == "F" else tail[(c, i)])', "done[(kind, d, c, i)] = free[d]",
      "tests/test_fake_world_timing.py -k 'holds_its_own or does_not_grow'",
      "the previous stage waits for a backward's gradient sync before it gets the input gradient"),
    # the suite's memo of traces: a key without the optimizer's implementation (foreach answered as for-loop)
    M("memo-key-without-optimizer", "helpers/fake_world/__init__.py",
      "reshard_after_forward, checkpoint_every, loss_dtype, optimizer, timing)",
      "reshard_after_forward, checkpoint_every, loss_dtype, timing)", "tests/test_fake_world_memo.py",
      "a memo entry answers a call with another AdamW implementation"),
    # step time, interleaved: a hand-off counted between ops on the same rank (the last stage's B after its own F)
    M("timing-interleaved-handoff-same-rank", "helpers/fake_world/timing.py",
      "ready = max((done[dep] + (handoff_s if dep[1] != d else 0.0) for dep in deps)",
      "ready = max((done[dep] + handoff_s for dep in deps)", "tests/test_fake_world_timing.py -k interleaved",
      "the interleaved timeline waits a hand-off where no activation moves"),
    # fake world: per-layer extrapolation off by one layer
    M("fake-world-line-off-by-one", "helpers/fake_world/__init__.py", "    v = a + (x - x0) * (b - a)",
      "    v = a + (x - x0 - 1) * (b - a)", "tests/test_fake_world.py",
      "trace_layers extrapolation lands one layer short: memory, collectives and FLOPs of L - 1 layers"),
    # fake step: ZeRO-1 reduce-scatters every micro-batch (ZeRO-2's traffic and memory)
    M("fake-step-zero1-sync-every-microbatch", "helpers/fake_world/step.py",
      "        if self.zero in (0, 1):\n            stage.set_requires_gradient_sync(i == m - 1)",
      "        if self.zero == 0:\n            stage.set_requires_gradient_sync(i == m - 1)", "tests/test_fake_world.py",
      "ZeRO-1 in PyTorch's code reduce-scatters per micro-batch: m times the gradient traffic of 12.4.1's ZeRO-1"),
    # fake step: ZeRO shards over DP only, not over the DP x CP ranks that hold the same weights
    M("fake-step-shard-over-dp-only", "helpers/fake_world/step.py",
      'return mesh, (flatten_mesh(mesh["dp", "cp"], "dp_cp") if layout.cp > 1 else mesh["dp"])',
      'return mesh, mesh["dp"]', "tests/test_fake_world.py",
      "CP ranks never synchronise (or shard) their gradients: 12.3.2/12.4.2's model state CP x too large, no dp_cp traffic"),
    # fake step: attention's backward FLOPs counted with the forward formula
    M("fake-step-sdpa-backward-flops", "helpers/fake_world/step.py",
      "        return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)",
      "        return sdpa_flop_count(query_shape, key_shape, value_shape)", "tests/test_fake_world.py",
      "the CPU attention kernel's backward counted as a forward: the 12 L s h attention FLOPs come out low"),
    # llama model: every MLP gated (the GPT-style 7.5B/13B/40B/100B get a third matrix)
    M("llama-mlp-always-gated", "helpers/fake_world/llama_model.py",
      "self.feed_forward = FeedForward(model.hidden, model.ffn, model.mlp_matrices == 3)",
      "self.feed_forward = FeedForward(model.hidden, model.ffn, model.mlp_matrices > 1)", "tests/test_fake_world.py",
      "a 2-matrix GeLU MLP built as SwiGLU: 50% more MLP weights than the planner counts"),
    # llama model: the MLP's dropout mask missing
    M("llama-ffn-dropout-missing", "helpers/fake_world/llama_model.py",
      "self.ffn_dropout = Dropout(DROPOUT_P) if dropout else nn.Identity()",
      "self.ffn_dropout = nn.Identity()", "tests/test_fake_world.py",
      "12.3.1's dropout case keeps one 1-byte mask per layer instead of two: activations 1 sbh short of 34 sbh"),
    # ---- area 2, the planner's schedules and ZeRO arithmetic ----------------------------------------
    # planner: ZeRO shards over DP only in the memory model (the CP ranks hold the same weights)
    M("planner-zero-over-dp-only", "helpers/planner/assess.py",
      "    d = L.dp * L.cp\n    state = per_device_bytes(dense_dev, d, L.zero, rules.precision)",
      "    d = L.dp\n    state = per_device_bytes(dense_dev, d, L.zero, rules.precision)", "tests/test_planner.py",
      "with CP the planner shards model state over DP alone: 12.4.2's 128K layout CP x too heavy"),
    # planner: full recomputation does not repeat the forward's TP all-reduces
    M("planner-recompute-tp-comm", "helpers/planner/assess.py",
      'tp = (6 if L.recompute == "full" else 4) * lps * m * per', "tp = 4 * lps * m * per", "tests/test_planner.py",
      "recomputing a layer's forward costs no TP communication: full recomputation looks cheaper than it is"),
    # planner: the DP all-reduce hidden behind the backward of every micro-batch, not of the last one
    M("planner-dp-window-all-microbatches", "helpers/planner/assess.py",
      "window = compute if L.zero == 3 else compute * 2 / 3 / m", "window = compute if L.zero == 3 else compute * 2 / 3",
      "tests/test_planner.py", "ZeRO 0-2's gradient sync overlapped with all backward passes: exposed DP time vanishes"),
    # planner: gradient accumulation keeps every micro-batch's activations
    M("planner-grad-accum-in-flight", "helpers/planner/assess.py",
      "        layer_units = lps  # gradient accumulation runs micro-batches one after another",
      "        layer_units = m * lps  # every accumulated micro-batch kept", "tests/test_planner.py tests/test_memory_zero.py",
      "without a pipeline, activations charged m times over: gradient accumulation looks like it costs memory"),
    # planner recipes: P.15's step 4b judges the bubble with 12.2.2's definition
    M("planner-recipe-bubble-definition", "helpers/planner/recipes.py", "            bubble = bubble_formula(p, a.m)\n",
      '            bubble = bubble_formula(p, a.m, definition="useful")\n', "tests/test_planner.py",
      "the decision sequence's (p-1)/(m+p-1) check computed as (p-1)/m"),
    # pipeline schedule: ZB-H1's activations released at B, not when the deferred W has run
    M("schedule-zb-release-at-b", "helpers/pipeline_schedule.py", 'release = "W" if self.split_backward else "B"',
      'release = "B"', "tests/test_pipeline_schedule.py",
      "deferring W looks free: ZB-H1's device d holds 1F1B's p - d micro-batches, not min(p, m), although its "
      "deferred W's still need their activations"),
    # pipeline schedule: a hand-off charged between two ops on the same device
    M("schedule-comm-same-device", "helpers/pipeline_schedule.py", "end[n] + (comm if n[1] != d else 0) for n in need",
      "end[n] + comm for n in need", "tests/test_pipeline_schedule.py",
      "the last stage pays a send between its own forward and backward: makespans with comm > 0 too long"),
    # pipeline schedule: the smallest m stops one too late when the target is met exactly
    M("schedule-min-microbatches-boundary", "helpers/pipeline_schedule.py",
      "    while bubble_formula(p, m, 1, definition) > target:", "    while bubble_formula(p, m, 1, definition) >= target:",
      "tests/test_pipeline_schedule.py", "'at most 10%' read as 'under 10%': p = 8 gives m = 64, not 63"),
    # zero_numpy: Adam with L2 regularisation instead of AdamW's decoupled weight decay
    M("zero-numpy-adam-l2-decay", "helpers/zero/reference.py",
      "    p = p * (1 - lr * weight_decay)\n    m = b1 * m + (1 - b1) * g",
      "    g = g + weight_decay * p\n    m = b1 * m + (1 - b1) * g", "tests/test_zero.py -k adamw_numpy",
      "the numpy 'AdamW' is Adam + L2: the decay goes through the moments, unlike PyTorch's AdamW"),
    # memory: the fewest devices under ZeRO-2 treats the gradients as unsharded
    M("memory-min-world-stage2-grads", "helpers/memory.py", "(b.gradients if zero_stage < 2 else 0)",
      "(b.gradients if zero_stage < 3 else 0)", "tests/test_memory_zero.py tests/test_memory.py",
      "12.1.2's fewest devices under stage 2 overestimated (13B: 20 instead of 6), or None where it fits"),
    # memory: the optimizer's step counters measured as moments
    M("memory-step-counter-as-moment", "helpers/memory.py", '(counters if k == "step" else moments).append(v)',
      "moments.append(v)", "tests/test_memory.py",
      "measured moments exceed 8 bytes per parameter by Adam's step counters: measurement and model disagree"),
    # ---- area 3, the exercise checks ----------------------------------------------------------------
    # P.9 exercise 2: the expected m computed with a strict inequality
    M("exercise-p09-bubble-boundary", "helpers/course/exercises/p09.py",
      '    while bubble_formula(8, m, definition="total") > Fraction(1, 10):',
      '    while bubble_formula(8, m, definition="total") >= Fraction(1, 10):', "tests/test_exercise_shortcuts.py",
      "the check rejects the right m = 63 (7/70 is exactly 10%) and accepts 64"),
    # 12.2.2 exercise 1: utilisation expected from the idle/useful bubble
    M("exercise-12-2-2-utilisation-definition", "helpers/course/exercises/c12_2_2.py",
      'check_number(answer, 1 - float(bubble_formula(16, 48, definition="total")),',
      'check_number(answer, 1 - float(bubble_formula(16, 48, definition="useful")),', "tests/test_exercise_shortcuts.py",
      "the check accepts 1 - (p-1)/m, the very mistake its hint warns about, and rejects the right 48/63"),
    # P.6 exercise 2: the loss scale without the world size
    M("exercise-p06-loss-scale", "helpers/course/exercises/p06.py", "check_number(answer, 4 * 20 / 32,",
      "check_number(answer, 20 / 32,", "tests/test_exercise_shortcuts.py",
      "the check accepts n_k/B as DDP's loss scale, which DDP's averaging then divides by the world size"),
    # check_run: only rank 0's communication log is read
    M("exercise-check-run-rank0-only", "helpers/course/exercises/__init__.py", "            got = run.count(op, r)\n",
      "            got = run.count(op, 0)\n", "tests/test_exercise_run_checks.py",
      "a run in which only rank 0 communicated (e.g. over a group of one) passes every 'on the ranks' check"),
    # check_pipeline_order: the steps compared as a multiset, not in order
    M("exercise-pipeline-order-multiset", "helpers/course/exercises/__init__.py",
      "        if got == simulated_order(schedule, p, m, stage) * repeats:\n            continue",
      "        if sorted(got) == sorted(simulated_order(schedule, p, m, stage) * repeats):\n            continue",
      "tests/test_exercise_shortcuts.py", "a GPipe run accepted as 1F1B (and the reverse): P.9's memory ratio from two GPipe runs passes"),
    # P.1 exercise 3: the contiguity test of a block split can never fire
    M("exercise-p01-block-split", "helpers/course/exercises/p01.py", "        if cs[-1] - cs[0] + 1 != len(cs):",
      "        if cs[-1] - cs[0] + 1 < len(cs):", "tests/test_exercise_shortcuts.py",
      "a round-robin split accepted as the block split the exercise asks for"),
    # ---- area 4, the claims ledger's own rules ------------------------------------------------------
    # claims: a not-demonstrable verdict without its reasoning accepted
    M("claims-not-demonstrable-needs-why", "helpers/course/claims.py",
      '        if row["verdict"] != "correct" and not row["why"].strip():',
      '        if row["verdict"] in ERRATA_VERDICTS and not row["why"].strip():', "tests/test_claims.py",
      "a claim marked not-demonstrable with no word on why or what the notebook shows instead"),
    # claims: rounding rows left out of the errata
    M("claims-errata-without-rounding", "helpers/course/claims.py",
      'ERRATA_VERDICTS = ("wrong", "inconsistent", "ambiguous", "rounding")',
      'ERRATA_VERDICTS = ("wrong", "inconsistent", "ambiguous")', "tests/test_claims.py tests/test_errata_and_env.py",
      "the errata tables silently drop every 'right only up to the book's rounding' row"),
    # claims: an id repeated twice passes the uniqueness check
    M("claims-duplicate-id", "helpers/course/claims.py", "if k > 1)", "if k > 2)", "tests/test_claims.py",
      "two ledger rows with one id (one overwriting the other wherever rows are keyed by id)"),
    # claims: the README's 'found only by the second audit' counts rows both audits found
    M("claims-readme-second-only", "helpers/course/claims.py", 'second = sum(r["found_by"] == "second" for r in rs)',
      'second = sum(r["found_by"] != "first" for r in rs)', "tests/test_claims.py",
      "the README credits the second audit alone with claims both audits found"),
    # claims: '12.2.1-A17, A18' cites only A17
    M("claims-audit-ref-continuation", "helpers/course/claims.py",
      '\n        out.update(f"{m.group(1)}-A{n}" for n in re.findall(r"A(\\d+)", m.group(3)))', "",
      "tests/test_claims.py", "a row citing several audit ids counts only the first: the reconciliation reports false gaps"),
    # claims: headings read from code cells too (a comment '# ...' counts as a heading)
    M("claims-headings-from-code-cells", "helpers/course/claims.py",
      '        if c["cell_type"] != "markdown":\n            continue\n', "", "tests/test_claims.py",
      "a 'where' naming a code comment passes the where-link check although no heading shows the claim"),
    # errata: the 'computed' column shows the book's value
    M("errata-computed-is-book", "helpers/course/errata.py", 'out["computed_value"] = row["our_value"]',
      'out["computed_value"] = row["book_value"]', "tests/test_errata_and_env.py tests/test_claims.py",
      "every erratum shows the book's number as the corrected one"),
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
