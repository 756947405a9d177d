"""One Chrome/Perfetto trace of every rank: the launcher's ``profile=True`` (P.6 onwards, P.14's hang).

Each rank records its job with ``torch.profiler`` and writes its own Chrome trace; the profiler's
clock differs from process to process, so each rank also notes the wall clock at the start of its
``helpers:job`` range. :func:`merge_rank_traces` shifts every rank's events onto that common
clock, puts rank ``r`` in process row ``r`` named ``"rank r"``, and writes one JSON file that
``chrome://tracing`` and https://ui.perfetto.dev open (the collectives show as ``c10d::allreduce_``
on the rank's thread and as ``gloo:all_reduce`` on gloo's).
"""
from __future__ import annotations

import json
import os

JOB_RANGE = "helpers:job"  # the range each rank opens around the worker function


def merge_rank_traces(parts: dict[int, tuple[str, float]], out_path: str, remove_parts: bool = True) -> dict:
    """Merge ``{rank: (path of its Chrome trace, wall clock in µs at its job range's start)}``.

    Writes ``out_path`` and returns ``{rank: number of events}``. Time 0 is the earliest event of
    any rank. ValueError when a rank's trace lacks the job range.
    """
    events, counts = [], {}
    loaded = {}
    for r, (path, wall_us) in sorted(parts.items()):
        with open(path) as f:
            trace = json.load(f)
        evs = [e for e in trace.get("traceEvents", []) if isinstance(e, dict)]
        job = next((e for e in evs if e.get("name") == JOB_RANGE and e.get("ph") == "X"), None)
        if job is None:
            raise ValueError(f"rank {r}'s trace {path} has no {JOB_RANGE!r} range: not written by the launcher")
        loaded[r] = (evs, wall_us - float(job["ts"]))  # profiler clock -> wall clock, µs
    t0 = min(float(e["ts"]) + shift for evs, shift in loaded.values() for e in evs
             if isinstance(e.get("pid"), int) and e.get("ph") != "M" and isinstance(e.get("ts"), (int, float)))
    for r, (evs, shift) in loaded.items():
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        n = 0
        for e in evs:
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_labels", "process_sort_index"):
                continue
            if not isinstance(e.get("pid"), int):  # the profiler's own bookkeeping rows
                continue
            e = dict(e, pid=r)
            if e.get("ph") == "M":
                e.pop("ts", None)  # metadata (thread names) needs no time
            elif "ts" in e:
                e["ts"] = round(float(e["ts"]) + shift - t0, 3)
            events.append(e)
            n += e.get("ph") != "M"
        counts[r] = n
    with open(out_path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    if remove_parts:
        for path, _ in parts.values():
            os.remove(path)
    return counts


def durations(trace_path: str, name: str) -> dict[int, list[float]]:
    """Seconds each occurrence of the range ``name`` lasted, per rank, in a merged trace."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    out: dict[int, list[float]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("name") == name:
            out.setdefault(e["pid"], []).append(float(e.get("dur", 0.0)) / 1e6)
    return out
