"""Exercise checks for P.10 (sequence and context parallelism)."""
from . import check_number, check_true, require
from .. import ring_attention as ra


def ex1(answer):
    """Bytes of one head's n x n score matrix at n = 32,768 in 16-bit."""
    check_number(answer, ra.score_matrix_bytes(32_768, 2), what="the bytes of the score matrix",
                 hint="n x n entries, each of 16 bits.")


def ex2(answer):
    """Bytes sent per device, head-redistribution (all-to-all) design divided by the ring design, p = 8."""
    ratio = ra.ulysses_bytes_per_rank(128_000, 8, 64, 128) / ra.ring_bytes_per_rank(128_000, 8, 64, 128)
    check_number(answer, ratio, what="the ratio all-to-all bytes / ring bytes",
                 hint="The all-to-all design moves Q, K, V in and the output back, each keeping 1/p at home; "
                      "the ring moves K and V p-1 times.")


def attention_on_ranks_equals_reference(results, s, heads, d, *, causal: bool, what: str, hint: str):
    """Rank outputs (``{"idx", "out"}`` per rank) assembled equal one-process attention (P.10, 12.3.2)."""
    require(results, "the list run.results of your launch")
    import torch

    if not (isinstance(results, list) and all(isinstance(r, dict) and {"idx", "out"} <= set(r) for r in results)):
        raise AssertionError("expected run.results: a list with one dict per rank holding 'idx' and 'out'; "
                             "return {'idx': idx, 'out': out} from the worker")
    dt = results[0]["out"].dtype
    q, k, v, _ = ra.make_inputs(s, heads, d, 0, dt)
    ref = ra.reference_attention(q, k, v, causal=causal)[0]
    got = ra.assemble(results, "out", s).to(torch.float64)
    rtol, atol = ra.tolerance(dt)
    check_true(len(results) >= 2 and torch.allclose(got, ref, rtol=rtol, atol=atol), what=what, hint=hint)


def ex3(results, s, heads, d):
    """All-gather K/V attention on the ranks (non-causal) equals one-process attention."""
    attention_on_ranks_equals_reference(
        results, s, heads, d, causal=False, what="your all-gather attention equals one-process attention",
        hint="Gather K and V of every rank in rank order (contiguous partition), then attend with your query rows.")
