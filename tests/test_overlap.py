"""P.6 (and 12.1.2, 12.2.1, 12.4.1): communication hidden under computation.

The overlap model and the bucket rule of helpers.costs with values worked by hand; the
hand-written bucketed step (helpers.overlap.GradBuckets) against PyTorch's DDP and against one
process; the buckets each step launched, counted from the communication log; FSDP2's prefetch
order; the tensor-parallel chain; the data-parallel scaling workers.
"""
import math

import pytest

from helpers import costs, memory, zero
from helpers import data_parallel as dp
from helpers import dp_scaling as dps
from helpers import layer_overlap as lo
from helpers import overlap as ov
from helpers.launcher import launch

# ---- closed forms -----------------------------------------------------------------------------

def test_overlap_model_on_the_books_numbers():
    # P.6: 400 ms of compute, a 70 ms all-reduce: 470 ms without overlap, 10 ms exposed when
    # 60 ms can run beside it, max(compute, comm) when all the compute can
    assert costs.step_time(0.400, 0.070) == pytest.approx(0.470, abs=1e-15)
    assert costs.exposed_comm(0.070, 0.060) == pytest.approx(0.010, abs=1e-15)
    assert costs.step_time(0.400, 0.070, 0.060) == pytest.approx(0.410, abs=1e-15)
    assert costs.step_time(0.400, 0.070, 0.400) == 0.400
    assert costs.step_time(0.050, 0.070, 0.050) == pytest.approx(0.070, abs=1e-15)
    assert costs.exposed_comm(0.07, 1.0) == 0.0


def test_buckets_finish_one_after_another():
    # ready at 1, 2, 3; each takes 2: finishes at 3, 5, 7 (the link is the bottleneck)
    assert costs.bucketed_finish([1, 2, 3], [2, 2, 2]) == 7
    # ready late: each starts when ready
    assert costs.bucketed_finish([0, 10, 20], [1, 1, 1]) == 21
    # one bucket of everything, ready at the end of a 9 s backward: fully exposed
    assert costs.bucketed_finish([9], [6]) == 15


def test_bucket_assignment_closes_a_bucket_at_the_cap():
    sizes = [8, 256, 256, 8192, 256, 2048]  # the P.6 MLP's gradients in backward's order
    assert costs.bucket_assignment(sizes, 256) == [[0, 1], [2], [3], [4], [5]]
    assert costs.bucket_assignment(sizes, 512) == [[0, 1, 2], [3], [4, 5]]
    assert costs.bucket_assignment(sizes, 4096) == [[0, 1, 2, 3], [4, 5]]
    assert costs.bucket_assignment(sizes, 1 << 20) == [[0, 1, 2, 3, 4, 5]]
    assert costs.bucket_assignment(sizes, 8192, first_cap_bytes=100) == [[0, 1], [2, 3], [4, 5]]
    assert costs.bucket_assignment([100, 100], 100) == [[0], [1]]  # ">= cap" closes it


def test_linear_scaling_rule():
    assert costs.linear_scaled_lr(0.1, 256, 8192) == pytest.approx(3.2)
    assert costs.linear_scaled_lr(0.05, 16, 64) == pytest.approx(0.2)


def test_ddp_bucket_caps():
    assert ov.ddp_bucket_caps() == (1 << 20, 25 << 20)
    assert ov.ddp_bucket_caps(0.5) == (1 << 19, 1 << 19)
    assert ov.cap_mb(512) * (1 << 20) == 512


@pytest.mark.parametrize("call, match", [
    (lambda: costs.step_time(0.1, 0.2, 0.3), "cannot exceed"),
    (lambda: costs.exposed_comm(-1, 0), "comm_s must be a finite number >= 0"),
    (lambda: costs.bucketed_finish([1], [1, 2]), "equal length"),
    (lambda: costs.bucketed_finish([], []), "non-empty"),
    (lambda: costs.bucket_assignment([8, 8], 0), r"cap_bytes \(the bucket size in bytes\) must be an integer >= 1"),
    (lambda: costs.bucket_assignment([8, 8], 1.5), "cap_bytes"),
    (lambda: costs.bucket_assignment([], 8), "at least one gradient"),
    (lambda: costs.bucket_assignment([8, -1], 8), "a gradient's size in bytes must be an integer >= 1"),
    (lambda: costs.linear_scaled_lr(0.1, 0, 8), "base_batch must be an integer >= 1"),
    (lambda: ov.ddp_bucket_caps(-25), "bucket_cap_mb must be a finite number > 0"),
    (lambda: ov.cap_mb(0), "bucket_bytes"),
    (lambda: ov.GradBuckets(dp.make_model().parameters(), 0), r"bucket_bytes \(the bucket size in bytes\) must be an integer >= 1"),
    (lambda: ov.GradBuckets(dp.make_model().parameters(), -4096), "must be an integer >= 1"),
    (lambda: ov.GradBuckets(dp.make_model().parameters(), 1024.0), "must be an integer >= 1"),
    (lambda: ov.GradBuckets(dp.make_model().parameters(), True), "must be an integer >= 1"),
    (lambda: ov.GradBuckets([], 1024), "at least one parameter"),
    (lambda: ov.GradBuckets(list(dp.make_model().parameters()) + list(dp.make_model().float().parameters()), 1024),
     "same dtype and device"),
    (lambda: lo.layer_bytes((8, 6, 8), world=4), "does not divide the output width 6"),
    (lambda: lo.layer_bytes((8, 8, 8), world=2), "equal parameter bytes"),
    (lambda: dps.train_epochs(48, 0.1, n=64), "must divide the 64 examples"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---- the hand-written bucketed step against DDP and one process (2 ranks) ---------------------

@pytest.mark.parametrize("cap", [264, 4096])  # 264 = 8 + 256: a bucket exactly at its cap closes
def test_hand_buckets_equal_ddp_and_one_process(cap):
    ref = ov.reference_training()
    hand = launch(ov.hand_ddp_worker, cap, world_size=2, quiet=True)
    ddp = launch(ov.ddp_worker, ov.cap_mb(cap), world_size=2, quiet=True)
    ready = ov.ready_order_bytes()
    model = [sum(ready[i] for i in b) for b in costs.bucket_assignment(ready, cap)]
    for r in range(2):
        h, d = hand.results[r], ddp.results[r]
        assert ov.max_diff(h["params"], d["params"]) < 1e-15 and ov.max_diff(h["grads"], d["grads"]) < 1e-15
        assert ov.max_diff(h["params"], ref["params"]) < 1e-12 and ov.max_diff(h["grads"], ref["grads"]) < 1e-12
        assert h["per_step"] == [model] * 3
        # DDP: one bucket of everything in step 1, then buckets rebuilt in backward's order
        assert d["per_step"] == [[sum(ready)]] + [model] * 2
        assert d["rebuilt"] == ", ".join(map(str, model))
        # the communication log of the hand-written step: one all-reduce per bucket
        assert [o.bytes for o in hand.comm[r] if o.op == "all_reduce"] == model * 3


def _unused_parameter_worker():
    import torch

    from helpers.overlap import GradBuckets

    used, unused = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    sync = GradBuckets(list(used.parameters()) + list(unused.parameters()), 8)
    used(torch.ones(1, 2)).sum().backward()
    sync.finish()


def test_a_parameter_without_gradient_is_named_not_waited_for():
    from helpers.launcher import RankError

    with pytest.raises(RankError, match="2 of 4 parameters received no gradient"):
        launch(_unused_parameter_worker, world_size=2, quiet=True)


def test_overlapped_buckets_leave_during_backward_sequential_ones_after():
    run = launch(ov.overlap_timing_worker, width=128, layers=4, batch=4, bucket_bytes=2 * 128 * 129 * 4, repeats=1,
                 world_size=2, quiet=True)
    for r in range(2):
        steps = {s["mode"]: s for s in ov.timed_steps(run, r)}
        assert set(steps) == {"compute", "comm", "sequential", "overlapped"}
        assert run.results[r]["bucket_sizes"] == [2 * 128 * 129 * 4] * 2
        for mode in ("sequential", "overlapped"):
            s = steps[mode]
            end = s["spans"]["backward"][0][1]
            assert len(s["issued"]) == len(s["spans"]["all-reduce"]) == 2
            assert (min(s["issued"]) < end) == (mode == "overlapped")
            assert all(b - a >= 0 for a, b in s["spans"]["all-reduce"])
        assert steps["compute"]["issued"] == []


# ---- FSDP2's prefetch and the tensor-parallel chain (2 ranks) ---------------------------------

def test_fsdp2_prefetch_order_and_result():
    ref = lo.prefetch_reference(batch=64)
    plain = launch(lo.fsdp_prefetch_worker, batch=64, world_size=2, quiet=True)
    ahead = launch(lo.fsdp_prefetch_worker, batch=64, forward_prefetch=True, async_unshard=True, world_size=2, quiet=True)
    for run in (plain, ahead):
        assert math.isclose(run.results[0]["loss"], ref["loss"], rel_tol=1e-6)
        assert ov.max_diff(zero.assemble_dim0(run.results, key="grads"), ref["grads"]) < 1e-6
        rows = lo.prefetch_order(run.results[0])
        # backward: the gather of layer i is issued before layer i+1's backward compute begins
        assert all(r["backward: before layer i+1 began"] for r in rows[:-1])
    # forward: without explicit prefetch the gather of layer i waits for layer i-1 to finish
    assert not any(r["forward: before layer i-1 ended"] for r in lo.prefetch_order(plain.results[0])[1:])
    assert all(r["forward: before layer i-1 began"] for r in lo.prefetch_order(ahead.results[0])[1:])
    widths = lo.PREFETCH_WIDTHS
    assert sum(lo.layer_bytes(widths)) == sum(4 * (b * a + b) for a, b in zip(widths[:-1], widths[1:]))


@pytest.mark.parametrize("interleave", [False, True])
def test_tp_chain_equals_one_process(interleave):
    kw = dict(h=64, ffn=32, tokens=16, layers=3, micro_batches=2)
    ref = lo.tp_chain_reference(**kw)
    run = launch(lo.tp_chain_worker, interleave=interleave, world_size=2, quiet=True, **kw)
    for r in range(2):
        assert max((a - b).abs().max().item() for a, b in zip(run.results[r]["out"], ref)) < 1e-12
    assert run.count("all_reduce") == 3 * 2
    computes = [s for s in run.spans[0] if s.name == "compute"]
    assert len(computes) == 6


# ---- what data parallelism buys (P.6) ---------------------------------------------------------

def test_throughput_worker_memory_per_replica_is_unchanged():
    sizes = (8, 32, 32, 1)
    runs = {n: launch(dps.throughput_worker, 32, sizes, steps=1, warmup=0, world_size=n, quiet=True, record=False)
            for n in (1, 2)}
    n_params = runs[1].results[0]["n_params"]
    calc = memory.per_device_bytes(n_params, 1, 0, precision="fp32", optimizer="adamw")
    for n, run in runs.items():
        for r in run.results:
            assert r["rows"] == 32 // n and r["world"] == n
            held = r["held"]
            assert (held["weights"], held["gradients"], held["moments"]) == (calc["weights"], calc["gradients"], calc["moments"])


def test_accumulation_equals_one_big_batch():
    acc = launch(dp.accumulation_worker, micro_batches=3, world_size=2, quiet=True)
    big = dps.big_batch_gradient(micro_batches=3, world=2)
    assert (acc.results[0] - big).abs().max().item() < 1e-12


def test_train_epochs_counts_steps_and_reports_divergence():
    small = dps.train_epochs(16, 0.05, epochs=2, n=64)
    assert small["steps"] == 8 and len(small["losses"]) == 2 and all(math.isfinite(x) for x in small["losses"])
    blown = dps.train_epochs(64, 100.0, epochs=3, n=64)["losses"]
    assert blown[-1] > 1e6 * small["losses"][-1]  # a learning rate far too large for the batch


def test_busy_together_counts_the_union_once():
    from helpers.launcher.commlog import Span

    spans = [Span("compute", 0, 4), Span("compute", 6, 8), Span("all-reduce", 3, 7), Span("all-reduce", 3.5, 5)]
    assert lo.busy_together(spans) == pytest.approx(1 + 1)  # [3, 4] and [6, 7]
    assert lo.busy_together(spans, "compute", "wait") == 0


# ---- P.6's exercises 4 and 5 ------------------------------------------------------------------

def test_exercise_checks_accept_the_answer_and_name_what_is_wrong(capsys):
    from helpers.course.exercises import NotAnswered, p06

    p06.ex4(350)
    with pytest.raises(AssertionError, match="off by more than"):
        p06.ex4(550)  # compute + comm: no overlap at all
    with pytest.raises(NotAnswered):
        p06.ex5(None)
    right = launch(ov.hand_ddp_worker, 300, world_size=2, quiet=True)  # any cap in 265..520 gives 3 buckets
    p06.ex5(right)
    assert "3 all-reduces per step on both ranks with 300-byte buckets" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="issued 2 all-reduces, not 3"):
        p06.ex5(launch(ov.hand_ddp_worker, 4096, world_size=2, quiet=True))
    with pytest.raises(AssertionError, match="not its results"):
        p06.ex5(right.results)
    with pytest.raises(AssertionError, match="asks for 2 ranks"):
        p06.ex5(launch(ov.hand_ddp_worker, 300, world_size=4, quiet=True))
