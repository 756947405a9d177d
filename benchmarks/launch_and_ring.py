"""Benchmark for the launcher and the hand-written ring (foundation issue, P.7).

Prints one `name: value` line per figure:
  launch_first_s                     wall time of the first 4-rank launch with one all-reduce
                                     (starts the worker processes)
  launch_repeat_s                    the same launch repeated in the same process (median of 5)
  ring_over_allreduce_<S>_<N>ranks   hand ring time / dist.all_reduce time, S in 1, 4, 16, 64 MB
Targets on the 2-core CI machine: launch_repeat_s < 3, ring_over_allreduce_16MB_4ranks < 1.5.
Run: python benchmarks/launch_and_ring.py   (timings; not a test)
"""
import time

from helpers import launcher
from helpers.collectives import time_allreduce_worker


def one_allreduce():
    import torch
    import torch.distributed as dist

    t = torch.ones(1024)
    dist.all_reduce(t)
    return t[0].item()


def main():
    launcher.shutdown()
    t0 = time.perf_counter()
    launcher.launch(one_allreduce, world_size=4, quiet=True)
    print(f"launch_first_s: {time.perf_counter() - t0:.3f}")
    repeats = []
    for _ in range(5):
        t0 = time.perf_counter()
        launcher.launch(one_allreduce, world_size=4, quiet=True)
        repeats.append(time.perf_counter() - t0)
    print(f"launch_repeat_s: {sorted(repeats)[2]:.3f}")
    sizes = {f"{mb}MB": mb * 2 ** 20 for mb in (1, 4, 16, 64)}
    for n in (2, 4):
        lib = launcher.launch(time_allreduce_worker, list(sizes.values()), 5, False, "median", world_size=n, quiet=True, timeout=300)
        hand = launcher.launch(time_allreduce_worker, list(sizes.values()), 5, True, "median", world_size=n, quiet=True, timeout=300)
        for name, s in sizes.items():
            # the slowest rank's median is the collective's time
            t_lib = max(r[s] for r in lib.results)
            t_hand = max(r[s] for r in hand.results)
            print(f"allreduce_{name}_{n}ranks_s: {t_lib:.4f}")
            print(f"ring_{name}_{n}ranks_s: {t_hand:.4f}")
            print(f"ring_over_allreduce_{name}_{n}ranks: {t_hand / t_lib:.2f}")
    launcher.shutdown()


if __name__ == "__main__":
    main()
