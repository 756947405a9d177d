"""helpers.launcher.traces beyond the merge (issue 17, point 4): calls per rank by name, the rank check, keeping
a trace beside a notebook. The merge itself is tested with the launcher (test_launcher_faults.py)."""
import json

import pytest

from helpers import traces
from helpers.launcher import launch


def _write(path, events, ranks):
    rows = [{"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}} for r in ranks]
    path.write_text(json.dumps({"traceEvents": rows + events}))
    return str(path)


def _x(rank, name, ts, dur, tid=1):
    return {"ph": "X", "name": name, "pid": rank, "tid": tid, "ts": ts, "dur": dur}


@pytest.fixture
def trace(tmp_path):
    events = [
        # rank 0: two sends, each recorded at two dispatcher levels (nested), one barrier
        _x(0, "c10d::send", 0, 10), _x(0, "c10d::send", 1, 8),
        _x(0, "c10d::send", 20, 5), _x(0, "c10d::send", 20, 5),   # same start and end: still one call
        _x(0, "c10d::barrier", 30, 4),
        # rank 1: a send on another thread overlapping one on its own thread is another call
        _x(1, "c10d::send", 0, 10, tid=1), _x(1, "c10d::send", 2, 3, tid=2),
        _x(1, "c10d::send", 10, 1),                                  # starts as the first ends
        {"ph": "i", "name": "c10d::barrier", "pid": 1, "tid": 1, "ts": 3},  # an instant: not a call
    ]
    return _write(tmp_path / "t.json", events, [0, 1])


def test_events_per_rank_counts_calls_not_nested_records(trace):
    assert traces.events_per_rank(trace, ["c10d::send", "c10d::barrier", "gloo:send"]) == {
        0: {"c10d::send": 2, "c10d::barrier": 1, "gloo:send": 0},
        1: {"c10d::send": 3, "c10d::barrier": 0, "gloo:send": 0},
    }


def test_spans_are_seconds_from_time_zero_in_order_of_start(trace):
    assert traces.spans(trace, "c10d::barrier") == {0: [pytest.approx((30e-6, 34e-6), rel=1e-12)]}
    sends = traces.spans(trace, "c10d::send")
    assert sorted(sends) == [0, 1] and len(sends[0]) == 4
    assert [pytest.approx(se, rel=1e-12) for se in [(0.0, 10e-6), (2e-6, 5e-6), (10e-6, 11e-6)]] == sends[1]


def test_check_ranks_names_the_rank_and_what_it_lacks(trace):
    assert traces.check_ranks(trace, 2, ["c10d::send"]) == {0: {"c10d::send": 2}, 1: {"c10d::send": 3}}
    with pytest.raises(ValueError, match=r"rank 1's row .* has no 'c10d::barrier' event"):
        traces.check_ranks(trace, 2, ["c10d::send", "c10d::barrier"])
    with pytest.raises(ValueError, match=r"no row for rank\(s\) \[2, 3\] of 4"):
        traces.check_ranks(trace, 4, ["c10d::send"])
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        traces.check_ranks(trace, 0, ["c10d::send"])
    with pytest.raises(TypeError, match="names must be a list of event names"):
        traces.events_per_rank(trace, "c10d::send")


def test_keep_moves_the_trace_into_a_new_folder_and_replaces_an_old_one(tmp_path, trace):
    dest = tmp_path / "traces" / "p07_ring.json"
    dest.parent.mkdir()
    dest.write_text("old")
    assert traces.keep(trace, dest) == str(dest)
    assert json.loads(dest.read_text())["traceEvents"][0]["args"] == {"name": "rank 0"}
    assert not (tmp_path / "t.json").exists()
    with pytest.raises(ValueError, match="dest must be a .json file path"):
        traces.keep(dest, tmp_path / "trace.txt")


def _ring_and_barrier():
    import torch
    import torch.distributed as dist

    from helpers.collectives import ring_all_reduce

    ring_all_reduce(torch.ones(64) * dist.get_rank())
    dist.barrier()


def test_counts_from_a_real_trace_equal_the_communication_log(tmp_path):
    run = launch(_ring_and_barrier, world_size=2, quiet=True, profile=tmp_path)
    names = {"send": "c10d::send", "recv": "c10d::recv_", "barrier": "c10d::barrier"}
    counts = traces.check_ranks(run.trace_path, 2, list(names.values()) + ["reduce-scatter", "all-gather"])
    for r in range(2):
        assert {op: counts[r][name] for op, name in names.items()} == {op: run.count(op, r) for op in names}
        assert counts[r]["c10d::send"] == 2 and counts[r]["reduce-scatter"] == counts[r]["all-gather"] == 1


def test_link_is_clickable_says_how_to_open_and_stores_no_absolute_path(tmp_path, monkeypatch, trace):
    monkeypatch.chdir(tmp_path)
    kept = traces.keep(trace, "traces/x_ring.json")
    shown = traces.link(kept)
    assert "<a href='traces/x_ring.json'" in shown._repr_html_() and "https://ui.perfetto.dev" in shown._repr_html_()
    assert repr(shown).startswith("traces/x_ring.json (") and str(tmp_path) not in repr(shown)


def test_keep_puts_a_bare_name_in_the_traces_folder(tmp_path, trace, monkeypatch):
    monkeypatch.setenv("WORKBOOK_TRACES", str(tmp_path / "kept"))
    assert traces.keep(trace, "p07_ring.json") == str(tmp_path / "kept" / "p07_ring.json")
    assert (tmp_path / "kept" / "p07_ring.json").is_file()
    monkeypatch.delenv("WORKBOOK_TRACES")
    monkeypatch.chdir(tmp_path)
    assert traces.traces_folder() == ".traces"  # hidden beside the notebook: not in the file list
