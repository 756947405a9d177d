"""Exercise checks for P.1 (work and span)."""
import math

import numpy as np

from . import check_number, check_true, require
from ..dag import DAG, embedding_job, embedding_reference, list_schedule


def ex1(answer):
    """T1/T_inf of the embedding job with 300 chunks (other durations unchanged)."""
    g = embedding_job(n_chunks=300)
    check_number(answer, g.parallelism(), what="the bound T1/T_inf for 300 chunks",
                 hint="Work grows with the number of chunks; does the longest chain?")


def _sharded_index_job() -> DAG:
    g = embedding_job()
    durations = {t: d for t, d in g.durations.items() if t != "index"}
    durations.update({f"shard[{s}]": 5.0 for s in range(4)}, combine=2.0)
    edges = [(u, v) for u, v in g.edges if v != "index"]
    edges += [("merge", f"shard[{s}]") for s in range(4)] + [(f"shard[{s}]", "combine") for s in range(4)]
    return DAG(durations, edges)


def ex2(answer):
    """Makespan on 8 workers once the 20 s index build is split into 4 shards of 5 s plus a 2 s combine."""
    check_number(answer, list_schedule(_sharded_index_job(), 8).makespan,
                 what="the 8-worker makespan of the job with a sharded index build (in seconds)",
                 hint="Each shard needs the merge, the combine needs every shard; build the DAG and schedule it.")


def ex3(results):
    """``results`` = run.results of a 3-rank launch; each rank returns (index or None, chunks it embedded)."""
    require(results, "run.results of your 3-rank launch")
    check_true(isinstance(results, (list, tuple)) and len(results) == 3
               and all(isinstance(r, (list, tuple)) and len(r) == 2 for r in results),
               what="run.results has 3 entries, each a pair (index or None, number of chunks embedded)",
               hint="Launch with world_size=3 and return a pair from every rank.")
    counts = [int(r[1]) for r in results]
    check_true(sum(counts) == 100 and max(counts) == math.ceil(100 / 3),
               what="the ranks embedded all 100 chunks between them, none more than it had to",
               hint="Split range(100) so that the per-rank counts differ by at most one.")
    idx = results[0][0]
    check_true(idx is not None and np.array_equal(np.asarray(idx), embedding_reference(100)),
               what="rank 0's index equals the serial job's index",
               hint="Gather every rank's {task: vector} dict on rank 0, then call embedding_task for merge and index.")
