"""Benchmark: the launcher under faults (issue 14). Prints one `name: value` line per figure.

  interrupt_to_exception_s_<N>ranks   SIGINT to KeyboardInterrupt, N ranks spinning (median of 3)
  interrupt_to_all_gone_s_<N>ranks    SIGINT to the last worker process gone
  hang_past_timeout_s_<N>ranks        LaunchTimeout minus the timeout (2 s), a rank skipping a barrier
  parent_death_to_workers_gone_s      kill -9 of a kernel (left an unreaped zombie) to its workers gone
  recorder_us_per_op                  the communication recorder's cost per plain torch op (median of 5)
  recorder_us_per_collective          its bookkeeping per all_reduce: bytes, group, sequence number
Targets (issue 14): interrupt under 0.5 s and a hang within timeout + 1 s for 8 ranks; workers
gone within about a second of their kernel's death; the recorder about 3-4 µs per op.
Run: python benchmarks/launcher_faults.py   (timings; not a test. Quote them with the machine's load.)
"""
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

from helpers import launcher
from helpers.launcher import LaunchTimeout, RankError, launch


def spin():
    while True:
        pass


def spin_or_wait():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        spin()
    dist.barrier()


def nothing():
    return 0


def _gone(pids) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    return False
        except FileNotFoundError:
            pass
    return True


def interrupt(n: int) -> tuple[float, float]:
    launch(nothing, world_size=n, quiet=True)
    pids = launcher.live_worker_pids()
    sent = []
    timer = threading.Timer(1.0, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT)))
    timer.start()
    try:
        launch(spin, world_size=n, quiet=True, timeout=60)
    except KeyboardInterrupt:
        raised = time.perf_counter()
    while not _gone(pids):
        time.sleep(0.001)
    return raised - sent[0], time.perf_counter() - sent[0]


def hang(n: int, timeout: float = 2.0) -> float:
    launch(nothing, world_size=n, quiet=True)
    t0 = time.perf_counter()
    try:
        launch(spin_or_wait, world_size=n, quiet=True, timeout=timeout)
    except (LaunchTimeout, RankError):  # before issue 14, a hang in a collective came as a RankError
        return time.perf_counter() - t0 - timeout
    raise AssertionError("the job should have hung")


ZOMBIE = """
from helpers.launcher import launch, live_worker_pids
def spin():
    while True:
        pass
if __name__ == "__main__":
    launch(lambda: 0, world_size=2, quiet=True)
    print(*live_worker_pids(), flush=True)
    launch(spin, world_size=2, quiet=True, timeout=600)
"""


def parent_death() -> float:
    proc = subprocess.Popen([sys.executable, "-c", ZOMBIE], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)  # not reaped until the workers are gone: a zombie meanwhile
    t0 = time.perf_counter()
    while not _gone(pids) and time.perf_counter() - t0 < 30:
        time.sleep(0.001)
    took = time.perf_counter() - t0
    proc.wait()
    return took


def recorder_cost() -> tuple[float, float]:
    """µs the recorder adds per plain torch op (CPU time, the dispatch mode on vs off) and µs its
    bookkeeping of one all_reduce takes (payload, group, sequence number), medians of 5."""
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    from helpers.launcher.commlog import CommLog

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    x = torch.ones(4)
    seen = []

    class Capture(TorchDispatchMode):  # the arguments a c10d all_reduce reaches the recorder with
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "c10d":
                seen.append(list(args) + list((kwargs or {}).values()))
            return func(*args, **(kwargs or {}))

    with Capture():
        dist.all_reduce(x)

    def per_call(fn, n):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        return (time.process_time() - t0) / n

    plain, coll = [], []
    for _ in range(5):
        off = per_call(lambda: x.add_(1), 20000)
        with CommLog() as log:
            on = per_call(lambda: x.add_(1), 20000)
        plain.append(on - off)
        coll.append(per_call(lambda: log.record("all_reduce", 16, seen[0], "allreduce_"), 20000))
    dist.destroy_process_group()
    return 1e6 * statistics.median(plain), 1e6 * statistics.median(coll)


def main():
    print(f"load_average_1min: {os.getloadavg()[0]:.2f}")
    for n in (2, 4, 8):
        runs = [interrupt(n) for _ in range(3)]
        print(f"interrupt_to_exception_s_{n}ranks: {statistics.median(r[0] for r in runs):.3f}")
        print(f"interrupt_to_all_gone_s_{n}ranks: {statistics.median(r[1] for r in runs):.3f}")
    for n in (2, 8):
        print(f"hang_past_timeout_s_{n}ranks: {statistics.median(hang(n) for _ in range(3)):.3f}")
    launcher.shutdown()
    print(f"parent_death_to_workers_gone_s: {parent_death():.3f}")
    per_op, per_coll = recorder_cost()
    print(f"recorder_us_per_op: {per_op:.2f}")
    print(f"recorder_us_per_collective: {per_coll:.2f}")
    print(f"load_average_1min: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
