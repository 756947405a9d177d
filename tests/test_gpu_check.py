"""benchmarks/gpu_check.py on CPU ranks (its --cpu-dry-run), and the hand pipeline without message tags.

NCCL ignores the tags of send/recv and matches messages in the order they were issued between
two ranks; gloo honours tags. The pipeline must therefore be right with every tag equal.
"""
import importlib.util
import sys
from pathlib import Path

import pytest

from helpers import pipeline_parallel as ppl
from helpers import pipeline_schedule as ps
from helpers.launcher import launch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_check():
    import cloudpickle

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # its rank function travels by value, as from the script
    yield module
    cloudpickle.unregister_pickle_by_value(module)
    del sys.modules["gpu_check"]


def test_the_device_selection(gpu_check):
    assert gpu_check.select(False, gpus=0) is None
    assert gpu_check.select(False, gpus=8) == ("nccl", 8)
    assert gpu_check.select(True, gpus=8) == ("gloo", 4)
    assert gpu_check.largest_fitting(8, (2, 4)) == 4 and gpu_check.largest_fitting(1, (2, 4)) is None


def test_without_cuda_it_says_so_and_exits_non_zero(gpu_check, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    assert "no CUDA device visible" in capsys.readouterr().out


def test_every_demo_passes_on_four_cpu_ranks(gpu_check):
    rows = gpu_check.run_demos("gloo", 4)
    assert [r["name"] for r in rows] == list(gpu_check.DEMOS)
    assert all(r["ok"] for r in rows), [gpu_check.format_row(r) for r in rows]
    assert all(r["ranks"] >= 2 and 0 <= r["err"] <= r["tol"] for r in rows)


def test_a_failing_demo_is_a_fail_line_not_a_crash(gpu_check, monkeypatch):
    def broken(backend, n):
        raise RuntimeError("NCCL error: unhandled system error")

    monkeypatch.setitem(gpu_check.DEMOS, "broken", broken)
    monkeypatch.setitem(gpu_check.DEMOS, "inexact", lambda backend, n: (n, 1e-3, 1e-9))
    rows = gpu_check.run_demos("gloo", 4, names=["broken", "inexact"])
    assert [(r["name"], r["ok"]) for r in rows] == [("broken", False), ("inexact", False)]
    assert gpu_check.format_row(rows[0]).startswith("FAIL  broken") and "RuntimeError: NCCL error" in rows[0]["error"]
    assert "max_err=1.0e-03 (tol 1e-09)" in gpu_check.format_row(rows[1])


def test_on_one_gpu_the_demos_that_need_two_are_skipped_not_failed(gpu_check):
    rows = gpu_check.run_demos("nccl", 1, names=["ZeRO-3 by hand and FSDP2", "3D (DP x PP x TP)"])
    assert all(r["ok"] and r["skipped"] == "needs 2 devices or more, 1 found" for r in rows), rows
    assert gpu_check.format_row(rows[0]).startswith("SKIP  ZeRO-3")


def test_the_bandwidth_table_recovers_a_known_alpha_beta_model(gpu_check, monkeypatch):
    n, alpha, beta = 4, 20e-6, 50e9
    sizes = [2 ** k for k in range(16, 27, 2)]

    class FakeRun:  # what launch() would bring back from 4 ranks timing the model exactly
        results = [{s: alpha * 2 * (n - 1) + 2 * (n - 1) / n * s / beta for s in sizes}] * n

    monkeypatch.setattr(gpu_check, "launch", lambda *a, **k: FakeRun())
    rows = gpu_check.bandwidth_table("nccl", n, sizes)
    assert rows[0]["alpha"] == pytest.approx(alpha, rel=1e-6) and rows[0]["beta"] == pytest.approx(beta, rel=1e-6)
    for row in rows:
        assert row["model_seconds"] == pytest.approx(row["seconds"], rel=1e-6)
        assert row["bus_GBps"] == pytest.approx(2 * (n - 1) / n * row["bytes"] / row["seconds"] / 1e9)


def test_the_timing_worker_runs_on_the_ranks(gpu_check):
    run = launch(gpu_check.allreduce_times_worker, [1024, 65536], 2, world_size=2, quiet=True)
    assert all(set(r) == {1024, 65536} and all(t > 0 for t in r.values()) for r in run.results)


# ---- the pipeline does not need tags ----------------------------------------------------------------

def _channels(schedule, p, m, v):
    """Per (sender, receiver): the messages in the order the sender issues its sends, and in the
    order the receiver issues its receives (derived here from the schedule, not from the worker)."""
    V = p * v
    sent, received = {}, {}
    for d, order in enumerate(ps.op_orders(schedule, p, m, v)):
        for kind, c, j in order:
            s = c * p + d
            if kind == "F":
                if s > 0:
                    received.setdefault(((s - 1) % p, d), []).append(("activation", s, j))
                if s < V - 1:
                    sent.setdefault((d, (s + 1) % p), []).append(("activation", s + 1, j))
            elif kind == "B":
                if s < V - 1:
                    received.setdefault(((s + 1) % p, d), []).append(("gradient", s, j))
                if s > 0:
                    sent.setdefault((d, (s - 1) % p), []).append(("gradient", s - 1, j))
    return sent, received


def test_every_schedule_receives_in_the_order_it_sends():
    checked = 0
    for schedule, vs in (("gpipe", (1,)), ("1f1b", (1,)), ("zb-h1", (1,)), ("interleaved", (2, 3))):
        for p in range(2, 7):
            for m in range(1, 13):
                for v in vs:
                    try:
                        sent, received = _channels(schedule, p, m, v)
                    except ValueError:  # not a combination the schedule allows
                        continue
                    assert sent == received, (schedule, p, m, v)
                    checked += 1
    assert checked > 150


def _pipeline(schedule, m, v, tagged=True, swap_first_forwards=False):
    """The hand pipeline, optionally with every tag 0 (NCCL's matching) and optionally with the
    last rank running its first two forwards in the other order."""
    import torch.distributed as dist

    from helpers import pipeline_parallel as pp
    from helpers import pipeline_schedule as sched

    saved = pp._tag, pp.op_orders
    if not tagged:
        pp._tag = lambda *a: 0
    if swap_first_forwards:
        def orders(*a):
            out = sched.op_orders(*a)
            last = out[dist.get_world_size() - 1]
            i, k = [n for n, op in enumerate(last) if op[0] == "F"][:2]
            last[i], last[k] = last[k], last[i]
            return out

        pp.op_orders = orders
    try:
        return pp.pipeline_step_worker(schedule, m, v)
    finally:
        pp._tag, pp.op_orders = saved


@pytest.mark.parametrize("schedule,m,v", [("1f1b", 8, 1), ("interleaved", 4, 2), ("zb-h1", 4, 1)])
def test_the_pipeline_is_exact_with_every_tag_equal(schedule, m, v):
    ref, _ = ppl.reference_grads()
    run = launch(_pipeline, schedule, m, v, False, world_size=2, quiet=True)
    assert ppl.max_grad_diff(ppl.gather_grads(run.results), ref) < 1e-12


def test_untagged_matching_catches_a_schedule_that_receives_out_of_order():
    ref, _ = ppl.reference_grads()
    tagged = launch(_pipeline, "gpipe", 4, 1, True, True, world_size=2, quiet=True)
    untagged = launch(_pipeline, "gpipe", 4, 1, False, True, world_size=2, quiet=True)
    assert ppl.max_grad_diff(ppl.gather_grads(tagged.results), ref) < 1e-12  # tags hide the disorder
    assert ppl.max_grad_diff(ppl.gather_grads(untagged.results), ref) > 1e-6  # NCCL's matching would not
