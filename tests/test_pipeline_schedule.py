"""The pipeline schedule simulator (P.9, 12.2.2): timelines, both bubbles, in-flight peaks, errors."""
from fractions import Fraction as Fr

import pytest

from helpers import pipeline_schedule as ps
from helpers.pipeline_schedule import bubble_formula, simulate

GRID = [(2, 1), (2, 5), (3, 3), (4, 1), (4, 4), (4, 8), (4, 32), (8, 32), (5, 7)]


def _check_valid(tl, comm=0):
    """Every op once; a device runs one op at a time; an op starts after what it depends on."""
    keys = [(o.kind, o.device, o.chunk, o.mb) for o in tl.ops]
    assert len(keys) == len(set(keys))
    kinds = 2 + tl.split_backward
    assert len(keys) == kinds * tl.p * tl.v * tl.m
    end = {(o.kind, o.device, o.chunk, o.mb): o.end for o in tl.ops}
    for o in tl.ops:
        for n in ps.dependencies(o.kind, o.device, o.chunk, o.mb, tl.p, tl.v):
            assert o.start >= end[n] + (comm if n[1] != o.device else 0)
    for d in range(tl.p):
        ops = tl.device_ops(d)
        assert all(a.end <= b.start for a, b in zip(ops, ops[1:]))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1"])
@pytest.mark.parametrize("p,m", GRID)
def test_timelines_are_valid(schedule, p, m):
    _check_valid(simulate(schedule, p, m, f=2, b=3, w=1))
    _check_valid(simulate(schedule, p, m, f=[1, 3] * (p // 2) + [2] * (p % 2), b=2, w=1, comm=1), comm=1)


@pytest.mark.parametrize("p,m,v", [(2, 2, 2), (2, 6, 3), (4, 4, 2), (4, 8, 2), (4, 12, 4), (3, 9, 2)])
def test_interleaved_timeline_and_bubble(p, m, v):
    tl = simulate("interleaved", p, m, v=v, f=1, b=2, w=0)
    _check_valid(tl)
    assert tl.bubble("total") == bubble_formula(p, m, v, "total") == Fr(p - 1, v * m + p - 1)
    assert tl.bubble("useful") == Fr(p - 1, v * m)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", GRID)
def test_both_bubbles_from_the_timeline(schedule, p, m):
    for f, b in [(1, 1), (1, 2), (3, 5)]:
        tl = simulate(schedule, p, m, f=f, b=b, w=0)
        assert tl.makespan == (m + p - 1) * (f + b)
        assert tl.bubble("total") == Fr(p - 1, m + p - 1) == bubble_formula(p, m)
        assert tl.bubble("useful") == Fr(p - 1, m) == bubble_formula(p, m, definition="useful")
        assert tl.utilisation() == 1 - tl.bubble("total")


def test_p9_slot_picture_and_table():
    tl = simulate("gpipe", 4, 4, f=1, forward_only=True)
    assert (tl.makespan, tl.busy(), tl.p * tl.makespan, tl.idle()) == (7, 16, 28, 12)
    assert tl.bubble() == Fr(3, 7)
    table = {m: simulate("gpipe", 4, m, forward_only=True).bubble() for m in (1, 4, 8, 16, 32)}
    assert table == {1: Fr(3, 4), 4: Fr(3, 7), 8: Fr(3, 11), 16: Fr(3, 19), 32: Fr(3, 35)}
    assert [round(float(x) * 100, 1) for x in table.values()] == [75.0, 42.9, 27.3, 15.8, 8.6]


@pytest.mark.parametrize("p,m", GRID)
def test_peak_in_flight(p, m):
    g, o, z = (simulate(s, p, m) for s in ("gpipe", "1f1b", "zb-h1"))
    assert [g.peak_in_flight(d) for d in range(p)] == [m] * p
    assert [o.peak_in_flight(d) for d in range(p)] == [min(p - d, m) for d in range(p)]
    assert z.peak_in_flight() == min(p, m) == o.peak_in_flight()
    # ZB-H1 keeps a micro-batch's activations until its W: device d holds 1F1B's p - d plus the up to
    # d whose W it defers, so every device reaches min(p, m) (Qi et al.: the peak of 1F1B's device 0)
    assert [z.peak_in_flight(d) for d in range(p)] == [min(p, m)] * p


def test_interleaved_holds_more_than_1f1b():
    tl = simulate("interleaved", 4, 8, v=2)
    assert tl.peak_in_flight(0) == Fr(11, 2) and tl.peak_in_flight(3) == Fr(5, 2)
    assert tl.peak_in_flight() > simulate("1f1b", 4, 8).peak_in_flight()


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12), (8, 24)])
@pytest.mark.parametrize("f,b,w", [(1, 1, 1), (2, 2, 1), (3, 2, 2), (1, 1, 0)])
def test_zb_h1_bubble_matches_qi_et_al(p, m, f, b, w):
    zb = simulate("zb-h1", p, m, f=f, b=b, w=w)
    one = simulate("1f1b", p, m, f=f, b=b, w=w)
    for d in range(p):
        assert zb.idle(d) == ps.zb_h1_bubble_time(p, f, b, w) == (p - 1) * (f + b - w)
        assert one.idle(d) == (p - 1) * (f + b + w)


def test_unequal_stages():
    f = [1, 3, 2, 1]
    tl = simulate("gpipe", 4, 6, f=f, forward_only=True)
    assert tl.makespan == sum(f) + 5 * max(f)  # flow shop of identical jobs
    for schedule in ("gpipe", "1f1b"):
        for m in (1, 4, 16):
            tl = simulate(schedule, 4, m, f=f, b=[2, 6, 4, 2], w=0)
            c = [3, 9, 6, 3]
            assert tl.makespan >= max(m * max(c), sum(c))
            if m > 1:  # with one micro-batch every stage works alone anyway: (p-1)/p
                assert tl.bubble() > bubble_formula(4, m)
    big = simulate("1f1b", 4, 64, f=f, b=[2, 6, 4, 2], w=0)
    assert big.makespan / 64 < Fr(11, 1)  # per micro-batch it tends to the slowest stage's 9


def test_comm_and_handoff_delays():
    tl = simulate("1f1b", 4, 8, f=2, b=3, comm=Fr(1, 2))
    gaps = ps.handoff_delays(tl)
    assert gaps and all(g == Fr(1, 2) for g in gaps)
    assert tl.makespan > simulate("1f1b", 4, 8, f=2, b=3).makespan
    again = ps.from_records("1f1b", 4, 8, 1, [(o.kind, o.device, o.chunk, o.mb, o.start + 10, o.end + 10) for o in tl.ops])
    assert again.makespan == pytest.approx(float(tl.makespan)) and again.bubble() == pytest.approx(float(tl.bubble()))


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_comm_is_paid_only_between_devices(p):
    # one micro-batch is a chain: F on devices 0..p-1, B on p-1..0 (then W on each, ZB-H1). It crosses
    # a device boundary 2(p-1) times; the last stage's B follows its own F, and each W its own B,
    # on the same device, with no hand-off between them
    f, b, w, comm = 2, 3, 1, Fr(1, 2)
    for schedule in ("gpipe", "1f1b"):
        assert simulate(schedule, p, 1, f=f, b=b, w=w, comm=comm).makespan == p * (f + b + w) + 2 * (p - 1) * comm
    # ZB-H1: device 0's W runs last, right after its own B
    assert simulate("zb-h1", p, 1, f=f, b=b, w=w, comm=comm).makespan == p * (f + b) + w + 2 * (p - 1) * comm


def test_definitions_convert_and_min_microbatches():
    for p, m in GRID:
        t, u = bubble_formula(p, m, definition="total"), bubble_formula(p, m, definition="useful")
        assert ps.convert_bubble(u, "total") == t and ps.convert_bubble(t, "useful") == u
    assert ps.min_microbatches(8, Fr(1, 4), "useful") == 28
    assert ps.min_microbatches(8, Fr(1, 4), "total") == 21
    assert ps.min_microbatches(32, Fr(1, 5), "useful") == 155


def test_orders_shape():
    orders = ps.op_orders("1f1b", 4, 6)
    assert orders[3][:4] == [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)]
    assert orders[0][:4] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3)]
    zb = ps.op_orders("zb-h1", 4, 6)
    assert zb[0][3:6] == [("F", 0, 3), ("B", 0, 0), ("W", 0, 0)]
    assert sum(k == "W" for k, _, _ in zb[2]) == 6


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: simulate("pipedream", 4, 4), "unknown schedule"),
        (lambda: simulate("1f1b", 0, 4), "p \\(stages\\) must be an integer >= 1"),
        (lambda: simulate("1f1b", 4, 2.0), "m \\(micro-batches\\) must be an integer"),
        (lambda: simulate("interleaved", 4, 8, v=1), "needs v >= 2"),
        (lambda: simulate("interleaved", 4, 6, v=2), "multiple of p"),
        (lambda: simulate("gpipe", 4, 8, v=2), "v must be 1"),
        (lambda: simulate("1f1b", 4, 8, f=[1, 2]), "one duration per stage"),
        (lambda: simulate("1f1b", 4, 8, f=-1), "must be > 0"),
        (lambda: simulate("1f1b", 4, 8, w=-1), "must be >= 0"),
        (lambda: simulate("1f1b", 4, 8, comm=-1), "comm must be >= 0"),
        (lambda: simulate("1f1b", 4, 8, forward_only=True), "forward_only"),
        (lambda: simulate("1f1b", 4, 8).bubble("ratio"), "definition must be one of"),
        (lambda: bubble_formula(4, 8, definition="idle"), "definition must be one of"),
        (lambda: ps.min_microbatches(4, 1.5, "total"), "target bubble"),
        (lambda: ps.convert_bubble(1, "useful"), "must be < 1"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_gantt_draws_every_op():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = simulate("zb-h1", 4, 8)
    ax = ps.gantt(tl)
    assert len(ax.patches) == len(tl.ops) == 3 * 4 * 8
    ax2 = ps.plot_in_flight(tl)
    assert len(ax2.lines) == 4
    plt.close("all")


def _batches(p, v, m, d, run):
    """The batches of sends and receives rank d issues when ``run`` executes its interleaved order:
    ("send" | "recv", peer, (kind, receiving virtual stage, micro-batch)) per op."""
    out = []

    class Steps:
        def p2p(self, sends, recvs):
            ops = [("send", (c * p + d + (1 if k == "F" else -1)) % p, (k, c * p + d + (1 if k == "F" else -1), j))
                   for k, c, j, _ in sends]
            ops += [("recv", (c * p + d + (-1 if k == "F" else 1)) % p, (k, c * p + d, j)) for k, c, j in recvs
                    if not (k == "F" and c * p + d == 0) and not (k == "B" and c * p + d == p * v - 1)]
            if ops:
                out.append(ops)
            return [None] * len(recvs)

        def forward(self, c, j, x):
            return None if c * p + d == p * v - 1 else "activation"

        def backward(self, c, j, g):
            return None if c * p + d == 0 else "gradient"

    run(Steps())
    return out


def _completes(batches) -> bool:
    """Whether every rank gets through its batches when a send waits for its receive to be posted
    (gloo's rendezvous) and a rank waits for its whole batch (batch_isend_irecv, then wait())."""
    p = len(batches)
    at, done = [0] * p, [set() for _ in range(p)]
    while any(at[d] < len(batches[d]) for d in range(p)):
        moved = False
        for d in range(p):
            if at[d] == len(batches[d]):
                continue
            for k, (op, peer, msg) in enumerate(batches[d][at[d]]):
                if k in done[d] or at[peer] == len(batches[peer]):
                    continue
                other = ("recv" if op == "send" else "send", d, msg)
                hit = [j for j, o in enumerate(batches[peer][at[peer]]) if o == other and j not in done[peer]]
                if hit:
                    done[d].add(k)
                    done[peer].add(hit[0])
                    moved = True
        for d in range(p):
            if at[d] < len(batches[d]) and len(done[d]) == len(batches[d][at[d]]):
                at[d], done[d], moved = at[d] + 1, set(), True
        if not moved:
            return False
    return True


@pytest.mark.parametrize("p,v", [(2, 2), (2, 3), (3, 2), (4, 2), (4, 4), (8, 2)])
def test_megatrons_interleaved_batches_never_deadlock(p, v):
    """Rank d's order cut into Megatron's loop iterations is the order itself, warm-up first; run by
    run_steps (one batch per iteration boundary) it never deadlocks, where run_schedule's batches
    (an output sent alone unless the next op receives from the same neighbour) do on the ring."""
    from helpers.pipeline_parallel import run_schedule, run_steps

    for m in (p, 2 * p, 3 * p):
        for d in range(p):
            steps = ps.interleaved_steps(p, m, v, d)
            assert [o for s in steps for o in s] == ps.op_orders("interleaved", p, m, v)[d]
            warm = m * v if m == p else (p - d - 1) * 2 + (v - 1) * p  # Megatron's warm-up
            assert [len(s) for s in steps] == [1] * warm + [2] * (m * v - warm) + [1] * warm
        grouped = [_batches(p, v, m, d, lambda s, d=d: run_steps(ps.interleaved_steps(p, m, v, d), s)) for d in range(p)]
        assert _completes(grouped)
    paired = [_batches(p, v, 2 * p, d, lambda s, d=d: run_schedule(ps.op_orders("interleaved", p, 2 * p, v)[d], s,
                                                                     paired=True)) for d in range(p)]
    assert not _completes(paired)
