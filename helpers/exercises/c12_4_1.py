"""Exercise checks for 12.4.1 (rules of thumb for choosing a mix)."""
from . import check_number, check_pipeline_order, check_run, check_true, reject
from ..costs import ring_bytes_sent
from ..memory import GB, per_device_bytes
from ..pipeline_schedule import bubble_formula


def ex1(answer):
    """12.4.1's bubble (p-1)/m at p = 16, m = 64."""
    check_number(answer, float(bubble_formula(16, 64, definition="useful")), what="the bubble ratio (p-1)/m",
                 hint="Idle time over useful time, the section's definition.")


def ex2(answer):
    """Optimizer-state GB per GPU of the 70B with TP=8 and ZeRO-1 over DP=32 (FP32 master + 2 moments)."""
    b = per_device_bytes(70e9 / 8, 32, 1)
    check_number(answer, (b["master"] + b["moments"]) / GB, what="the optimizer state per GPU in GB",
                 hint="A GPU's TP shard holds 1/8 of the parameters; ZeRO-1 splits its 12 bytes per parameter 32 ways.")


def ex3(answer):
    """GB each GPU sends per step in the reduce-scatter + all-gather of the 70B's BF16 gradients (TP=8, DP=32)."""
    shard = 70e9 / 8 * 2
    sent = ring_bytes_sent("reduce_scatter", shard, 32) + ring_bytes_sent("all_gather", shard, 32)
    check_number(answer, sent / GB, what="the bytes each GPU sends per step, in GB",
                 hint="A ring reduce-scatter and a ring all-gather each send (d-1)/d of the GPU's own gradient bytes.")


def ex4(run, reference):
    """The tiny transformer on 8 ranks as DP2 x PP4 x TP1 with GPipe and 2 micro-batches, for the reference's
    steps: the layout, every rank's F/B order, and losses and parameters equal to single-process training."""
    from ..three_d import global_losses, max_param_diff

    check_run(run, 8, hint="launch(td.three_d_worker, dp=2, pp=4, tp=1, ..., world_size=8).")
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
