"""The caching-allocator model (helpers.fake_world.allocator) on sequences whose reserve follows by
hand from the rules of c10/cuda/CUDACachingAllocator.cpp: 512-byte rounding, a small pool (<= 1 MiB)
of 2 MiB segments, 20 MiB segments for 1-10 MiB, larger requests rounded up to 2 MiB, best fit,
splitting (remainder >= 512 B in the small pool, > 1 MiB in the large one), coalescing, and no
segment given back unless the device is full. Every expected figure is worked out in the comments,
not computed with the module. Then the fake world's traced step replayed through it: the bytes it
sees, and the reserve of an extrapolated trace against a trace of everything."""
import pytest

from helpers import fake_world as fw
from helpers.fake_world import allocator as al
from helpers.planner import Layout, Model

KiB, MiB = 2**10, 2**20


def run(*events, capacity=None):
    return al.replay(events, capacity=capacity)


def test_one_byte_takes_512_bytes_of_a_2_mib_segment():
    r = run(("alloc", "a", 1))
    assert (r.peak_requested, r.peak_allocated, r.peak_reserved, r.segments) == (1, 512, 2 * MiB, 1)
    # 513 bytes round to 1024
    assert run(("alloc", "a", 513)).peak_allocated == 1024


def test_two_6_mib_tensors_share_one_20_mib_segment():
    # 6 MiB is large (> 1 MiB) and < 10 MiB: a 20 MiB segment, split (14 MiB left > 1 MiB); the second
    # 6 MiB takes the 14 MiB remainder (best fit), split again (8 MiB left)
    r = run(("alloc", "a", 6 * MiB), ("alloc", "b", 6 * MiB))
    assert (r.peak_allocated, r.peak_reserved, r.segments) == (12 * MiB, 20 * MiB, 1)
    # a third and a fourth: 6 MiB from the 8 MiB left (2 MiB left, > 1 MiB: split), then a new segment
    r = run(*[("alloc", k, 6 * MiB) for k in "abcd"])
    assert (r.peak_allocated, r.peak_reserved, r.segments) == (24 * MiB, 40 * MiB, 2)


def test_small_pool_packs_2_mib_segments():
    # 1 MiB is small (<= 1 MiB): a 2 MiB segment split in two (1 MiB left >= 512 B); a third needs a new one
    r = run(("alloc", "a", MiB), ("alloc", "b", MiB), ("alloc", "c", MiB))
    assert (r.peak_allocated, r.peak_reserved, r.segments) == (3 * MiB, 4 * MiB, 2)
    # 1 MiB + 1 byte is large: rounds to 1 MiB + 512 and takes a 20 MiB segment
    r = run(("alloc", "a", MiB + 1))
    assert (r.peak_allocated, r.peak_reserved) == (MiB + 512, 20 * MiB)


def test_the_pools_do_not_serve_each_other():
    # a freed 512 KiB block (small pool) cannot serve a 1.5 MiB request (large pool): 2 + 20 MiB
    r = run(("alloc", "a", 512 * KiB), ("free", "a"), ("alloc", "b", 3 * MiB // 2))
    assert (r.peak_reserved, r.segments) == (22 * MiB, 2)
    # nor a freed large block a small request: 20 MiB + 2 MiB
    r = run(("alloc", "a", 3 * MiB // 2), ("free", "a"), ("alloc", "b", 512 * KiB))
    assert (r.peak_reserved, r.segments) == (22 * MiB, 2)


def test_from_10_mib_a_segment_of_its_own_rounded_to_2_mib():
    # 12 MiB: a 12 MiB segment, nothing left; 11 MiB: a 12 MiB segment whose 1 MiB rest is not > 1 MiB,
    # so it is not split and the whole 12 MiB block counts as allocated
    r = run(("alloc", "a", 12 * MiB))
    assert (r.peak_allocated, r.peak_reserved) == (12 * MiB, 12 * MiB)
    # the edge: exactly 10 MiB is no longer "between 1 and 10": a 10 MiB segment; 512 bytes less takes 20 MiB
    assert run(("alloc", "a", 10 * MiB)).peak_reserved == 10 * MiB
    assert run(("alloc", "a", 10 * MiB - 512)).peak_reserved == 20 * MiB
    r = run(("alloc", "a", 11 * MiB))
    assert (r.peak_requested, r.peak_allocated, r.peak_reserved) == (11 * MiB, 12 * MiB, 12 * MiB)
    # a 1.5 MiB request after it cannot use that unsplit 1 MiB: a new 20 MiB segment
    r = run(("alloc", "a", 11 * MiB), ("alloc", "b", 3 * MiB // 2))
    assert (r.peak_reserved, r.segments) == (32 * MiB, 2)


def test_a_freed_block_is_reused_by_a_smaller_one_split():
    # 12 MiB segment; freed; 4 MiB takes it (best fit) and splits it (8 MiB left > 1 MiB); 8 MiB takes the
    # rest: still one 12 MiB segment, allocated 4 + 8 = 12 MiB
    r = run(("alloc", "a", 12 * MiB), ("free", "a"), ("alloc", "b", 4 * MiB), ("alloc", "c", 8 * MiB))
    assert (r.peak_allocated, r.peak_reserved, r.segments, r.allocated) == (12 * MiB, 12 * MiB, 1, 12 * MiB)


def test_best_fit_picks_the_smallest_free_block_that_fits():
    # free segments of 14 and 12 MiB; 11.5 MiB goes to the 12 MiB one (0.5 MiB left: not split), 13 MiB to the
    # 14 MiB one (1 MiB left: not split): no new segment. First fit in address order would put 11.5 MiB in the
    # 14 MiB block and need a new 14 MiB segment for the 13 MiB.
    r = run(("alloc", "a", 14 * MiB), ("alloc", "b", 12 * MiB), ("free", "a"), ("free", "b"),
            ("alloc", "c", 23 * MiB // 2), ("alloc", "d", 13 * MiB))
    assert (r.peak_reserved, r.segments, r.allocated) == (26 * MiB, 2, 26 * MiB)


def test_freed_neighbours_coalesce():
    # three 6 MiB blocks in one 20 MiB segment (2 MiB left); the first two freed merge into 12 MiB, which an
    # 11 MiB request takes whole (1 MiB left: not split): no second segment, allocated 12 + 6 MiB
    r = run(("alloc", "a", 6 * MiB), ("alloc", "b", 6 * MiB), ("alloc", "c", 6 * MiB),
            ("free", "a"), ("free", "b"), ("alloc", "d", 11 * MiB))
    assert (r.peak_reserved, r.segments, r.allocated) == (20 * MiB, 1, 18 * MiB)
    # freed in the other order, and the last freed between its two free neighbours: one 20 MiB block again
    r = run(("alloc", "a", 6 * MiB), ("alloc", "b", 6 * MiB), ("alloc", "c", 6 * MiB),
            ("free", "c"), ("free", "a"), ("free", "b"), ("alloc", "d", 19 * MiB))
    assert (r.peak_reserved, r.segments, r.allocated) == (20 * MiB, 1, 20 * MiB)


def test_fragmentation_reserves_more_than_the_allocated_peak():
    # two 12 MiB segments, both freed: 24 MiB cached in two pieces that do not merge (different segments);
    # a 20 MiB request fits neither: a new 20 MiB segment. Reserved 44 MiB, allocated peak 24 MiB.
    r = run(("alloc", "a", 12 * MiB), ("alloc", "b", 12 * MiB), ("free", "a"), ("free", "b"),
            ("alloc", "c", 20 * MiB))
    assert (r.peak_allocated, r.peak_reserved, r.segments) == (24 * MiB, 44 * MiB, 3)


def test_reserve_is_kept_until_the_device_is_full():
    # the same with a 40 MiB device: 24 + 20 > 40, so the two wholly free 12 MiB segments go back first
    # (release_cached_blocks) and the 20 MiB segment is taken: peak reserved 24 MiB, 20 MiB held at the end
    r = run(("alloc", "a", 12 * MiB), ("alloc", "b", 12 * MiB), ("free", "a"), ("free", "b"),
            ("alloc", "c", 20 * MiB), capacity=40 * MiB)
    assert (r.peak_reserved, r.reserved) == (24 * MiB, 20 * MiB)
    # a segment in use is not released: 20 + 22 > 40 with nothing to give back
    with pytest.raises(al.OutOfMemory, match="does not fit"):
        run(("alloc", "a", 20 * MiB), ("alloc", "b", 22 * MiB), capacity=40 * MiB)


def test_empty_cache_releases_only_wholly_free_segments():
    a = al.CachingAllocator()
    x, y = a.malloc(6 * MiB), a.malloc(6 * MiB)  # one 20 MiB segment
    z = a.malloc(12 * MiB)  # a 12 MiB segment
    a.free(x)
    a.free(z)
    a.empty_cache()  # the 12 MiB segment goes; the 20 MiB one holds y
    assert (a.reserved, a.segments, a.peak_reserved) == (20 * MiB, 1, 32 * MiB)
    a.free(y)
    a.empty_cache()
    assert (a.reserved, a.segments, a.allocated) == (0, 0, 0)


def test_bad_events_are_refused():
    with pytest.raises(ValueError, match="freed but not allocated"):
        run(("alloc", "a", 10), ("free", "a"), ("free", "a"))
    with pytest.raises(ValueError, match="allocated again"):
        run(("alloc", "a", 10), ("alloc", "a", 10))
    with pytest.raises(ValueError, match="alloc"):
        run(("resize", "a", 10))
    with pytest.raises(ValueError, match="capacity"):
        al.CachingAllocator(capacity=0)
    # an empty tensor gets no block, and its free is no error
    r = run(("alloc", "e", 0), ("free", "e"))
    assert (r.peak_reserved, r.segments) == (0, 0)


# ---- the traced step replayed through the model (helpers.fake_world.simulate) -------------------------

TINY = Model("tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, mlp_matrices=3, seq_len=32, vocab=256)
# MiB-scale tensors: the large pool, 20 MiB and own segments (b s h BF16 = 1 MiB, the logits 64 MiB in FP32)
MID = Model("mid", layers=8, hidden=512, heads=8, kv_heads=4, ffn=2048, mlp_matrices=3, seq_len=1024, vocab=32768)


@pytest.mark.parametrize("lay", [Layout(dp=4, zero=3), Layout(dp=2, tp=2, zero=3), Layout(dp=2, pp=2, zero=2)])
def test_the_replay_sees_exactly_the_bytes_the_tracker_counts(lay):
    # every storage made, resized (FSDP2's unsharded parameters) and freed reaches the allocator: the
    # requested peak is MemTracker's; every tensor of TINY is under 1 MiB, so its reserve is whole
    # 2 MiB small-pool segments, and at least the allocated peak, itself at least the requested one
    step = fw.simulate(TINY, lay, micro_batches=2, extrapolate=False)
    r = step.reserve
    assert r["peak_requested"] == step.memory["total"]
    assert step.peak_reserved == r["peak_reserved"] >= r["peak_allocated"] >= r["peak_requested"]
    assert r["peak_reserved"] % (2 * MiB) == 0 and r["segments"] == r["peak_reserved"] // (2 * MiB)


@pytest.mark.parametrize("lay,m", [(Layout(dp=2, zero=3), 2), (Layout(dp=2, zero=1), 4)])
def test_extrapolated_reserve_is_within_4pct_of_a_full_trace(lay, m):
    """trace_layers=2 (2, 3, 4 of 8 layers; 3 of 4 micro-batches) against a trace of everything. The
    allocated peak is exact; the reserve is the extrapolated peak plus the largest margin of the traced
    counts (helpers.fake_world._reserve_at), measured 1.2-3.5% off the full trace's on five layouts of
    MID-like models (ZeRO-1/3, TP with full recomputation, a pipeline): the bound is 4%."""
    part = fw.simulate(MID, lay, micro_batches=m, trace_layers=2, extrapolate="always")
    assert part.notes, "nothing was extrapolated: the test would not test the extrapolation"
    full = fw.simulate(MID, lay, micro_batches=m, extrapolate=False)
    assert part.memory == full.memory
    assert full.peak_reserved > full.memory["total"] + 20 * MiB  # a margin worth extrapolating
    assert part.peak_reserved == pytest.approx(full.peak_reserved, rel=0.04)
    assert part.peak_reserved >= part.reserve["peak_allocated"] >= part.memory["total"]
