"""Exercise checks for 12.4.2 (case studies: Llama 3, DeepSeek-V3, Gemma 2)."""
from fractions import Fraction

from ...costs import moe_all_to_all_sent
from ...memory import GB
from ...mesh import Mesh
from ...pipeline_schedule import min_microbatches
from . import check_int, check_number, check_run, check_true, exercise, reject


@exercise
def ex1(answer):
    """BF16 weight GB per GPU of Llama 3 405B at TP=8, PP=16."""
    check_number(answer, 405e9 * 2 / (8 * 16) / GB, what="the BF16 weights per GPU in GB",
                 hint="Tensor and pipeline parallelism together divide the weights TP x PP ways.")


@exercise
def ex2(answer):
    """Smallest m with (p-1)/m <= 20% at p = 16."""
    check_int(answer, min_microbatches(16, Fraction(1, 5), "useful"), what="the smallest number of micro-batches per replica",
              hint="12.2.2's ratio: idle over useful time, (p-1)/m.")


@exercise
def ex3(answer):
    """Tokens in the smallest step of Gemma 2 27B's layout: one 8,192-token sequence per data replica."""
    check_int(answer, 768 * 8192, what="the tokens per step", hint="Table 3: 768 data replicas.")


@exercise
def ex4(run):
    """hand_groups_worker on the 4D mesh ('dp','pp','cp','tp') = (2,2,2,2), 16 ranks: rank 5's coordinate,
    context-parallel group and the sum all-reduced over it."""

    check_run(run, 16, ops={"all_reduce": 4}, hint="One all-reduce per dimension of the grid on every rank.")
    for r in range(16):
        if any(o.group_size != 2 for o in run.comm[r] if o.op == "all_reduce"):
            reject(f"rank {r} all-reduced over a group that is not one of the grid's groups of 2 ranks")
    result = run.results[5]
    mesh = Mesh.of(dp=2, pp=2, cp=2, tp=2)
    ok = (isinstance(result, dict) and result.get("rank") == 5 and result.get("coord") == mesh.coord(5)
          and result.get("groups", {}).get("cp") == mesh.group_of(5, "cp")
          and result.get("sums", {}).get("cp") == sum(mesh.group_of(5, "cp")))
    check_true(ok, what="rank 5's coordinate and context-parallel group on the 16 ranks",
               hint="hm.hand_groups_worker takes the grid's dimension names, in order, and their sizes; "
                    "launch it on as many ranks as the grid has cells.")


@exercise
def ex5(answer):
    """MB each GPU sends in one DeepSeek-V3 MoE layer's forward dispatch (FP8), one 4096-token sequence, EP 64."""

    check_number(answer, moe_all_to_all_sent(4096, 8, 7168, 64, 1) / 1e6, what="the dispatch bytes each GPU sends, in MB",
                 hint="Every token goes to 8 experts; a copy to an expert on another GPU leaves it; FP8 is 1 byte per value.")
