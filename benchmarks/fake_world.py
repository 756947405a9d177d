"""Benchmark for the fake world (issue 13: the chapters' scale with PyTorch's own code).

Prints one `name: value` line per figure:
  fake_405b_16384_s              seconds to simulate rank 0's full training step of Llama 3 405B in
                                 its published 4D layout (TP 8, CP 16, PP 16, DP 8; 16 micro-batches
                                 of one 131,072-token sequence; ZeRO-2) at 16,384 ranks, as the 12.4.2
                                 notebook runs it (trace_layers=2, shortened 1F1B warm-up); target
                                 < 60 on the 2-core machine
  fake_405b_16384_cpu_s          the CPU seconds it took (the tracing is single-threaded Python: its wall
                                 time on a quiet machine; wall times here are under other helpers' load)
  fake_405b_16384_full_s         the same with every layer and micro-batch traced (no extrapolation)
  planner_vs_fake_max_rel_err    over the configurations of helpers.fake_world.cases (12.1.1 ... P.11):
                                 the largest |PyTorch / planner - 1| of the per-device peak memory,
                                 the planner told PyTorch's recipe (Rules(**helpers.fake_cases.PYTORCH): the model's
                                 shapes, FSDP2's state at the peak, the FP32 loss, the traced stages);
                                 target <= 0.10, every larger gap explained in its notebook
  planner_vs_fake_rel_err <case> the same for each configuration, and FLOPs per rank
  published_memory <id>          each point of data/published/memory.csv (per-GPU peak measured on real
                                 clusters): the fake world's peak allocated and peak reserved (its
                                 allocations replayed through helpers.fake_world.allocator) beside it, and
                                 the ratio of the one that measures what the point measures (its CSV's
                                 measures / measures_inferred column); exact or nearest recipe (what the
                                 trace does not do), or refused with the reason
  published_memory_within_15pct  k/n over the points the fake world traces exactly (the matching figure)
  published_memory_max_rel_err   the largest |fake / published - 1| over those points (goal <= 0.15)
  published_memory_nearest_*     the same over the nearest-recipe points (compile, Float8: not traced)
  step_time <case>               fake_world.step_time on H100: step s, MFU, breakdown, the planner's step s
                                 and its relative gap, and the planner's told PyTorch's recipe (FP32 gradients)
  compute_efficiency <case>      the model FLOPs of rank 0's step over (H100 peak x the trace's compute seconds):
                                 the share of peak the trace's compute model gives, beside the planner's fixed one;
                                 compute_efficiency_range over the cases
  timing_overhead                simulate with timing=True over timing=False (12.4.1 70B case; goal <= 1.20)
  published_mfu_within_15pct     k/n published runs (helpers.published.throughput_runs, where it exists) whose MFU
  published_mfu_max_rel_err      the step-time model gives within 15%; the largest relative error; every run
                                 it cannot express listed with the reason
  explorer_70b_median_s          the 12.4.1 explorer's answer to a change of a 70B layout: the median wall
                                 seconds of its simulate call over the changes of the fixed list in
                                 fake_world_fingerprint.EXPLORER (one change of each control from its start
                                 layout, which is traced first, untimed, as the notebook's section cell
                                 traces it before the controls; goal < 3), each with its wall and CPU seconds
Run: python benchmarks/fake_world.py   (timings; not a test; --published: the published points only;
     --explorer: the explorer's figure only; --mfu: the published throughput runs only)
"""
import sys
import time

from helpers import fake_cases, fake_world
from helpers.memory import GB


def published_memory():
    from helpers.fake_world import published as fp

    matches = fp.match()
    rows = {r["id"]: r for r in fp.compare(matches)}
    for m in matches:
        if m.kind == "refused":
            print(f"published_memory {m.point.id}: refused ({m.reason})")
            continue
        r = rows[m.point.id]
        how = "exact recipe" if m.kind == "exact" else "nearest recipe; not traced: " + "; ".join(
            d.split(" (")[0] for d in m.differences)
        print(f"published_memory {m.point.id}: fake allocated {r['fake allocated GiB']:.1f} GiB, reserved "
              f"{r['fake reserved GiB']:.1f} GiB; published {r['published GiB']:.1f} GiB ({r['measures']}): "
              f"{r['compared']} / published = {r['ratio']:.3f}  ({m.case.model.name}, {m.case.layout.label()}; {how})")
    for kind, name in (("exact", "published_memory"), ("nearest", "published_memory_nearest")):
        errs = [abs(r["ratio"] - 1) for r in rows.values() if r["kind"] == kind]
        print(f"{name}_within_15pct: {sum(e <= 0.15 for e in errs)}/{len(errs)}")
        print(f"{name}_max_rel_err: " + (f"{max(errs):.3f}" if errs else "none (no such point)"))


def explorer():
    """The explorer's simulate call (12.4.1, fake_vs_planner) on each change of the fixed list. As in
    the notebook, the start layout is traced first (there by the section's cell before the
    controls, whose first drawing reuses it): the changes are timed in a process that has traced once."""
    import statistics

    from fake_world_fingerprint import EXPLORER

    from helpers import planner as pl

    walls = []
    for i, kw in enumerate(EXPLORER):
        kw = dict(kw)
        m = pl.book_70b(kw.pop("seq_len"))
        lay = pl.Layout(**kw)
        t0, c0 = time.perf_counter(), time.process_time()
        fake_world.simulate(m, lay, global_batch=2048, trace_layers=2, progress=lambda line: None)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if i == 0:
            print(f"explorer_70b start layout {lay.label()} s{m.seq_len}: {wall:.1f} s, {cpu:.1f} CPU s (the notebook's "
                  "section cell; the first trace of the process; not a change)")
            continue
        walls.append(wall)
        print(f"explorer_70b {lay.label()} s{m.seq_len}: {wall:.1f} s, {cpu:.1f} CPU s")
    print(f"explorer_70b_median_s: {statistics.median(walls):.1f}  (over {len(walls)} changes; goal < 3)")


def main():
    if "--published" in sys.argv:
        return published_memory()
    if "--explorer" in sys.argv:
        return explorer()
    if "--mfu" in sys.argv:
        return published()
    cases = fake_cases.cases()
    llama = next(c for k, c in cases.items() if k.startswith("12.4.2") and "(128K)" in k)
    t0, c0 = time.perf_counter(), time.process_time()
    step = llama.simulate()
    print(f"fake_405b_16384_s: {time.perf_counter() - t0:.1f}")
    print(f"fake_405b_16384_cpu_s: {time.process_time() - c0:.1f}  (CPU seconds of this process: its wall time on a quiet machine)")
    if "--quick" not in sys.argv:
        t0 = time.perf_counter()
        full = llama.simulate(extrapolate=False, trace_layers=None, max_layer_passes=10_000)
        print(f"fake_405b_16384_full_s: {time.perf_counter() - t0:.1f}")
        same = full.memory == step.memory and full.comm == step.comm and full.flops == step.flops
        print(f"fake_405b_16384_extrapolated_equals_full: {same}")
    worst, worst_key = 0.0, None
    steps = {}
    for key, case in cases.items():
        s = step if case is llama else case.simulate()
        rows = {q: (a, b, f) for q, a, b, f in fake_cases.memory_rows(case, s)}
        _, planner, fake = rows["peak per device"]
        err = abs(fake / planner - 1)
        flops = case.model.flops_per_token() * case.global_batch * case.model.seq_len / case.layout.devices
        print(f"planner_vs_fake_rel_err {key}: {err:.3f}  (planner {planner / GB:.1f} GB, PyTorch {fake / GB:.1f} GB; "
              f"FLOPs PyTorch / planner {s.flops / flops:.3f})")
        if err > worst:
            worst, worst_key = err, key
        steps[key] = fake_world.step_time(s)
    print(f"planner_vs_fake_max_rel_err: {worst:.3f}  ({worst_key})")
    effs = []
    for key, st in steps.items():
        case = cases[key]
        flops = case.model.flops_per_token() * case.global_batch * case.model.seq_len / case.layout.devices
        effs.append(flops / (989e12 * st.breakdown["compute"]))
        print(f"compute_efficiency {key}: the trace's compute at {effs[-1]:.2f} of peak (model FLOPs; the planner "
              f"assumes {_planner_efficiency():.2f})")
    print(f"compute_efficiency_range: {min(effs):.2f} to {max(effs):.2f}, median {sorted(effs)[len(effs) // 2]:.2f}")
    for key, st in steps.items():
        recipe = _planner_recipe_step(cases[key], st)
        print(f"step_time {key}: {st.step_s:.2f} s, MFU {st.mfu:.3f}, " + ", ".join(
            f"{k} {v:.2f}" for k, v in st.breakdown.items()) + f"; planner {st.planner['step_s']:.2f} s "
              f"({st.planner['step_s'] / st.step_s - 1:+.3f}), told PyTorch's recipe {recipe:.2f} s "
              f"({recipe / st.step_s - 1:+.3f})")
    case = next(c for k, c in cases.items() if k.startswith("12.4.1 70B"))
    cpu = {}
    for timing in (False, True, True, False):
        c0 = time.process_time()
        case.simulate(timing=timing)
        cpu.setdefault(timing, []).append(time.process_time() - c0)
    print(f"timing_overhead: {sum(cpu[True]) / sum(cpu[False]):.3f}  (CPU seconds of simulate, with / without)")
    published()
    published_memory()
    explorer()


def _planner_efficiency() -> float:
    """The share of peak the planner's compute time assumes (data/hardware.json's modelling.efficiency)."""
    from helpers.planner import h100_cluster

    return h100_cluster(8).efficiency


def _planner_recipe_step(case, st) -> float:
    """The planner's step time for ``case`` told PyTorch's recipe (fake_cases.PYTORCH: FP32 gradients
    on the wire, the traced stages) on the cluster step_time's own planner figure uses."""
    from dataclasses import replace

    from helpers.planner import assess, h100_cluster

    extra = {"stage_layers": tuple(case.sim["stages"])} if "stages" in case.sim else {}
    rules = replace(case.rules, **fake_cases.PYTORCH, **extra)
    return assess(case.model, h100_cluster(case.layout.devices), case.global_batch, case.layout, rules).time["total"]


def published():
    try:
        from helpers.published import throughput_runs
    except ImportError:
        print("published_mfu_within_15pct: n/a  (helpers.published is not in this tree)")
        return
    from helpers.fake_world.timing import compare_published

    out = compare_published(throughput_runs())
    print(f"published_mfu_within_15pct: {out['within_15pct']}/{out['n']}")
    print(f"published_mfu_max_rel_err: {out['max_rel_err']:.3f}")
    for r in out["rows"]:
        print(f"published {r['id']}: {r['layout']} on {r['device']}: ours {r['ours']:.3f} ({r['compared']}) "
              f"published {r['published']:.3f}, rel err {r['rel_err']:+.3f}")
    for run_id, why in out["cannot"]:
        print(f"published_cannot {run_id}: {why}")


if __name__ == "__main__":
    main()
