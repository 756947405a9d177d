"""helpers.fake_world.memo: each fake-world configuration traced once per test run (issue 23).

Each test points ``WORKBOOK_FAKE_WORLD_MEMO`` at its own folder (the suite's run-wide one is set
by the root conftest.py) and replaces the tracing (``_run_plan``) by a counter, so that what is
traced and what is answered from the folder can be told apart.
"""
import os
from dataclasses import asdict

import pytest

from helpers import fake_world as fw
from helpers.fake_world import memo
from helpers.planner import Layout, Model

TINY = Model("tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
LAY = Layout(dp=2, zero=3)


def _stand_in(model, layout, stages, plan, options, timing=True, progress=None):
    """What a trace returns, made up at once from the plan (these tests are about what is traced and
    what is kept, not about the figures; the first test traces for real)."""
    zero = {"total": plan.layers, "parameters": plan.micro_batches}
    return {"coords": {"dp": 0}, "layer_counts": (plan.layers,), "warmups": plan.warmups[:1], "memory": zero, "held": zero, "comm": [],
            "flops": float(plan.passes), "per_layer": None, "per_layer_comm": None, "timing": None,
            "reserve": {"peak_reserved": 1}}


@pytest.fixture
def traced(monkeypatch, tmp_path):
    """The folder, and the list of calls that traced (with a stand-in for the trace unless ``real``)."""
    monkeypatch.setenv(memo.ENV, str(tmp_path / "memo"))
    calls, real_trace = _Calls(), fw._run_plan

    def counting(*args, **kwargs):
        calls.append(args[3])  # the TracePlan
        return (real_trace if calls.real else _stand_in)(*args, **kwargs)

    monkeypatch.setattr(fw, "_run_plan", counting)
    return tmp_path / "memo", calls


class _Calls(list):
    real = False  # True: trace for real


def _figures(step):
    d = asdict(step)
    d.pop("wall_s")
    return d


def test_a_call_made_before_is_answered_from_the_folder(traced):
    where, calls = traced
    calls.real = True  # a real FakeStep, kept and read back whole
    first = fw.simulate(TINY, LAY, micro_batches=2, timing=False)
    assert len(calls) == 1 and len(list(where.glob("*.pkl"))) == 1
    again = fw.simulate(TINY, LAY, micro_batches=2, timing=False)
    assert len(calls) == 1, "the same call traced again"
    assert _figures(again) == _figures(first) and again.wall_s == first.wall_s
    # an equal call spelled otherwise is the same configuration: 2 micro-batches from a global batch
    fw.simulate(TINY, LAY, global_batch=4, timing=False)
    assert len(calls) == 1


def test_every_argument_that_changes_the_trace_misses(traced):
    where, calls = traced
    fw.simulate(TINY, LAY, micro_batches=2, timing=False)
    variants = [dict(micro_batches=3), dict(rank=1), dict(timing=True), dict(reduce_dtype="bfloat16"),
                dict(reshard_after_forward="always"), dict(loss_dtype="bfloat16"), dict(optimizer="foreach"),
                dict(dropout=True)]
    for kw in variants:
        fw.simulate(TINY, LAY, **{"micro_batches": 2, "timing": False, **kw})
    fw.simulate(TINY, Layout(dp=2, zero=2), micro_batches=2, timing=False)
    fw.simulate(TINY.__class__(**{**TINY.__dict__, "ffn": 256}), LAY, micro_batches=2, timing=False)
    assert len(calls) == 1 + len(variants) + 2
    assert len(list(where.glob("*.pkl"))) == len(calls)


def test_a_call_with_progress_always_traces_and_keeps_its_result(traced):
    where, calls = traced
    calls.real = True  # its progress lines come from the trace
    lines = []
    fw.simulate(TINY, LAY, micro_batches=2, timing=False, progress=lines.append)
    fw.simulate(TINY, LAY, micro_batches=2, timing=False, progress=lines.append)
    assert len(calls) == 2 and lines, "a call with progress was answered without tracing"
    fw.simulate(TINY, LAY, micro_batches=2, timing=False)  # kept by the calls above
    assert len(calls) == 2


def test_a_change_to_the_code_misses(traced, monkeypatch):
    _, calls = traced
    fw.simulate(TINY, LAY, micro_batches=2, timing=False)
    monkeypatch.setattr(memo, "_CODE", ["another version of helpers"])
    fw.simulate(TINY, LAY, micro_batches=2, timing=False)
    assert len(calls) == 2


def test_the_fingerprint_reads_every_module_of_helpers(tmp_path):
    """An edit to any module (a planted mutant in the planner, say) changes the fingerprint: a copy
    of helpers/ fingerprints as helpers/ does, and not once one byte of a module deep inside differs."""
    import shutil

    here = memo.Path(memo.__file__).resolve().parents[1]
    copy = tmp_path / "helpers"
    shutil.copytree(here, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert memo.code_fingerprint(copy) == memo.code_fingerprint()
    costs = copy / "planner" / "assess.py"
    costs.write_bytes(costs.read_bytes() + b"\n# a mutant\n")
    assert memo.code_fingerprint(copy) != memo.code_fingerprint()


def test_an_unreadable_entry_is_traced_again_and_no_temporary_file_stays(traced):
    where, calls = traced
    fw.simulate(TINY, LAY, micro_batches=2, timing=False)
    (entry,) = where.glob("*.pkl")
    entry.write_bytes(entry.read_bytes()[:100])  # cut short, as by a crash mid-write without the rename
    fw.simulate(TINY, LAY, micro_batches=2, timing=False)
    assert len(calls) == 2
    assert sorted(p.name for p in where.iterdir()) == [entry.name]  # rewritten whole; no .tmp left


def test_refusals_are_raised_before_the_folder_is_asked(traced):
    where, calls = traced
    with pytest.raises(ValueError, match="cannot fill PP = 2"):
        fw.simulate(TINY, Layout(dp=1, pp=2), micro_batches=1)
    assert calls == [] and not where.exists()


def test_without_the_variable_nothing_is_kept(monkeypatch, tmp_path):
    monkeypatch.delenv(memo.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert memo.folder() is None and memo.load("anything") is None
    memo.store("anything", 1)
    fw.simulate(TINY, LAY, micro_batches=2, timing=False)
    assert os.listdir(tmp_path) == []
