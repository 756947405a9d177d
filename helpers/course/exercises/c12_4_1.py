"""Exercise checks for 12.4.1 (rules of thumb for choosing a mix)."""
from ...costs import ring_bytes_sent
from ...memory import GB, per_device_bytes
from ...moe_numpy import dispatch_counts, reference
from ...pipeline_schedule import bubble_formula
from . import check_number, check_pipeline_order, check_run, check_true, exercise, reject, require


@exercise
def ex1(answer):
    """12.4.1's bubble (p-1)/m at p = 16, m = 64."""
    check_number(answer, float(bubble_formula(16, 64, definition="useful")), what="the bubble ratio (p-1)/m",
                 hint="Idle time over useful time, the section's definition.")


@exercise
def ex2(answer):
    """Optimizer-state GB per GPU of the 70B with TP=8 and ZeRO-1 over DP=32 (FP32 master + 2 moments)."""
    b = per_device_bytes(70e9 / 8, 32, 1)
    check_number(answer, (b["master"] + b["moments"]) / GB, what="the optimizer state per GPU in GB",
                 hint="A GPU's TP shard holds 1/8 of the parameters; ZeRO-1 splits its 12 bytes per parameter 32 ways.")


@exercise
def ex3(answer):
    """GB each GPU sends per step in the reduce-scatter + all-gather of the 70B's BF16 gradients (TP=8, DP=32)."""
    shard = 70e9 / 8 * 2
    sent = ring_bytes_sent("reduce_scatter", shard, 32) + ring_bytes_sent("all_gather", shard, 32)
    check_number(answer, sent / GB, what="the bytes each GPU sends per step, in GB",
                 hint="A ring reduce-scatter and a ring all-gather each send (d-1)/d of the GPU's own gradient bytes.")


@exercise
def ex4(run, reference):
    """The tiny transformer on 8 ranks as DP2 x PP4 x TP1 with GPipe and 2 micro-batches, for the reference's
    steps: the layout, every rank's F/B order, and losses and parameters equal to single-process training."""
    from ...three_d import global_losses, max_param_diff

    check_run(run, 8, hint="td.three_d_worker takes the layout as its dp, pp and tp degrees, whose product is "
                            "the number of ranks to launch, and the schedule and number of steps to train.")
    results = run.results
    if not all(isinstance(r, dict) and {"coord", "losses", "params"} <= set(r) for r in results):
        reject("that run is not a run of td.three_d_worker (its ranks return 'coord', 'losses' and 'params')")
    sizes = {n: max(r["coord"][n] for r in results) + 1 for n in ("dp", "pp", "tp")}
    if sizes != {"dp": 2, "pp": 4, "tp": 1}:
        reject(f"the run's layout is DP{sizes['dp']} x PP{sizes['pp']} x TP{sizes['tp']}; the exercise asks for DP2 x PP4 x TP1")
    steps = len(reference["losses"])
    check_pipeline_order(run, "gpipe", 2, repeats=steps, stage_of=lambda r: (results[r]["coord"]["pp"], 4))
    losses = global_losses(results)
    check_true(len(losses) == steps and max(abs(a - b) for a, b in zip(losses, reference["losses"])) < 1e-10
               and max_param_diff(results, reference, 1) < 1e-10,
               what="DP2 x PP4 x TP1 with GPipe on 8 ranks: losses and parameters equal single-process training",
               hint="Same steps, batch and learning rate on both sides.")


@exercise
def ex5(run):
    """Expert parallelism on 4 ranks: 16 experts, top_k = 4, capacity factor 1.25, 32 tokens per rank.

    Checks the Run itself: its arguments, outputs and gradients against the numpy layer, and
    every rank's communication log: the dispatch and combine all-to-alls carry exactly the rows
    the routing sends (kept copies x h x 8 bytes)."""
    from ...expert_parallel import max_differences, token_all_to_alls

    require(run, "the Run that launch returns")
    check_true(hasattr(run, "results") and hasattr(run, "comm"), what="a Run from launch",
               hint="Pass what launch returns, not run.results.")
    res = run.results
    check_true(len(res) == 4 and all(isinstance(r, dict) and "args" in r for r in res),
               what="4 ranks, each returning what epl.ep_worker returns",
               hint="Launch epl.ep_worker, the expert-parallel layer, on as many ranks as the "
                    "exercise's layout has, one share of the experts each.")
    a = res[0]["args"]
    want = {"experts": 16, "top_k": 4, "capacity_factor": 1.25, "tokens": 32, "ranks": 4}
    check_true(all(a.get(k) == v for k, v in want.items()), what="the layout asked for: 16 experts, top_k 4, cf 1.25, 32 tokens per rank",
               hint="Pass tokens=, experts=, top_k= and capacity_factor= to launch, which hands them to the worker.")
    ref = reference(**a)
    check_true(max(max_differences(res, ref).values()) < 1e-10, what="outputs and gradients equal the single-process layer")
    D, row = dispatch_counts(ref["idx"], ref["keep"], a["experts"], 4), a["h"] * 8
    ok = True
    for r in range(4):
        ops = [(o.op, o.bytes, o.group_size) for o in run.comm[r]]
        fwd = token_all_to_alls(ops[:3])
        ok &= len(ops) >= 5 and all(op == "all_to_all" and g == 4 for op, _, g in ops)
        ok &= fwd == [D[r].sum() * row, D[:, r].sum() * row]
    check_true(ok, what="every rank's log shows the all-to-all dispatch and combine of exactly its routed rows",
               hint="Run the worker with record=True (the default) so the log records the collectives.")
