"""Exercise checks for 12.4.1 (rules of thumb for choosing a mix)."""
from . import check_number, check_true, require
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


def ex4(results, reference):
    """A 3D run on 8 ranks (any valid DP x PP x TP, any schedule) matching single-process training."""
    from ..three_d import global_losses, max_param_diff

    require(results, "run.results of your launch")
    tp = max(r["coord"]["tp"] for r in results) + 1
    losses = global_losses(results)
    check_true(len(results) == 8 and len(losses) == len(reference["losses"]), what="8 ranks trained for the reference's number of steps")
    check_true(max(abs(a - b) for a, b in zip(losses, reference["losses"])) < 1e-10 and max_param_diff(results, reference, tp) < 1e-10,
               what="losses and parameters equal single-process training",
               hint="Same steps, batch and learning rate on both sides.")
