"""Exercise checks for P.10 (sequence and context parallelism)."""
from ... import ring_attention as ra
from . import check_number, check_run, check_true, exercise, op_bytes, reject


@exercise
def ex1(answer):
    """Bytes of one head's n x n score matrix at n = 32,768 in 16-bit."""
    check_number(answer, ra.score_matrix_bytes(32_768, 2), what="the bytes of the score matrix",
                 hint="n x n entries, each of 16 bits.")


@exercise
def ex2(answer):
    """Bytes sent per device, head-redistribution (all-to-all) design divided by the ring design, p = 8."""
    ratio = ra.ulysses_bytes_per_rank(128_000, 8, 64, 128) / ra.ring_bytes_per_rank(128_000, 8, 64, 128)
    check_number(answer, ratio, what="the ratio all-to-all bytes / ring bytes",
                 hint="The all-to-all design moves Q, K, V in and the output back, each keeping 1/p at home; "
                      "the ring moves K and V p-1 times.")


def token_blocks(s: int, p: int, scheme: str) -> list:
    """The token positions each of ``p`` ranks holds under ``scheme`` ("contiguous" or "zigzag"), for the
    checks, written out here rather than taken from the helpers the exercises call."""
    if scheme == "contiguous":
        n = s // p
        return [list(range(r * n, (r + 1) * n)) for r in range(p)]
    n = s // (2 * p)  # zig-zag: 2p chunks, rank r holds chunk r and chunk 2p-1-r
    return [list(range(r * n, (r + 1) * n)) + list(range((2 * p - 1 - r) * n, (2 * p - r) * n)) for r in range(p)]


def attention_run_equals_reference(run, s, heads, d, *, world: int, scheme: str, causal: bool, ops: dict,
                                   absent=(), kv_op: str, what: str, hint: str):
    """A Run of an attention worker (``{"idx", "out"}`` per rank) on ``world`` ranks: the scheme's token
    partition, the communication the design needs (every rank moves at least the other ranks' K and V,
    float64, with ``kv_op``) and outputs that assemble to one-process attention."""
    import torch

    check_run(run, world, ops=ops, absent=absent, hint=hint)
    for r in range(world):
        if sum(op_bytes(run, kv_op, r)) < 2 * heads * s * d * 8 * (world - 1) // world:
            reject(f"rank {r}'s {kv_op} calls moved less than the other ranks' K and V", hint)
    results = run.results
    if not all(isinstance(r, dict) and {"idx", "out"} <= set(r) for r in results):
        reject("every rank must return {'idx': its token positions, 'out': its attention output}")
    for r, want in enumerate(token_blocks(s, world, scheme)):
        if [int(i) for i in results[r]["idx"]] != want:
            reject(f"rank {r} holds the wrong token positions for the {scheme} partition",
                   f"Take rank r's rows with ra.partition_indices(s, p, {scheme!r})[r].")
    dt = results[0]["out"].dtype
    q, k, v, _ = ra.make_inputs(s, heads, d, 0, dt)
    ref = ra.reference_attention(q, k, v, causal=causal)[0]
    got = ra.assemble(results, "out", s).to(torch.float64)
    rtol, atol = ra.tolerance(dt)
    check_true(torch.allclose(got, ref, rtol=rtol, atol=atol), what=what, hint=hint)


@exercise
def ex3(run, s, heads, d):
    """All-gather K/V attention (non-causal) on 3 ranks, contiguous partition, equals one-process attention."""
    attention_run_equals_reference(
        run, s, heads, d, world=3, scheme="contiguous", causal=False, ops={"all_gather": 1}, absent=("send",),
        kv_op="all_gather", what="all-gather attention on 3 ranks equals one-process attention",
        hint="Gather K and V of every rank with dist.all_gather_single, in rank order, then attend with your query rows.")
