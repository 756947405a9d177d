"""Every exercise's check, fed its most obvious shortcut, rejects it with a message that says why;
fed a real solution, it accepts (issue 15, point 2; the table in docs/teaching.md).

Numeric exercises are pure calls: a helper computing the answer is accepted (they are about
understanding); the usual mistake (the other bubble definition, a factor forgotten, the book's
example copied) is rejected. Exercises on the ranks take the ``Run`` that ``launch`` returned: a
value computed in one process, a run on the wrong number of ranks, with the wrong partition,
schedule or collectives is rejected. Launches are shared through one cache (at most 4 ranks, so
one pool of workers serves the file); the 8- and 16-rank solutions (P.11, 12.4.1, 12.4.2) are
accepted where their notebooks run under nbval, and are only fed shortcuts here.
"""
from fractions import Fraction

import numpy as np
import pytest
import torch

from helpers import amdahl, concurrency, dag, failures, inference, intensity, memory
from helpers import mesh as hm
from helpers import pipeline_parallel as ppl
from helpers import pipeline_schedule as ps
from helpers import planner as pl
from helpers import ring_attention as ra
from helpers import scaling as sc
from helpers import sequence_parallel as sp
from helpers import tensor_parallel as tp
from helpers import three_d as td
from helpers import tp_numpy as tn
from helpers.course.exercises import (
    NotAnswered,
    c12_1_1,
    c12_1_2,
    c12_2_1,
    c12_2_2,
    c12_3_1,
    c12_3_2,
    c12_4_1,
    c12_4_2,
    check_pipeline_order,
    p01,
    p02,
    p03,
    p04,
    p05,
    p06,
    p07,
    p08,
    p09,
    p10,
    p11,
    p12,
    p13,
    p14,
    p15,
)
from helpers.launcher import launch
from helpers.memory import GB

# ---- numeric exercises: (check, the solution, the usual mistake, what the rejection says) ----------


def _sharded_makespan():
    d = {f"embed[{i}]": 2 for i in range(100)} | {"merge": 10, "combine": 2} | {f"shard[{s}]": 5 for s in range(4)}
    e = ([(f"embed[{i}]", "merge") for i in range(100)] + [("merge", f"shard[{s}]") for s in range(4)]
         + [(f"shard[{s}]", "combine") for s in range(4)])
    return dag.list_schedule(dag.DAG(d, e), 8).makespan


def _p03_batch():
    r = intensity.ridge(989e12, 3.35e12)
    return next(b for b in range(1, 10_000) if intensity.autoregressive(7e9, 1, batch=b).intensity >= r)


def _p04_workers():
    return next(n for n in range(1, 201) if dag.list_schedule(dag.embedding_job(), n).speedup >= 6)


def _p09_split():
    def step(c):
        f = p09.stage_costs(c)
        return ps.simulate("1f1b", 4, 16, f=f, b=[2 * x for x in f], w=0).makespan
    return min(([a, b, c, 8 - a - b - c] for a in range(1, 6) for b in range(1, 6) for c in range(1, 6)
                if a + b + c < 8), key=step)


def _block_outputs():  # 12.3.2 exercise 2: each block's (m, l, O)
    return (2.0, np.exp(-1) + 1.0, 10 * np.exp(-1) + 20.0), (3.0, 1.0, 30.0)


def _merged():
    (ma, la, oa), (mb, lb, ob) = _block_outputs()
    m = max(ma, mb)
    return (np.exp(ma - m) * oa + np.exp(mb - m) * ob) / (np.exp(ma - m) * la + np.exp(mb - m) * lb)


def _unscaled_merge():  # adds the blocks' sums without rescaling them to a common max
    (_, la, oa), (_, lb, ob) = _block_outputs()
    return (oa + ob) / (la + lb)


NOT_QUITE = "not quite"
NUMERIC = [
    (p01.ex1, lambda: dag.embedding_job(n_chunks=300).parallelism(), lambda: dag.embedding_job().parallelism(), NOT_QUITE),
    (p01.ex2, _sharded_makespan, lambda: dag.list_schedule(dag.embedding_job(), 8).makespan, NOT_QUITE),
    (p02.ex1, lambda: 650, lambda: 120 + 200 + 450, NOT_QUITE),
    (p02.ex2, lambda: 300, lambda: 1200, NOT_QUITE),
    (p03.ex1, lambda: intensity.matmul(512, 8192, 8192).flops, lambda: 512 * 8192 * 8192, NOT_QUITE),
    (p03.ex2, _p03_batch, lambda: _p03_batch() - 1, "not quite: that is not the smallest batch"),
    (p03.ex2, _p03_batch, lambda: float(_p03_batch()), "as an integer"),
    (p04.ex1, lambda: amdahl.speedup(0.95, 16), lambda: 0.95 * 16, NOT_QUITE),
    (p04.ex2, lambda: amdahl.p_for_efficiency(0.8, 32), lambda: 0.8, NOT_QUITE),
    (p04.ex3, _p04_workers, lambda: _p04_workers() - 1, "smallest worker count"),
    (p05.ex1, lambda: 0.3 + 0.2 + 0.25, lambda: 0.5, NOT_QUITE),
    (p05.ex2, lambda: amdahl.karp_flatt(100 / 7, 16), lambda: 100 / 7, NOT_QUITE),
    (p06.ex1, lambda: 128, lambda: 32, "not quite: that is not the effective batch"),
    (p06.ex2, lambda: 4 * 20 / 32, lambda: 20 / 32, NOT_QUITE),
    (p07.ex1, lambda: 2 * 15 / 16, lambda: 2.0, NOT_QUITE),
    (p07.ex2, lambda: 8 * 10e-6 * 50e9, lambda: 10e-6 * 50e9, NOT_QUITE),
    (p08.ex1, lambda: [-3, -4], lambda: [3, 6], "not yet: device 1's partial product"),
    (p08.ex1, lambda: [-3, -4], lambda: -7, "expected two numbers"),
    (p08.ex2, lambda: 2 * 48 * (2 * 7 / 8 * 4096 * 8192 * 2) / 400e9 * 1e3,
     lambda: 48 * (2 * 7 / 8 * 4096 * 8192 * 2) / 400e9 * 1e3, NOT_QUITE),
    (p09.ex1, lambda: 5 / 15, lambda: 5 / 10, NOT_QUITE),  # the other definition (idle/useful)
    (p09.ex2, lambda: 63, lambda: 70, "not quite"),
    (p09.ex3, _p09_split, lambda: [2, 2, 2, 2], "shortest 1F1B step"),
    (p09.ex3, _p09_split, lambda: [2, 2, 4], "4 positive integer layer counts"),
    (p10.ex1, lambda: 32_768 ** 2 * 2, lambda: 32_768 ** 2, NOT_QUITE),
    (p10.ex2, lambda: ra.ulysses_bytes_per_rank(128_000, 8, 64, 128) / ra.ring_bytes_per_rank(128_000, 8, 64, 128),
     lambda: ra.ring_bytes_per_rank(128_000, 8, 64, 128) / ra.ulysses_bytes_per_rank(128_000, 8, 64, 128), NOT_QUITE),
    (p11.ex1, lambda: (1, 1, 1), lambda: (1, 1, 0), "coordinate of GPU 13"),
    (p11.ex2, lambda: [6, 14], lambda: [4, 5, 6, 7], "data-parallel group of GPU 6"),
    (p11.ex3, lambda: memory.per_device_total(40e9 / 8, 2, 2) / GB, lambda: memory.per_device_total(40e9 / 8, 2, 1) / GB, NOT_QUITE),
    (p12.ex1, lambda: 1e3 * (140e9 / 8 / 3350e9 + 80 * 2 * 10e-6), lambda: 1e3 * 140e9 / 8 / 3350e9, NOT_QUITE),
    (p12.ex2, lambda: inference.largest_tp_for_efficiency(0.5, 14e9, 1000e9, layers=32, alpha=15e-6),
     lambda: 2 * inference.largest_tp_for_efficiency(0.5, 14e9, 1000e9, layers=32, alpha=15e-6), "largest power-of-two"),
    (p12.ex3, lambda: p12.smallest_batch_for_p99(), lambda: p12.smallest_batch_for_p99() - 1, "smallest max_batch"),
    (p13.ex1, lambda: amdahl.karp_flatt(80 / 26, 4), lambda: 80 / 26, NOT_QUITE),
    (p13.ex2, lambda: sc.analyze({1: 10.0, 8: 12.5}, mode="weak")[1]["serial_fraction"],
     lambda: amdahl.karp_flatt(8 * 10 / 12.5, 8), NOT_QUITE),
    (p13.ex3, lambda: "overhead growing with N", lambda: "fixed serial part", "not quite: 'fixed serial part'"),
    (p13.ex3, lambda: "overhead growing with N", lambda: "communication", "expected the diagnosis"),
    (p14.ex1, lambda: failures.young_interval(120, failures.cluster_mtbf(80_000 * 3600, 4096)),
     lambda: failures.young_interval(120, 80_000 * 3600), NOT_QUITE),  # the device MTBF, not the job's
    (p14.ex2, lambda: 7 * 40 / (8 * 130), lambda: 40 / 120, NOT_QUITE),
    (p15.ex1, lambda: ps.min_microbatches(8, Fraction(1, 10), "total"), lambda: ps.min_microbatches(8, Fraction(1, 10), "useful"), "not quite"),
    (p15.ex2, lambda: memory.per_device_total(13e9, 64, 1) / GB, lambda: 16 * 13e9 / GB, NOT_QUITE),
    (p15.ex3, lambda: pl.plan(pl.book_70b(), pl.h100_cluster(256), 512).best.layout.pp,
     lambda: pl.plan(pl.book_70b(), pl.h100_cluster(256), 2048).best.layout.pp, "pipeline degree"),  # the section's batch
    (c12_1_1.ex1, lambda: memory.bytes_per_param("bf16-mixed", "sgd-momentum").total, lambda: 16, NOT_QUITE),
    (c12_1_1.ex2, lambda: memory.max_params_that_fit(80e9, reserve_bytes=20e9), lambda: 80e9 / 16, NOT_QUITE),
    (c12_1_2.ex1, lambda: memory.per_device_total(13e9, 8, 2) / GB, lambda: memory.per_device_total(13e9, 8, 1) / GB, NOT_QUITE),
    (c12_1_2.ex2, lambda: memory.smallest_stage_that_fits(13e9, 80e9, 8, reserve_bytes=20e9), lambda: 3, "not quite: 3"),
    (c12_1_2.ex2, lambda: memory.smallest_stage_that_fits(13e9, 80e9, 8, reserve_bytes=20e9), lambda: "ZeRO-2", "expected the lowest stage"),
    (c12_1_2.ex3, lambda: memory.min_world_size_to_fit(70e9, 80e9, 3, reserve_bytes=20e9), lambda: 14, "smallest number of devices"),
    (c12_2_1.ex1, lambda: 32 * 4 * tp.allreduce_bytes_per_device(4096, 4, 4096, 4, bytes_per_element=2),
     lambda: 32 * 2 * tp.allreduce_bytes_per_device(4096, 4, 4096, 4, bytes_per_element=2), NOT_QUITE),  # forward only
    (c12_2_1.ex2, lambda: 8, lambda: 16, "largest valid tensor-parallel degree"),
    (c12_2_2.ex1, lambda: 1 / (1 + 15 / 48), lambda: 1 - 15 / 48, NOT_QUITE),
    (c12_2_2.ex2, lambda: int(ps.simulate("zb-h1", 6, 12, f=2, b=2, w=1).idle(0)),
     lambda: int(ps.simulate("1f1b", 6, 12, f=2, b=2, w=1).idle(0)), "idle time per device"),
    (c12_2_2.ex3, lambda: (lambda x, dy: dy.T @ x), lambda: (lambda x, dy: x.T @ dy), "weight gradient"),
    (c12_3_1.ex1, lambda: 10 * 2048 * 8 * 4096, lambda: 20 * 2048 * 8 * 4096, NOT_QUITE),
    (c12_3_1.ex2, lambda: 34 * 4096 * 4 * 5120 / 4, lambda: 34 * 4096 * 4 * 5120, NOT_QUITE),
    (c12_3_2.ex1, lambda: 2 * 3 * (65_536 / 4) * 32 * 128 * 2, lambda: 3 * (65_536 / 4) * 32 * 128 * 2, NOT_QUITE),
    (c12_3_2.ex2, _merged, _unscaled_merge, NOT_QUITE),
    (c12_3_2.ex3, lambda: (7 * 1024 * 1024 + 1024 * 1025 / 2) / (1024 * 1025 / 2), lambda: 8, NOT_QUITE),
    (c12_4_1.ex1, lambda: 15 / 64, lambda: 15 / 79, NOT_QUITE),
    (c12_4_1.ex2, lambda: 12 * 70e9 / (8 * 32) / GB, lambda: 12 * 70e9 / 8 / GB, NOT_QUITE),
    (c12_4_1.ex3, lambda: 2 * 31 / 32 * (70e9 / 8 * 2) / GB, lambda: 2 * 31 / 32 * 70e9 * 2 / GB, NOT_QUITE),
    (c12_4_2.ex1, lambda: 405e9 * 2 / 128 / GB, lambda: 405e9 * 2 / 8 / GB, NOT_QUITE),
    (c12_4_2.ex2, lambda: ps.min_microbatches(16, Fraction(1, 5), "useful"), lambda: ps.min_microbatches(16, Fraction(1, 5), "total"),
     "smallest number of micro-batches"),
    (c12_4_2.ex3, lambda: 768 * 8192, lambda: 768 * 4096, "tokens per step"),
    # 4096 tokens x 8 copies x 7168 values x 1 byte (FP8), 63 of every 64 experts elsewhere
    (c12_4_2.ex5, lambda: 4096 * 8 * 7168 * 63 / 64 / 1e6, lambda: 4096 * 8 * 7168 * 2 * 63 / 64 / 1e6, NOT_QUITE),  # BF16
    (c12_4_2.ex5, lambda: 4096 * 8 * 7168 * 63 / 64 / 1e6, lambda: 4096 * 8 * 7168 / 1e6, NOT_QUITE),  # local copies sent
]


@pytest.mark.parametrize("check, right, wrong, message", NUMERIC,
                         ids=[f"{c.__module__.rsplit('.', 1)[1]}.{c.__name__}-{i}" for i, (c, *_) in enumerate(NUMERIC)])
def test_a_numeric_exercise_accepts_the_answer_and_rejects_the_usual_mistake(check, right, wrong, message, capsys):
    check(right())
    assert capsys.readouterr().out.startswith("correct:")
    with pytest.raises(AssertionError, match=message):
        check(wrong())
    with pytest.raises(NotAnswered, match="not answered yet"):
        check(None)


def test_the_fitted_overhead_crossover_uses_the_students_own_fit():
    p05.ex3(2e-5 / 4e-9, 2e-5, 4e-9)
    with pytest.raises(AssertionError, match="not quite"):
        p05.ex3(4e-9 / 2e-5, 2e-5, 4e-9)  # b / a instead of a / b


# ---- exercises on the ranks -------------------------------------------------------------------------

def _nothing():
    return None


@pytest.fixture(scope="module")
def runs():
    """``runs(key, fn, *args, world_size=n, **kw)``: one launch per key for the whole file."""
    cache = {}
    launch(_nothing, world_size=4, quiet=True)  # start the 4 workers at once, not one launch at a time

    def get(key, fn, *args, **kwargs):
        if key not in cache:
            cache[key] = launch(fn, *args, quiet=True, **kwargs)
        return cache[key]

    return get


def rejects(check, *args, match):
    with pytest.raises(AssertionError, match=match):
        check(*args)


NOT_A_RUN = "expected the Run that launch"


def _block_worker(split="block"):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = range(rank * 100 // world, (rank + 1) * 100 // world) if split == "block" else range(rank, 100, world)
    mine = {f"embed[{i}]": dag.embedding_task(f"embed[{i}]", 0, {}) for i in chunks}
    parts = [None] * world if rank == 0 else None
    dist.gather_object(mine, parts, dst=0)
    if rank:
        return None, list(chunks)
    merged = dag.embedding_task("merge", 0, {k: v for p in parts for k, v in p.items()})
    return dag.embedding_task("index", 0, {"merge": merged}), list(chunks)


def test_p01_block_split_on_three_ranks(runs):
    p01.ex3(runs("p01", _block_worker, world_size=3))
    rejects(p01.ex3, runs("p01 cyclic", _block_worker, "cyclic", world_size=3), match="not one contiguous range")
    rejects(p01.ex3, [(dag.embedding_reference(100), 34), (None, 33), (None, 33)], match=NOT_A_RUN)
    rejects(p01.ex3, runs("p01 2", _block_worker, world_size=2), match="ran on 2 ranks; the exercise asks for 3")


def _split_sum_worker(n, last_takes_rest=True):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    size = n // world if last_takes_rest else -(-n // world)
    start, stop = rank * size, min(n, (rank + 1) * size) if rank < world - 1 else n
    part = torch.tensor(concurrency.count_mod7_range(start, stop), dtype=torch.int64)
    dist.all_reduce(part)
    return start, stop, int(part)


def test_p02_contiguous_slices_and_an_all_reduce(runs):
    p02.ex3(runs("p02", _split_sum_worker, 100, world_size=3), 100)
    rejects(p02.ex3, [concurrency.count_mod7_exact(100)] * 3, 100, match=NOT_A_RUN)
    rejects(p02.ex3, runs("p02 ceil", _split_sum_worker, 100, False, world_size=3), 100, match="rank 0 took range")


def _product_worker(A, B, split):
    import torch.distributed as dist

    r, n = dist.get_rank(), dist.get_world_size()
    if split == "columns":
        c = B.shape[1] // n
        block = torch.from_numpy(A @ B[:, r * c:(r + 1) * c])
    else:  # rows of A
        c = A.shape[0] // n
        block = torch.from_numpy(A[r * c:(r + 1) * c] @ B)
    parts = [torch.empty_like(block) for _ in range(n)]
    dist.all_gather(parts, block)
    return block.numpy(), torch.cat(parts, dim=1 if split == "columns" else 0).numpy()


def test_p03_a_column_split_on_four_ranks(runs):
    A, B = np.random.default_rng(1).normal(size=(8, 6)), np.random.default_rng(2).normal(size=(6, 8))
    p03.ex3(runs("p03", _product_worker, A, B, "columns", world_size=4), A, B)
    rejects(p03.ex3, A @ B, A, B, match=NOT_A_RUN)
    rejects(p03.ex3, runs("p03 rows", _product_worker, A, B, "rows", world_size=4), A, B, match="rank 0's block is not")


def test_p04_karp_flatt_of_two_runs(runs):
    r1 = runs("p04 1", amdahl.amdahl_job_worker, 40, 0.005, 0.040, world_size=1)
    r4 = runs("p04 4", amdahl.amdahl_job_worker, 40, 0.005, 0.040, world_size=4)
    t = [max(r["elapsed"] for r in run.results) for run in (r1, r4)]
    p04.ex4(amdahl.karp_flatt(t[0] / t[1], 4), r1, r4)
    rejects(p04.ex4, 0.1, 1.0, 0.3, match=NOT_A_RUN)  # the old form: times typed in
    rejects(p04.ex4, amdahl.karp_flatt(t[0] / t[1], 4), r4, r4, match="ran on 4 ranks; the exercise asks for 1")
    r2 = runs("p04 2", amdahl.amdahl_job_worker, 40, 0.005, 0.040, world_size=2)
    rejects(p04.ex4, 0.2, r1, r2, match="ran on 2 ranks; the exercise asks for 4")
    rejects(p04.ex4, 0.2, r1, r4, match="not quite")


def test_p05_task_counts_from_the_ranks(runs):
    from helpers import efficiency as ef

    run = runs("p05", ef.imbalance_worker, 30, 0.002, world_size=4)
    p05.ex4([r["tasks"] for r in run.results], run)
    rejects(p05.ex4, ef.task_counts(30, 4), None, match="not answered yet: set the answer variable to the Run")
    rejects(p05.ex4, ef.task_counts(30, 4), runs("p05 3", ef.imbalance_worker, 30, 0.002, world_size=3),
            match="ran on 3 ranks; the exercise asks for 4")
    rejects(p05.ex4, [8, 8, 8, 6], run, match="not the ranks' task counts")


def _dp_worker(X, y, w, sizes, weighted=True):
    import torch.distributed as dist

    from helpers import data_parallel as dp

    idx = dp.split_at(len(y), sizes)[dist.get_rank()]
    g = torch.from_numpy(dp.mse_grad(X[idx], y[idx], w) * (len(idx) / len(y) if weighted else 1 / len(sizes)))
    dist.all_reduce(g)
    return g.numpy(), len(idx)


def test_p06_an_exact_gradient_from_unequal_shards(runs):
    rng = np.random.default_rng(0)
    X, y, w = rng.normal(size=(64, 5)), rng.normal(size=64), rng.normal(size=5)
    p06.ex3(runs("p06", _dp_worker, X, y, w, [10, 10, 44], world_size=3), X, y, w)
    from helpers import data_parallel as dp

    rejects(p06.ex3, dp.mse_grad(X, y, w), X, y, w, match=NOT_A_RUN)  # the hole: no ranks at all
    rejects(p06.ex3, runs("p06 equal", _dp_worker, X, y, w, [21, 21, 22], False, world_size=3), X, y, w,
            match=r"the ranks held \[21, 21, 22\] examples")
    rejects(p06.ex3, runs("p06 plain", _dp_worker, X, y, w, [10, 10, 44], False, world_size=3), X, y, w,
            match="full-batch gradient")


def _rs_ag_worker(composed=True):
    import torch.distributed as dist

    x = torch.randn(4000, generator=torch.Generator().manual_seed(dist.get_rank()), dtype=torch.float64)
    ref = x.clone()
    dist.all_reduce(ref)
    if not composed:
        return {"max_abs_diff": 0.0}
    piece = torch.empty(4000 // dist.get_world_size(), dtype=x.dtype)
    dist.reduce_scatter_single(piece, x.clone())
    out = torch.empty_like(x)
    dist.all_gather_single(out, piece)
    return {"max_abs_diff": (out - ref).abs().max().item()}


def test_p07_reduce_scatter_then_all_gather(runs):
    p07.ex3(runs("p07", _rs_ag_worker, world_size=4))
    rejects(p07.ex3, runs("p07 ar", _rs_ag_worker, False, world_size=4), match="rank 0 issued 0 reduce_scatter calls")
    rejects(p07.ex3, runs("p07 2", _rs_ag_worker, world_size=2), match="ran on 2 ranks; the exercise asks for 4")


def _row_split_worker(X, W, split="rows"):
    import torch.distributed as dist

    r, n = dist.get_rank(), dist.get_world_size()
    k = X.shape[1] // n
    P = torch.from_numpy(X[:, r * k:(r + 1) * k] @ W[r * k:(r + 1) * k] if split == "rows" else X @ W / n)
    Y = P.clone()
    dist.all_reduce(Y)
    return P.numpy(), Y.numpy()


def test_p08_a_row_split_on_four_ranks(runs):
    X, W = np.random.default_rng(3).normal(size=(5, 8)), np.random.default_rng(4).normal(size=(8, 6))
    p08.ex3(runs("p08", _row_split_worker, X, W, world_size=4), X, W)
    rejects(p08.ex3, X @ W, X, W, match=NOT_A_RUN)
    rejects(p08.ex3, runs("p08 whole", _row_split_worker, X, W, "whole", world_size=4), X, W,
            match="rank 0's partial product is not")


def test_p09_and_12_2_2_schedules_read_from_the_ranks_spans(runs):
    g = runs("gpipe", ppl.pipeline_step_worker, "gpipe", 16, world_size=4)
    o = runs("1f1b", ppl.pipeline_step_worker, "1f1b", 16, world_size=4)
    z = runs("zb-h1", ppl.pipeline_step_worker, "zb-h1", 16, world_size=4)
    ratio = g.results[0]["peak_bytes"] / o.results[0]["peak_bytes"]
    p09.ex4(ratio, g, o)
    rejects(p09.ex4, 16 / 4, None, None, match="not answered yet: set the answer variable to the Run")
    rejects(p09.ex4, 1 / ratio, o, g, match="rank 0's order of F/B/W steps is 1F1B's, not GPipe's")
    c12_2_2.ex4(z)
    rejects(c12_2_2.ex4, ppl.gather_grads(z.results), match=NOT_A_RUN)
    rejects(c12_2_2.ex4, ppl.reference_grads()[0], match=NOT_A_RUN)  # the hole
    rejects(c12_2_2.ex4, o, match=r"rank 0's order of F/B/W steps is 1F1B's, not zero-bubble \(ZB-H1\)'s")
    with pytest.raises(AssertionError, match="rank 0 recorded 16 forward .F. steps; the exercise asks for m = 8"):
        check_pipeline_order(z, "zb-h1", 8)


def test_12_4_1s_schedule_check_reads_pipeline_stages_from_the_results(runs):
    # 12.4.1's 8-rank run is too big for this file; its schedule check is this one, on DP1 x PP4
    run = runs("3d pp4", td.three_d_worker, dp=1, pp=4, tp=1, steps=1, schedule="1f1b", world_size=4)
    stage = lambda r: (run.results[r]["coord"]["pp"], 4)  # noqa: E731
    check_pipeline_order(run, "1f1b", 2, stage_of=stage)
    with pytest.raises(AssertionError, match="rank 3's order of F/B/W steps is 1F1B's, not GPipe's"):
        check_pipeline_order(run, "gpipe", 2, stage_of=stage)
    rejects(c12_4_1.ex4, run.results, {"losses": [0.0] * 3}, match=NOT_A_RUN)
    rejects(c12_4_1.ex4, run, {"losses": [0.0] * 3}, match="ran on 4 ranks; the exercise asks for 8")


def _attention_worker(s, heads, d, scheme, design):
    import torch.distributed as dist

    from helpers import attention_numpy as an

    q, k, v, _ = ra.make_inputs(s, heads, d, 0, torch.float64)
    rank, p = dist.get_rank(), dist.get_world_size()
    idx = ra.partition_indices(s, p, scheme)[rank]
    rows = torch.as_tensor(idx)
    if design == "ring":
        out = ra.ring_attention(q[:, rows], k[:, rows], v[:, rows], scheme=scheme, causal=True)
        return {"idx": idx, "out": out}
    kv = torch.stack([k[:, idx], v[:, idx]])
    everyone = torch.empty((2 * p,) + kv.shape[1:], dtype=kv.dtype)
    dist.all_gather_single(everyone, kv)
    kf, vf = (everyone.view(p, 2, heads, s // p, d)[:, i].permute(1, 0, 2, 3).reshape(heads, s, d) for i in (0, 1))
    mask = np.asarray(idx)[:, None] >= np.arange(s)[None, :] if design == "gather causal" else None
    out, _ = an.attention(q[:, idx].numpy(), kf.numpy(), vf.numpy(), mask=mask)
    return {"idx": idx, "out": torch.from_numpy(out)}


def _cut_into_ranks(s, heads, d, p, causal):
    q, k, v, _ = ra.make_inputs(s, heads, d, 0, torch.float64)
    ref = ra.reference_attention(q, k, v, causal=causal)[0]
    return [{"idx": idx, "out": ref[:, idx]} for idx in ra.partition_indices(s, p)]


def test_p10_all_gather_attention_on_three_ranks(runs):
    p10.ex3(runs("p10", _attention_worker, 96, 2, 8, "contiguous", "gather", world_size=3), 96, 2, 8)
    rejects(p10.ex3, _cut_into_ranks(96, 2, 8, 3, False), 96, 2, 8, match=NOT_A_RUN)
    rejects(p10.ex3, runs("p10 2", _attention_worker, 96, 2, 8, "contiguous", "gather", world_size=2), 96, 2, 8,
            match="ran on 2 ranks; the exercise asks for 3")


def test_12_3_2_a_zigzag_ring_on_three_ranks(runs):
    c12_3_2.ex4(runs("ring zz", _attention_worker, 96, 2, 8, "zigzag", "ring", world_size=3), 96, 2, 8)
    rejects(c12_3_2.ex4, _cut_into_ranks(96, 2, 8, 2, True), 96, 2, 8, match=NOT_A_RUN)  # the hole
    rejects(c12_3_2.ex4, runs("ring contiguous", _attention_worker, 96, 2, 8, "contiguous", "ring", world_size=3),
            96, 2, 8, match="rank 0 holds the wrong token positions for the zigzag partition")
    rejects(c12_3_2.ex4, runs("gather zz", _attention_worker, 96, 2, 8, "zigzag", "gather causal", world_size=3),
            96, 2, 8, match="rank 0 issued 0 send calls")


def _group_sum_worker(name):
    import torch.distributed as dist

    groups = hm.build_groups(hm.Mesh.of(dp=2, pp=2, tp=1))
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t, group=groups[name])
    return int(t.item())


def test_p11_and_12_4_2_group_exercises_need_their_runs(runs):
    run = runs("groups", _group_sum_worker, "pp", world_size=4)
    mesh8 = hm.Mesh.of(dp=2, pp=2, tp=2)
    rejects(p11.ex4, [sum(mesh8.group_of(r, "pp")) for r in range(8)], match=NOT_A_RUN)
    rejects(p11.ex4, run, match="ran on 4 ranks; the exercise asks for 8")
    m4 = hm.Mesh.of(dp=2, pp=2, cp=2, tp=2)
    by_hand = {"rank": 5, "coord": m4.coord(5), "groups": {"cp": m4.group_of(5, "cp")}, "sums": {"cp": sum(m4.group_of(5, "cp"))}}
    rejects(c12_4_2.ex4, by_hand, match=NOT_A_RUN)
    rejects(c12_4_2.ex4, run, match="ran on 4 ranks; the exercise asks for 16")


DECODE_CFG = tp.BlockConfig(h=32, heads=4, ffn=64)


def test_p12_tensor_parallel_decode_on_two_ranks(runs):
    run = runs("p12", inference.tp_decode_worker, DECODE_CFG, 2, 5, 1, 2, 0, "float64", world_size=2)
    p12.ex4(run, DECODE_CFG, layers=2, steps=5, batch=2)
    one = inference.run_decoder(inference.build_decoder(DECODE_CFG, 2), inference.decode_inputs(DECODE_CFG, 5, 2))["out"]
    rejects(p12.ex4, one, DECODE_CFG, 2, 5, 2, match=NOT_A_RUN)
    rejects(p12.ex4, runs("p12 1", inference.tp_decode_worker, DECODE_CFG, 2, 5, 1, 2, 0, "float64", world_size=1),
            DECODE_CFG, 2, 5, 2, match="ran on 1 rank; the exercise asks for 2")


def test_p13_the_protocol_on_the_ranks_not_in_a_pool():
    good = sc.run_protocol(sc.rank_measure(tasks=3, size=100_000, mode="weak"), workers=(1, 2), repeats=5, warmup=1, mode="weak")
    p13.ex4(good)

    def pool_like(n, count):  # what sc.pool_measure's trials look like, without starting pools
        return [sc.Trial({"startup": 0.1, "parallel": 0.1, "teardown": 0.01, "combine": 0.001}, (0.1,) * n,
                         n * 3 * sc.work_reference(100_000)) for _ in range(count)]

    pooled = sc.run_protocol(pool_like, workers=(1, 2), repeats=5, warmup=1, mode="weak")
    rejects(p13.ex4, pooled, match="not on the ranks")
    strong = sc.Experiment("strong", good.settings)
    rejects(p13.ex4, strong, match="weak-scaling mode")


def _token_worker(X, y, seq, w, asg, weighted=True):
    import torch.distributed as dist

    m = np.isin(seq, asg[dist.get_rank()])
    n = float(m.sum())
    g = torch.from_numpy(X[m].T @ (X[m] @ w - y[m]) / (1.0 if weighted else n))
    c = torch.tensor([n if weighted else 1.0], dtype=torch.float64)
    dist.all_reduce(g)
    dist.all_reduce(c)
    return (g / c).numpy(), int(n)


def test_p14_a_token_weighted_gradient_on_three_ranks(runs):
    X, y, seq, w = failures.make_token_batch([3, 50, 8, 21, 90, 4, 17, 33, 6, 60, 12, 25], seed=3)
    asg = failures.sequences_per_rank(12, 3)
    p14.ex3(runs("p14", _token_worker, X, y, seq, w, asg, world_size=3), X, y, seq, w, asg)
    rejects(p14.ex3, failures.token_grad_numpy(X, y, w), X, y, seq, w, asg, match=NOT_A_RUN)
    rejects(p14.ex3, runs("p14 plain", _token_worker, X, y, seq, w, asg, False, world_size=3), X, y, seq, w, asg,
            match="plain average of per-rank token means")


def test_p15_and_c12_4_1_layouts_are_read_from_the_run(runs):
    run = runs("3d dp2 tp2", td.three_d_worker, dp=2, pp=1, tp=2, world_size=4)
    p15.ex4(run)
    rejects(p15.ex4, run.results[0], match=NOT_A_RUN)
    rejects(p15.ex4, runs("3d pp4", td.three_d_worker, dp=1, pp=4, tp=1, steps=1, schedule="1f1b", world_size=4),
            match="layout is DP1 x PP4 x TP1")


def _adamw_worker(ddp=True):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Linear(32, 16)
    model = DDP(model) if ddp else model
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    params = list(model.parameters())
    return {"n_params": sum(p.numel() for p in params), "held": memory.measure_model_state(params, opt)}


def test_12_1_1_fp32_adamw_under_ddp_on_two_ranks(runs):
    run = runs("12.1.1", _adamw_worker, world_size=2)
    c12_1_1.ex3(run)
    rejects(c12_1_1.ex3, run.results[0], match=NOT_A_RUN)
    rejects(c12_1_1.ex3, runs("12.1.1 no ddp", _adamw_worker, False, world_size=2), match="rank 0 issued 0 all_reduce calls")


def _zero1_worker(zero=True):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    dim, steps, lr = c12_1_2.EX4["dim"], c12_1_2.EX4["steps"], c12_1_2.EX4["lr"]
    t, c = torch.tensor(c12_1_2.target(rank, dim)), dim // world
    theta = torch.zeros(dim, dtype=torch.float64)
    for _ in range(steps):
        if zero:
            chunk = torch.empty(c, dtype=torch.float64)
            dist.reduce_scatter_single(chunk, theta - t)
            dist.all_gather_single(theta, theta[rank * c:(rank + 1) * c] - lr * chunk / world)
        else:
            g = theta - t
            dist.all_reduce(g)
            theta = theta - lr * g / world
    return theta


def test_12_1_2_zero1_by_hand_on_four_ranks(runs):
    c12_1_2.ex4(runs("12.1.2", _zero1_worker, world_size=4))
    rejects(c12_1_2.ex4, runs("12.1.2 ddp", _zero1_worker, False, world_size=4), match="one reduce-scatter and one all-gather")
    rejects(c12_1_2.ex4, runs("12.1.2 2", _zero1_worker, world_size=2), match="ran on 2 ranks; the exercise asks for 4")


def _tp_mlp_worker(P, parallel=True):
    import torch.nn.functional as F

    A, B, X = (torch.tensor(P[k]) for k in ("A", "B", "X"))
    if not parallel:
        return (F.gelu(X @ A, approximate="tanh") @ B).numpy()
    fc1, fc2 = tp.ColumnParallelLinear.from_full(A), tp.RowParallelLinear.from_full(B)
    return fc2(F.gelu(fc1(X), approximate="tanh")).detach().numpy()


def test_12_2_1_a_column_then_row_mlp_on_two_ranks(runs):
    P = tn.random_problem(s=5, h=8, ffn=32, seed=11)
    c12_2_1.ex3(runs("12.2.1", _tp_mlp_worker, P, world_size=2), P)
    rejects(c12_2_1.ex3, tn.mlp(P["X"], P["A"], P["B"]), P, match=NOT_A_RUN)
    rejects(c12_2_1.ex3, runs("12.2.1 whole", _tp_mlp_worker, P, False, world_size=2), P, match="rank 0 issued 0 all_reduce calls")


def test_12_3_1_activation_bytes_measured_under_sequence_parallelism(runs):
    cfg = tp.BlockConfig(h=32, heads=4, ffn=128, p_drop=0.1)
    run = runs("12.3.1", sp.activation_memory_worker, cfg, 16, 2, sequence_parallel=True, world_size=2)
    c12_3_1.ex3(run, s=16, b=2, h=32, a=4)
    from helpers.costs import activation_bytes_per_layer

    rejects(c12_3_1.ex3, int(activation_bytes_per_layer(16, 2, 32, 4, 2, sequence_parallel=True)), 16, 2, 32, 4,
            match=NOT_A_RUN)  # the formula the check compares with
    rejects(c12_3_1.ex3, runs("12.3.1 tp", sp.activation_memory_worker, cfg, 16, 2, world_size=2), 16, 2, 32, 4,
            match="rank 0 issued 0 all_gather calls")
