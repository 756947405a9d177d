"""One Chrome/Perfetto trace of every rank: the launcher's ``profile=True`` (P.6 onwards, P.14's hang).

Each rank records its job with ``torch.profiler`` and writes its own Chrome trace; the profiler's
clock differs from process to process, so each rank also notes the wall clock at the start of its
``helpers:job`` range. :func:`merge_rank_traces` shifts every rank's events onto that common
clock, puts rank ``r`` in process row ``r`` named ``"rank r"``, and writes one JSON file that
``chrome://tracing`` and https://ui.perfetto.dev open (the collectives show as ``c10d::allreduce_``
on the rank's thread and as ``gloo:all_reduce`` on gloo's). The notebooks that draw timelines
keep theirs with :func:`keep` and check them with :func:`check_ranks` (calls per rank by name,
:func:`events_per_rank`).
"""
from __future__ import annotations

import json
import os
import shutil

from ..validate import integer_at_least

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


def _events(trace_path: str) -> list[dict]:
    with open(trace_path) as f:
        return [e for e in json.load(f).get("traceEvents", []) if isinstance(e, dict)]


def events_per_rank(trace_path: str, names) -> dict[int, dict[str, int]]:
    """How many times each rank ran each of ``names`` (ranges or ops) in a merged trace.

    Counts complete events (``"ph": "X"``) once per call: an event inside another of the same name
    on the same thread is not counted again (the profiler records a c10d op such as
    ``c10d::send`` at two levels of the dispatcher, so each call shows twice, nested). Every rank
    with a row in the trace is a key; a name it never ran counts 0. The c10d names
    (``c10d::allreduce_``, ``c10d::send``, ``c10d::recv_``, ``c10d::barrier``, ...) are the same on
    every backend; ``gloo:all_reduce``-style names are the backend's own.
    """
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names must be a list of event names (strings), got {names!r}")
    names = list(names)
    events = _events(trace_path)
    rows = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    counts = {r: dict.fromkeys(names, 0) for r in sorted(rows)}
    wanted = set(names)
    calls: dict[tuple, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("name") in wanted:
            start = float(e.get("ts", 0.0))
            calls.setdefault((e["pid"], e.get("tid"), e["name"]), []).append((start, start + float(e.get("dur", 0.0))))
    for (rank, _, name), spans in calls.items():
        outer_end = float("-inf")
        for start, end in sorted(spans, key=lambda se: (se[0], -se[1])):  # outer ones first
            if end <= outer_end:  # inside the previous call of the same name: the same call
                continue
            outer_end = end
            counts.setdefault(rank, dict.fromkeys(names, 0))[name] += 1
    return counts


def check_ranks(trace_path: str, world_size: int, names) -> dict[int, dict[str, int]]:
    """:func:`events_per_rank` of ``names``, after checking that the merged trace has the row
    ``"rank r"`` of every rank r < ``world_size`` and that each rank ran every name at least once.

    ValueError naming the rank and what it lacks otherwise.
    """
    integer_at_least(world_size, "world_size")
    counts = events_per_rank(trace_path, names)
    missing_rows = [r for r in range(world_size) if r not in counts]
    if missing_rows:
        raise ValueError(f"the trace {trace_path} has no row for rank(s) {missing_rows} of {world_size}")
    for r in range(world_size):
        lacking = [n for n in counts[r] if counts[r][n] == 0]
        if lacking:
            raise ValueError(f"rank {r}'s row of the trace {trace_path} has no {', '.join(map(repr, lacking))} event")
    return counts


TRACES_ENV = "WORKBOOK_TRACES"  # a folder for kept traces (the suite points it outside the checkout)
DEFAULT_FOLDER = ".traces"  # beside the notebook, hidden: not in a student's file list


def traces_folder() -> str:
    """Where :func:`keep` puts a trace given by name: ``$WORKBOOK_TRACES`` if set, else
    ``.traces`` in the kernel's working folder (beside the notebook). JupyterLab's file browser does
    not list a hidden folder, and ``jupyter_config/common`` lets the server serve it, so the link
    :func:`link` shows still opens the file."""
    return os.environ.get(TRACES_ENV) or DEFAULT_FOLDER


def keep(trace_path: str, dest: str | os.PathLike) -> str:
    """Move a merged trace to ``dest`` and return where it went, as a string (a file already there
    is replaced). A bare file name (``"p07_ring.json"``) goes into :func:`traces_folder`, which is
    created; a path with a folder is used as given. The kernel's own launcher folder, where the
    launcher writes the trace, vanishes when the kernel exits."""
    dest = os.fspath(dest)
    if not dest.endswith(".json"):
        raise ValueError(f"dest must be a .json file path (Perfetto and chrome://tracing open JSON traces), got {dest!r}")
    if not os.path.dirname(dest):
        dest = os.path.join(traces_folder(), dest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.move(os.fspath(trace_path), dest)
    return dest


def spans(trace_path: str, name: str) -> dict[int, list[tuple[float, float]]]:
    """(start, end) in seconds from the trace's time 0 of every range or op ``name``, per rank,
    in order of start (every record: nested ones too)."""
    out: dict[int, list[tuple[float, float]]] = {}
    for e in _events(trace_path):
        if e.get("ph") == "X" and e.get("name") == name:
            start = float(e.get("ts", 0.0)) / 1e6
            out.setdefault(e["pid"], []).append((start, start + float(e.get("dur", 0.0)) / 1e6))
    return {r: sorted(v) for r, v in sorted(out.items())}


HOW_TO_OPEN = "save it and drag it into https://ui.perfetto.dev or chrome://tracing to open it"


def link(trace_path: str):
    """A clickable link to a kept trace for a notebook (an IPython ``FileLink``) that says how to
    open it. Its text form is the path as given, not ``FileLink``'s absolute one, so a stored
    notebook output holds no folder of the machine that ran it."""
    from IPython.display import FileLink

    class TraceLink(FileLink):
        def __repr__(self):
            return f"{self.path} ({HOW_TO_OPEN})"

    return TraceLink(trace_path, result_html_prefix=f"The trace of the ranks ({HOW_TO_OPEN}): ")
