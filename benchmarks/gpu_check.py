"""Every distributed family on the GPUs with NCCL, checked against its single-process reference (issue 14).

    python benchmarks/gpu_check.py                # a CUDA machine: NCCL, one rank per GPU
    python benchmarks/gpu_check.py --cpu-dry-run  # the same demos on 4 gloo CPU ranks (what the tests run)

One line per demo: verdict, demo, ranks, largest error against the reference and the tolerance,
wall time. Then NCCL's all-reduce per message size: measured time, bus bandwidth
2(N-1)/N * S / t (nccl-tests' definition) and the alpha-beta model fitted to the measurements
(P.7, :func:`helpers.collectives.fit_alpha_beta`). Exit status: 0 when every demo passes, 1 when
one fails, 2 when no CUDA device is visible (and no ``--cpu-dry-run``).

The demos are the workers the notebooks run (data parallel, ZeRO-3 and FSDP2, tensor and
sequence parallel, pipeline, ring attention, 3D); each uses ``helpers.launcher.worker.device()``, so the
only CUDA-specific code here is the device selection and the synchronisation around the timed
all-reduces, both behind :func:`select`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from helpers import data_parallel as dp
from helpers import pipeline_parallel as ppl
from helpers import ring_attention as ra
from helpers import tensor_parallel as tp
from helpers import three_d as td
from helpers import zero as Z
from helpers.collectives import alpha_beta_time, fit_alpha_beta
from helpers.launcher import launch

DRY_RUN_RANKS = 4
TP_CFG = tp.BlockConfig(h=32, heads=4, ffn=64, p_drop=0.1, seed=5)


def select(cpu_dry_run: bool, gpus: int | None = None) -> tuple[str, int] | None:
    """``(backend, ranks)`` to check with: NCCL on every GPU, gloo on 4 CPU ranks for a dry run,
    None when there is no GPU and no dry run was asked for."""
    if cpu_dry_run:
        return "gloo", DRY_RUN_RANKS
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ("nccl", gpus) if gpus > 0 else None


class Skip(Exception):
    """A demo that does not fit on this many devices."""


def largest_fitting(n: int, allowed) -> int | None:
    """The largest world size in ``allowed`` that ``n`` devices hold (None when none fits)."""
    fits = [w for w in allowed if w <= n]
    return max(fits) if fits else None


def _fit(n: int, allowed) -> int:
    w = largest_fitting(n, allowed)
    if w is None:
        raise Skip(f"needs {min(allowed)} devices or more, {n} found")
    return w


def single_process(fn, *args, **kwargs):
    """Run a worker function in this process, as the only rank of a gloo group on the CPU."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return fn(*args, **kwargs)
    finally:
        dist.destroy_process_group()


def _max_diff(pairs) -> float:
    return max(float((a.cpu() - b.cpu()).abs().max()) for a, b in pairs)


# ---- the demos: each returns (ranks used, largest error, tolerance) ------------------------------

def demo_data_parallel(backend: str, n: int):
    ref, _ = dp.train_single(steps=3, batch=8 * n)
    run = launch(dp.ddp_train_worker, steps=3, batch=8 * n, world_size=n, backend=backend, quiet=True)
    return n, _max_diff((a, b) for res in run.results for a, b in zip(res["params"], ref)), 1e-9


def demo_zero_fsdp(backend: str, n: int):
    w = _fit(n, (2, 4))  # the MLP's layers divide by 2 and 4; the batch of 16 too
    ref = single_process(Z.ddp_reference_worker)["params"]  # plain PyTorch DDP on one process: the full batch
    hand = launch(Z.zero_train_worker, 3, world_size=w, backend=backend, quiet=True).results
    fsdp = launch(Z.fsdp2_worker, world_size=w, backend=backend, quiet=True).results
    err = max(Z.max_abs_diff(Z.assemble(hand), ref), Z.max_abs_diff(Z.assemble_dim0(fsdp), ref))
    return w, err, 1e-6


def demo_tensor_parallel(backend: str, n: int):
    w = _fit(n, (2, 4))  # 4 heads
    ref = tp.reference_step(TP_CFG, 8, 2)
    run = launch(tp.tp_block_worker, TP_CFG, 8, 2, world_size=w, backend=backend, quiet=True)
    return w, max(tp.max_differences(run.results, ref).values()), 1e-9


def demo_sequence_parallel(backend: str, n: int):
    w = _fit(n, (2, 4))  # 4 heads, a sequence of 8
    ref = tp.reference_step(TP_CFG, 8, 2)
    run = launch(tp.tp_block_worker, TP_CFG, 8, 2, sequence_parallel=True, world_size=w, backend=backend, quiet=True)
    return w, max(tp.max_differences(run.results, ref, sequence_parallel=True).values()), 1e-9


def demo_pipeline(backend: str, n: int):
    ref, _ = ppl.reference_grads()
    w = _fit(n, (2, 4, 8))  # 8 layers
    err = 0.0
    for schedule, m, v in (("1f1b", 8, 1), ("interleaved", 8, 2), ("zb-h1", 8, 1)):
        p = w if v == 1 else largest_fitting(w, (2, 4))  # interleaved: p*v stages divide 8 layers
        run = launch(ppl.pipeline_step_worker, schedule, m, v, world_size=p, backend=backend, quiet=True)
        err = max(err, ppl.max_grad_diff(ppl.gather_grads(run.results), ref))
    return w, err, 1e-9


def demo_ring_attention(backend: str, n: int):
    w = _fit(n, (2, 4, 8))  # zigzag: 2w chunks of the 64 positions
    run = launch(ra.ring_attention_worker, 64, 2, 8, scheme="zigzag", causal=True, world_size=w, backend=backend, quiet=True)
    cmp = ra.compare_results(run.results, 64, 2, 8, causal=True)
    rtol, atol = cmp["tolerance"]
    err = max(cmp["errors"].values())
    return w, (err if cmp["ok"] else float("inf")), atol


def demo_three_d(backend: str, n: int):
    if n < 2:
        raise Skip(f"needs 2 devices or more, {n} found")
    layout = (2, 2, 2) if n >= 8 else (1, 2, 2) if n >= 4 else (1, 1, 2)  # dp, pp, tp
    ref = td.reference_training()
    run = launch(td.three_d_worker, *layout, world_size=layout[0] * layout[1] * layout[2], backend=backend, quiet=True)
    return layout[0] * layout[1] * layout[2], td.max_param_diff(run.results, ref, tp=layout[2]), 1e-9


def cpu_and_device_tensors_worker():
    """An all-reduce of a CPU tensor and of one on this rank's device (gloo beside NCCL on GPUs)."""
    import torch
    import torch.distributed as dist

    from helpers.launcher.worker import device

    r = dist.get_rank()
    on_cpu, on_device = torch.full((4,), float(r + 1)), torch.full((4,), float(r + 1), device=device())
    dist.all_reduce(on_cpu)
    dist.all_reduce(on_device)
    return on_cpu, on_device


def demo_cpu_tensors(backend: str, n: int):
    run = launch(cpu_and_device_tensors_worker, world_size=n, backend=backend, quiet=True)
    want = float(n * (n + 1) // 2)
    return n, max(float((t - want).abs().max()) for res in run.results for t in res), 0.0


DEMOS = {
    "CPU and device tensors in one group": demo_cpu_tensors,
    "data parallel (DDP)": demo_data_parallel,
    "ZeRO-3 by hand and FSDP2": demo_zero_fsdp,
    "tensor parallel (Megatron block)": demo_tensor_parallel,
    "sequence parallel": demo_sequence_parallel,
    "pipeline (1F1B, interleaved, ZB-H1)": demo_pipeline,
    "ring attention (zigzag, causal)": demo_ring_attention,
    "3D (DP x PP x TP)": demo_three_d,
}


def run_demos(backend: str, n: int, names=None) -> list[dict]:
    """Run the demos (all, or ``names``); one row each: name, ok, ranks, err, tol, seconds, error."""
    rows = []
    for name, demo in DEMOS.items():
        if names is not None and name not in names:
            continue
        t0 = time.perf_counter()
        try:
            ranks, err, tol = demo(backend, n)
            rows.append({"name": name, "ok": err <= tol, "ranks": ranks, "err": err, "tol": tol,
                         "seconds": time.perf_counter() - t0, "error": None})
        except Skip as why:
            rows.append({"name": name, "ok": True, "ranks": None, "err": None, "tol": None,
                         "seconds": time.perf_counter() - t0, "error": None, "skipped": str(why)})
        except Exception as exc:  # a failing demo is a line of the report, not the end of it
            first = str(exc).splitlines()[0] if str(exc) else ""
            rows.append({"name": name, "ok": False, "ranks": None, "err": None, "tol": None,
                         "seconds": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {first}"[:300]})
    return rows


def format_row(row: dict) -> str:
    if row.get("skipped"):
        return f"SKIP  {row['name']:36s}  {row['skipped']}"
    verdict = "PASS" if row["ok"] else "FAIL"
    if row["error"] is not None:
        return f"{verdict}  {row['name']:36s}  {row['error']}  ({row['seconds']:.1f} s)"
    return (f"{verdict}  {row['name']:36s}  ranks={row['ranks']}  max_err={row['err']:.1e} (tol {row['tol']:.0e})"
            f"  {row['seconds']:.1f} s")


# ---- NCCL all-reduce bandwidth against the alpha-beta model -------------------------------------

def allreduce_times_worker(sizes_bytes, repeats: int = 10):
    """Median seconds of one float32 all-reduce per size on this rank, the device synchronised
    around each call (NCCL returns before the GPU has done the work)."""
    import torch
    import torch.distributed as dist

    from helpers.launcher.worker import device

    dev = device()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out = {}
    for size in sizes_bytes:
        x = torch.ones(max(1, int(size) // 4), device=dev)
        dist.all_reduce(x)  # warm-up: connections, buffers
        sync()
        times = []
        for _ in range(repeats):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            sync()
            times.append(time.perf_counter() - t0)
        out[int(size)] = statistics.median(times)
    return out


def bandwidth_table(backend: str, n: int, sizes) -> list[dict]:
    """Per size: the slowest rank's median time, the bus bandwidth, the fitted model's time."""
    run = launch(allreduce_times_worker, list(sizes), world_size=n, backend=backend, quiet=True)
    times = [max(r[int(s)] for r in run.results) for s in sizes]
    rows = [{"bytes": int(s), "seconds": t, "bus_GBps": 2 * (n - 1) / n * s / t / 1e9} for s, t in zip(sizes, times)]
    alpha, beta = fit_alpha_beta(n, sizes, times)  # ValueError when the times do not grow with size
    for row in rows:
        row["model_seconds"] = float(alpha_beta_time(n, row["bytes"], alpha, beta))
        row["alpha"], row["beta"] = alpha, beta
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="run the demos on 4 gloo CPU ranks instead")
    args = parser.parse_args(argv)
    chosen = select(args.cpu_dry_run)
    if chosen is None:
        print("no CUDA device visible: nothing to check on NCCL (--cpu-dry-run runs the same demos on CPU ranks)")
        return 2
    backend, n = chosen
    print(f"backend={backend} ranks={n}" + (" (CPU dry run)" if args.cpu_dry_run else ""))
    rows = run_demos(backend, n)
    for row in rows:
        print(format_row(row))
    sizes = [2 ** k for k in (range(14, 23, 2) if args.cpu_dry_run else range(16, 31, 2))]
    if n < 2:
        print("all-reduce bandwidth: needs 2 ranks or more")
    else:
        try:
            table = bandwidth_table(backend, n, sizes)
        except ValueError as exc:
            print(f"all-reduce bandwidth: no alpha-beta fit ({exc})")
        else:
            print(f"all-reduce on {n} ranks ({backend}): alpha = {table[0]['alpha'] * 1e6:.1f} us, "
                  f"beta = {table[0]['beta'] / 1e9:.2f} GB/s (fitted)")
            for row in table:
                print(f"  {row['bytes']:>11,d} B  measured {row['seconds'] * 1e3:9.3f} ms  bus {row['bus_GBps']:7.2f} GB/s"
                      f"  model {row['model_seconds'] * 1e3:9.3f} ms  measured/model {row['seconds'] / row['model_seconds']:.2f}")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
