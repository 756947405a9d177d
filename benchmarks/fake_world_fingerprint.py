"""Fingerprint of the fake world's results, to check that a speed-up changes nothing it measures.

Runs every case of :func:`helpers.fake_world.cases.cases` and the other fake-world runs the notebooks
make (12.1.1's BF16 reduction, 12.1.2's ZeRO-1 with 4 micro-batches, 12.3.2's CP-free comparison,
12.4.1's `check_layouts` of the first calibrated layout without a pipeline and a fixed list of the
12.4.1 explorer's layouts), and dumps every figure (memory by category at the peak and of each
phase, memory held after the step, per-layer figures, collectives, FLOPs, coordinates, notes;
not wall times) to a JSON file; two dumps must be byte-identical.

Also prints each run's CPU seconds (time.process_time()).

Run: python benchmarks/fake_world_fingerprint.py [out.json] [--only SUBSTRING]
"""
import json
import sys
import time
from dataclasses import asdict, replace

from helpers import fake_cases as fc
from helpers import fake_world as fw
from helpers import planner as pl

# the 12.4.1 explorer (fake_vs_planner): 70B, global batch 2048, trace_layers=2; its start layout and
# one change of each control
EXPLORER = [dict(tp=8, pp=1, dp=32, cp=1, micro_batch=1, seq_len=4096, zero=1, recompute="none"),
            dict(tp=8, pp=1, dp=32, cp=1, micro_batch=1, seq_len=4096, zero=1, recompute="full"),
            dict(tp=8, pp=1, dp=32, cp=1, micro_batch=1, seq_len=4096, zero=3, recompute="none"),
            dict(tp=8, pp=1, dp=32, cp=1, micro_batch=1, seq_len=4096, zero=2, recompute="none"),
            dict(tp=8, pp=1, dp=32, cp=1, micro_batch=1, seq_len=4096, zero=0, recompute="none"),
            dict(tp=8, pp=2, dp=16, cp=1, micro_batch=1, seq_len=4096, zero=1, recompute="none"),
            dict(tp=8, pp=1, dp=16, cp=2, micro_batch=1, seq_len=4096, zero=1, recompute="none"),
            dict(tp=8, pp=1, dp=32, cp=1, micro_batch=2, seq_len=2048, zero=1, recompute="none"),
            dict(tp=4, pp=2, dp=32, cp=1, micro_batch=1, seq_len=4096, zero=1, recompute="none")]


def runs():
    """(name, thunk returning a FakeStep or a list of rows) for every run fingerprinted."""
    cases = fc.cases()
    out = [(key, case.simulate) for key, case in cases.items()]
    k111 = next(k for k in cases if k.startswith("12.1.1"))
    out.append((k111 + " [reduce_dtype=bfloat16]", lambda: cases[k111].simulate(reduce_dtype="bfloat16")))
    k112 = next(k for k in cases if k.startswith("12.1.2") and "ZeRO-1" in k)
    out.append((k112 + " [micro_batches=4]", lambda: cases[k112].simulate(micro_batches=4)))
    k132 = next(k for k in cases if k.startswith("12.3.2"))
    c = cases[k132]
    alone = replace(c, model=replace(c.model, seq_len=131_072 // 8), layout=pl.Layout(dp=1, tp=8))
    out.append((k132 + " [alone]", alone.simulate))

    def check():
        m70 = cases["12.4.1 70B on 256 H100s: TP 8, DP 32, ZeRO-1"].model
        p = pl.plan(m70, pl.h100_cluster(256), 2048, pl.Rules(activation_model="pytorch"))
        shallow = next(a.layout for a in p.ranked if a.layout.pp == 1)
        return fc.check_layouts(p, [shallow])

    out.append(("12.4.1 check_layouts", check))
    for lay in EXPLORER:
        kw = dict(lay)
        m = pl.book_70b(kw.pop("seq_len"))
        layout = pl.Layout(**kw)
        out.append((f"12.4.1 explorer 70B {layout.label()} s{m.seq_len}",
                    lambda m=m, layout=layout: fw.simulate(m, layout, global_batch=2048, trace_layers=2)))
    return out


def figures(result):
    if isinstance(result, list):
        return result
    d = asdict(result)
    d.pop("wall_s")
    return _text_keys(d)


def _text_keys(obj):
    """``obj`` with every dict key that JSON cannot hold (the timing trace's op keys are tuples)
    written as its repr; values untouched (floats are dumped with repr: bit for bit)."""
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else repr(k): _text_keys(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_text_keys(v) for v in obj]
    return obj


def main():
    args = [a for a in sys.argv[1:]]
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1]
        del args[i:i + 2]
    path = args[0] if args else "/tmp/fake_world_fingerprint.json"
    dump, total = {}, 0.0
    for name, thunk in runs():
        if only and only not in name:
            continue
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            res = figures(thunk())
        except ValueError as e:  # a refused layout is a result too
            res = {"refused": str(e)}
        cpu = time.process_time() - c0
        total += cpu
        print(f"{cpu:7.1f} CPU s {time.perf_counter() - t0:7.1f} s  {name}", flush=True)
        dump[name] = res
    with open(path, "w") as f:
        json.dump(dump, f, indent=1, sort_keys=True, default=repr)
    print(f"total CPU s: {total:.1f}; wrote {path}")


if __name__ == "__main__":
    main()
