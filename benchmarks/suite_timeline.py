"""Where the suite's wall time goes, from a timeline the root conftest.py writes.

    WORKBOOK_TEST_TIMELINE=/tmp/t.jsonl ./workbook test
    python benchmarks/suite_timeline.py /tmp/t.jsonl

Prints, per pytest worker, when it started and ended and how long it was busy; the files that
took longest (the sum of their tests' times, which run on one worker under --dist loadfile) with
their worker and span; and the run's span from the first test's start to the last test's end.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str, top: int = 15) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if not rows:
        print(f"{path}: no tests recorded")
        return
    t0 = min(r["start"] for r in rows)
    workers = defaultdict(list)
    files = defaultdict(list)
    for r in rows:
        workers[r["worker"]].append(r)
        files[r["id"].split("::")[0]].append(r)
    print(f"tests: {len(rows)}, span {max(r['end'] for r in rows) - t0:.0f} s from the first test's start")
    for w, rs in sorted(workers.items()):
        busy = sum(r["end"] - r["start"] for r in rs)
        print(f"  {w:6s} {min(r['start'] for r in rs) - t0:6.0f} -> {max(r['end'] for r in rs) - t0:6.0f} s, "
              f"busy {busy:6.0f} s, {len(rs)} tests")
    print("longest files (sum of their tests), worker, start -> end:")
    for f, rs in sorted(files.items(), key=lambda kv: -sum(r["end"] - r["start"] for r in kv[1]))[:top]:
        print(f"  {sum(r['end'] - r['start'] for r in rs):6.1f} s  {rs[0]['worker']:5s} "
              f"{min(r['start'] for r in rs) - t0:5.0f} -> {max(r['end'] for r in rs) - t0:5.0f}  {f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/suite_timeline.py TIMELINE.jsonl")
    main(sys.argv[1])
