"""The launcher: backend choice, notebook functions, output, failures, hangs, no orphans."""
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import launcher
from helpers import pool as kernel_pool
from helpers.launcher import LaunchTimeout, RankError, launch, plan_ranks

ROOT = Path(__file__).resolve().parents[1]

# ---- backend and device selection, with the GPU count faked --------------------------------

def test_no_gpu_gives_gloo_on_four_cpu_ranks():
    plan = plan_ranks(gpus=0)
    assert (plan.backend, plan.device_type, plan.world_size) == ("gloo", "cpu", 4)
    assert "no GPU found" in plan.describe()


def test_gpus_give_nccl_one_rank_per_gpu():
    plan = plan_ranks(gpus=8)
    assert (plan.backend, plan.device_type, plan.world_size) == ("nccl", "cuda", 8)
    assert plan_ranks(world_size=2, gpus=8).world_size == 2


def test_more_ranks_than_gpus_falls_back_to_cpu_and_says_so():
    plan = plan_ranks(world_size=4, gpus=2)
    assert (plan.backend, plan.device_type, plan.world_size) == ("gloo", "cpu", 4)
    assert "only 2 GPU(s)" in plan.describe()


def test_forced_gloo_ignores_gpus():
    assert plan_ranks(world_size=2, backend="gloo", gpus=4).device_type == "cpu"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"world_size": 0, "gpus": 0}, "world_size must be an integer >= 1"),
        ({"world_size": -3, "gpus": 0}, "world_size must be an integer >= 1"),
        ({"world_size": 2.0, "gpus": 0}, "world_size must be an integer >= 1"),
        ({"backend": "mpi", "gpus": 0}, "unknown backend 'mpi': allowed are"),
        ({"backend": "nccl", "gpus": 0}, "needs at least one GPU"),
        ({"backend": "nccl", "world_size": 4, "gpus": 2}, "world_size=4 needs 4 GPUs, 2 visible"),
        ({"world_size": 1000, "gpus": 0}, "more than this launcher allows"),
    ],
)
def test_bad_input_is_rejected_with_the_constraint(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_ranks(**kwargs)


def test_only_large_gloo_jobs_connect_lazily():
    assert [launcher.lazy_connect(plan_ranks(n, gpus=0)) for n in (2, 4, 8, 16)] == [False, False, False, True]
    assert not launcher.lazy_connect(plan_ranks(16, gpus=16))  # NCCL: not a gloo setting


# ---- the messages between kernel and ranks, and /proc ------------------------------------------

def test_every_message_crosses_a_pipe_by_pickle_unchanged():
    from helpers import protocol as p

    messages = [
        p.Job(3, b"payload", "gloo", 4, True, collective_timeout=35.0, lazy_connect=False, profile_dir=None),
        p.StatusQuery(3), p.Ready(1234), p.Output(3, "stdout", "hello\n"),
        p.Done(3, b"result", [], [], t_start=1.0, t_end=2.0, trace=("rank0.json", 5.0)),
        p.Failed(3, "ValueError: boom", "Traceback ...", "run"), p.Idle(3), p.Status(3, {"phase": "running"}),
    ]
    assert [pickle.loads(pickle.dumps(m)) for m in messages] == messages
    assert all(type(m).__module__ == "helpers.launcher.protocol" and type(m).__doc__ for m in messages)


def test_the_kernel_side_imports_neither_torch_nor_the_rank_code():
    code = ("import sys\n"
            "from helpers import collect, hang, pool, procfs, protocol\n"
            "print(sorted(m for m in ('torch', 'helpers.launcher.worker') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads Linux's /proc")
def test_proc_stat_tells_a_live_process_from_a_zombie_and_a_reaped_one():
    from helpers.launcher.procfs import process_ended, start_ticks

    assert not process_ended(os.getpid()) and start_ticks(os.getpid()) not in (None, "")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while start_ticks(child.pid) is not None and time.monotonic() < deadline:  # exited, not yet reaped
        time.sleep(0.01)
    assert os.path.exists(f"/proc/{child.pid}"), "a zombie until reaped"
    assert process_ended(child.pid) and start_ticks(child.pid) is None
    child.wait()
    assert process_ended(child.pid) and start_ticks(child.pid) is None


def _lazy_setting():
    import os

    return os.environ.get("TORCH_GLOO_LAZY_INIT")


def test_the_connection_mode_reaches_the_ranks_per_job():
    assert launch(_lazy_setting, world_size=2, quiet=True).results == ["0", "0"]
    assert set(launch(_lazy_setting, world_size=9, quiet=True).results) == {"1"}


def test_the_default_timeout_grows_with_the_number_of_ranks():
    assert [launcher.default_timeout(n) for n in (1, 4, 8, 16)] == [30.0, 30.0, 60.0, 120.0]


def test_launch_rejects_bad_arguments_before_starting_anything():
    with pytest.raises(ValueError, match="fn must be callable"):
        launch(42)
    with pytest.raises(ValueError, match="timeout must be a finite number > 0"):
        launch(print, timeout=0)


# ---- running for real on CPU ranks -----------------------------------------------------------

def _allreduce_rank_plus_one():
    import torch
    import torch.distributed as dist

    t = torch.full((256,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    print(f"sum={t[0].item():g}")
    return {"rank": dist.get_rank(), "sum": t[0].item()}


def test_results_output_and_comm_log_come_back(capsys):
    run = launch(_allreduce_rank_plus_one, world_size=4)
    assert [r["rank"] for r in run.results] == [0, 1, 2, 3]
    assert all(r["sum"] == 10.0 for r in run.results)
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("backend=gloo device=cpu world_size=4")
    assert [l for l in out.splitlines() if l.startswith("[rank")] == [f"[rank {r}] sum=10" for r in range(4)]
    for r in range(4):
        (op,) = run.comm[r]
        assert (op.op, op.bytes, op.group_size) == ("all_reduce", 256 * 4, 4)
        assert op.model_sent == pytest.approx(2 * 3 / 4 * 1024)


def test_a_repeated_launch_reuses_the_workers():
    launch(_allreduce_rank_plus_one, world_size=2, quiet=True)
    pids = launcher.live_worker_pids()
    run = launch(_allreduce_rank_plus_one, world_size=2, quiet=True)
    # the same processes served both jobs; the speed of a repeat launch is the benchmark's business
    assert not run.started_pool and launcher.live_worker_pids() == pids


def _modules_before_the_first_op():
    import sys

    return {m: m in sys.modules for m in ("torch", "torch.distributed", "torch._dynamo", "cloudpickle")}


def test_workers_start_with_what_the_first_op_would_otherwise_import():
    # the recorder is a TorchDispatchMode; the first op under it imports torch._dynamo, 3-4 s of
    # CPU per rank when not already loaded: the forkserver loads it once for all workers
    launcher.shutdown()
    run = launch(_modules_before_the_first_op, world_size=2, quiet=True)
    assert run.started_pool and all(all(r.values()) for r in run.results), run.results


NOTEBOOK_CELL = '''
import torch, torch.distributed as dist
SCALE = 3.0
def notebook_worker(x):
    t = torch.tensor([x * SCALE * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()
'''


def test_a_function_defined_in_a_notebook_main_module_runs():
    namespace = {"__name__": "__main__"}
    exec(NOTEBOOK_CELL, namespace)  # what a notebook cell does: the function lives in __main__
    fn = namespace["notebook_worker"]
    assert fn.__module__ == "__main__"
    run = launch(fn, 2.0, world_size=3, quiet=True)
    assert run.results == [2.0 * 3.0 * 6] * 3


def _spans_and_p2p():
    import torch
    import torch.distributed as dist

    from helpers.launcher.commlog import span

    rank = dist.get_rank()
    with span("compute"):
        t = torch.arange(10, dtype=torch.float64)
    with span("comm"):
        if rank == 0:
            dist.send(t, 1)
        elif rank == 1:
            dist.recv(t, 0)
    return t.sum().item()


def test_spans_and_point_to_point_bytes_are_recorded():
    run = launch(_spans_and_p2p, world_size=2, quiet=True)
    assert run.bytes_sent(0) == 80 and run.bytes_sent(1) == 0
    assert run.count("recv", rank=1) == 1
    assert [s.name for s in run.spans[0]] == ["compute", "comm"]
    assert all(s.end >= s.start >= 0 for s in run.spans[0])


# ---- bounded failure -------------------------------------------------------------------------

def _rank_two_raises():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 2:
        print("about to fail")
        raise ZeroDivisionError("rank two divides by zero")
    t = torch.ones(4)
    dist.all_reduce(t)  # the others wait here for rank 2, which never comes
    return 1


def test_a_raising_rank_raises_with_its_number_and_traceback_quickly(capsys, warm_workers):
    warm_workers(4)
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(_rank_two_raises, world_size=4, timeout=20, quiet=True)
    elapsed = time.monotonic() - t0
    assert info.value.rank == 2
    assert "ZeroDivisionError: rank two divides by zero" in str(info.value)
    assert "_rank_two_raises" in info.value.remote_traceback
    assert elapsed < 8, elapsed  # not the 20 s collective timeout
    assert "[rank 2] about to fail" in capsys.readouterr().out
    assert launcher.live_worker_pids() == []
    assert launch(_allreduce_rank_plus_one, world_size=2, quiet=True).results[0]["sum"] == 3.0


def _rank_one_skips_the_collective():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(60)  # busy elsewhere, never joins the collective (and keeps its connections)
    else:
        dist.all_reduce(torch.ones(2))
    return dist.get_rank()


def test_a_rank_stuck_in_a_collective_fails_after_the_timeout_naming_the_absent_rank(warm_workers):
    warm_workers(2)
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(_rank_one_skips_the_collective, world_size=2, timeout=3, quiet=True)
    elapsed = time.monotonic() - t0
    assert str(info.value).startswith("rank 0 waiting in all_reduce #1 (group of 2); rank 1 never entered it "
                                      "(last: at _rank_one_skips_the_collective, line ")
    assert info.value.blamed == [1]
    assert 2.9 < elapsed < 3 + launcher._GRACE + 2, elapsed
    assert launcher.live_worker_pids() == []


def _rank_zero_loops_forever():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print("spinning")
        while True:
            time.sleep(0.05)
    return 0


def test_a_hung_rank_outside_collectives_is_killed_after_the_timeout(warm_workers):
    warm_workers(2)
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(_rank_zero_loops_forever, world_size=2, timeout=2, quiet=True)
    elapsed = time.monotonic() - t0
    assert info.value.ranks == [0]
    assert "spinning" in str(info.value)
    assert elapsed < 2 + launcher._GRACE + 3, elapsed
    assert launcher.live_worker_pids() == []


def test_no_worker_outlives_shutdown():
    launch(_allreduce_rank_plus_one, world_size=2, quiet=True)
    pids = launcher.live_worker_pids()
    assert len(pids) >= 2
    launcher.shutdown()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            _wait_gone(pid)
            os.kill(pid, 0)


def _wait_gone(pid, limit=5.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def _sleepy(seconds):
    time.sleep(seconds)
    return 0


def test_an_interrupt_in_the_notebook_ends_every_worker():
    import signal
    import threading

    launch(_allreduce_rank_plus_one, world_size=2, quiet=True)  # a warm pool
    # a kernel always has a SIGINT handler; a suite started in the background of a non-interactive
    # shell inherits SIGINT ignored (POSIX), where no interrupt could ever arrive: install Python's
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    # the Jupyter stop button sends SIGINT to the kernel process
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(_sleepy, 30, world_size=2, quiet=True)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    assert time.monotonic() - t0 < 10  # not the job's 30 s
    assert launcher.live_worker_pids() == []


def _counts_with_comm_debug_mode():
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor.debug import CommDebugMode

    n = dist.get_world_size()
    x = torch.ones(4 * n)
    with CommDebugMode() as mode:
        dist.all_reduce(x)
        dist.all_reduce(x)
        out = torch.empty(4 * n * n)
        dist.all_gather_single(out, x)
        piece = torch.empty(4)
        dist.reduce_scatter_single(piece, x)
    return {str(k): v for k, v in mode.get_comm_counts().items()}


def test_the_comm_log_agrees_with_pytorchs_comm_debug_mode():
    run = launch(_counts_with_comm_debug_mode, world_size=2, quiet=True)
    theirs = run.results[0]
    ours = {op: run.count(op) for op in ("all_reduce", "all_gather", "reduce_scatter")}
    assert ours == {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}
    assert sum(theirs.values()) == sum(ours.values()), theirs
    assert theirs.get("c10d.allreduce_", theirs.get("c10d.allreduce_.default")) == 2, theirs
    n = 2
    assert [o.bytes for o in run.comm[0]] == [16 * n, 16 * n, 16 * n * n, 16 * n]


TWO_KERNELS = """
from helpers.launcher import launch
def w(k):
    import torch, torch.distributed as dist
    t = torch.tensor([float(k)])
    dist.all_reduce(t)
    return t.item()
if __name__ == "__main__":
    for _ in range(3):
        run = launch(w, {k}, world_size=3, quiet=True)
        assert run.results == [3.0 * {k}] * 3, run.results
    print("ok {k}")
"""


def test_two_kernels_launching_at_once_do_not_collide(tmp_path):
    procs = []
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's helpers, in the kernels and their workers
    for k in (1, 2):
        script = tmp_path / f"kernel{k}.py"
        script.write_text(TWO_KERNELS.replace("{k}", str(k)))
        procs.append(subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    outs = [p.communicate(timeout=120) for p in procs]
    for k, (p, (out, err)) in zip((1, 2), zip(procs, outs)):
        assert p.returncode == 0 and f"ok {k}" in out, err[-2000:]


def _subgroup_collectives():
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    pair, other = dist.new_group([0, 1]), dist.new_group([2, 3])  # every rank creates every group
    mine = pair if rank < 2 else other
    dist.all_reduce(torch.ones(8), group=mine)
    dist.all_reduce(torch.ones(8))
    if rank < 2:
        dist.send(torch.ones(2), 1 - rank, group=mine) if rank == 0 else dist.recv(torch.ones(2), 0, group=mine)
    return rank


def test_the_comm_log_records_the_size_of_the_group_not_the_world():
    run = launch(_subgroup_collectives, world_size=4, quiet=True)
    for r in range(4):
        sizes = [o.group_size for o in run.comm[r] if o.op == "all_reduce"]
        assert sizes == [2, 4], (r, sizes)
    sub = run.comm[0][0]
    assert sub.model_sent == 2 * 1 / 2 * 32


def test_workers_report_idle_after_tearing_down_and_a_busy_pool_is_replaced(monkeypatch, capsys):
    launch(_allreduce_rank_plus_one, world_size=2, quiet=True)
    pool = kernel_pool._POOL
    assert pool.wait_idle(range(len(pool.procs)), 10.0) and pool.busy == set()
    pool.busy.add(1)  # pretend rank 1 never finished its teardown
    monkeypatch.setattr(kernel_pool, "_IDLE_WAIT", 0.2)
    run = launch(_allreduce_rank_plus_one, world_size=2, quiet=True)
    assert run.started_pool and kernel_pool._POOL is not pool
    assert "still busy with the last job" in capsys.readouterr().err


def _rank_one_dies():
    import os

    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(7)  # no Python error: a lost host, the OOM killer
    dist.all_reduce(torch.ones(2))
    return 0


def test_a_rank_whose_process_dies_is_named_as_the_cause():
    with pytest.raises(RankError) as info:
        launch(_rank_one_dies, world_size=3, timeout=20, quiet=True)
    assert info.value.rank == 1 and "exit code 7" in str(info.value)
    assert launcher.live_worker_pids() == []
