"""Exercise checks for P.1 (work and span)."""
import numpy as np

from ...dag import DAG, embedding_job, embedding_reference, list_schedule
from . import check_number, check_run, check_true, exercise, reject


@exercise
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


@exercise
def ex2(answer):
    """Makespan on 8 workers once the 20 s index build is split into 4 shards of 5 s plus a 2 s combine."""
    check_number(answer, list_schedule(_sharded_index_job(), 8).makespan,
                 what="the 8-worker makespan of the job with a sharded index build (in seconds)",
                 hint="Each shard needs the merge, the combine needs every shard; build the DAG and schedule it.")


@exercise
def ex3(run):
    """The embedding job on 3 ranks with a block split: every rank returns (index or None, the chunks it embedded)."""
    check_run(run, 3, ops={"gather": 1}, hint="Rank 0 collects every rank's vectors with dist.gather_object.")
    results = run.results
    if not all(isinstance(r, (list, tuple)) and len(r) == 2 for r in results):
        reject("every rank must return a pair (index or None, the chunk numbers it embedded)")
    try:
        chunks = [sorted(int(c) for c in r[1]) for r in results]
    except (TypeError, ValueError):
        reject("the second item of each rank's pair must be the list of chunk numbers it embedded")
    if sorted(c for cs in chunks for c in cs) != list(range(100)):
        reject("between them the ranks must embed each of the chunks 0..99 exactly once")
    for r, cs in enumerate(chunks):
        if not cs:
            reject(f"rank {r} embedded no chunks; every rank takes a block")
        if cs[-1] - cs[0] + 1 != len(cs):
            reject(f"rank {r}'s chunks are not one contiguous range: the exercise asks for a block split, "
                   "not a round-robin one", "Give each rank one unbroken range of chunk numbers.")
    if max(map(len, chunks)) - min(map(len, chunks)) > 1:
        reject(f"the blocks hold {[len(c) for c in chunks]} chunks; their lengths may differ by at most one")
    idx = results[0][0]
    check_true(idx is not None and np.array_equal(np.asarray(idx), embedding_reference(100)),
               what="a block split on 3 ranks, and rank 0's index equals the serial job's index",
               hint="Gather every rank's {task: vector} dict on rank 0, then call embedding_task for merge and index.")
