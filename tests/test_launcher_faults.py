"""The launcher under faults (issue 14): interrupts, hangs, sockets, unpickling, a killed kernel, litter.

Timings asserted here are the issue's bounds with slack for a loaded two-core machine;
``benchmarks/launcher_faults.py`` prints the real figures.
"""
import importlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import launcher
from helpers import pool as kernel_pool
from helpers.launcher import LaunchTimeout, RankError, launch

ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    """Alive and not a zombie (a killed process nobody has reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


def _wait_all_gone(pids, limit: float) -> float | None:
    """Seconds until none of ``pids`` is alive, or None if some still are after ``limit``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if not any(_alive(p) for p in pids):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def _spin():
    while True:
        pass


def _nothing():
    return 0


def _allreduce():
    import torch
    import torch.distributed as dist

    t = torch.ones(2)
    dist.all_reduce(t)
    return t[0].item()


# ---- 1 and 2: interrupts -----------------------------------------------------------------------------

def test_any_number_of_interrupts_ends_every_worker_at_once(warm_workers):
    warm_workers(8)
    pids = launcher.live_worker_pids()
    assert len(pids) == 8
    delivered = []

    def kernel_handler(signum, frame):
        # what Python's default handler does, but only inside launch(): an interrupt that comes
        # after launch() returned is counted instead of failing the test
        delivered.append(time.monotonic())
        while frame is not None:
            if frame.f_code is launcher.launch.__code__:
                raise KeyboardInterrupt
            frame = frame.f_back

    presses = [0.8, 0.85, 0.95, 1.1, 1.4]  # the first, then the stop button again and again
    old = signal.signal(signal.SIGINT, kernel_handler)
    timers = [threading.Timer(t, os.kill, (os.getpid(), signal.SIGINT)) for t in presses]
    try:
        for t in timers:
            t.start()
        with pytest.raises(KeyboardInterrupt):
            launch(_spin, world_size=8, timeout=60, quiet=True)
        raised = time.monotonic()
        for t in timers:
            t.join()
        time.sleep(0.1)
    finally:
        for t in timers:
            t.cancel()
        signal.signal(signal.SIGINT, old)
    assert delivered  # the first press reached launch(); the others were held while it cleaned up
    gone = _wait_all_gone(pids, 3.0)
    assert gone is not None, [p for p in pids if _alive(p)]  # issue, point 1: none left behind
    # issue, point 2: interrupt to KeyboardInterrupt under 0.5 s for 8 busy ranks (the benchmark
    # measures it); here with slack for a loaded machine, and until the last worker is gone
    assert raised - delivered[0] < 2.0 and time.monotonic() - delivered[0] < 2.5, (raised - delivered[0], gone)
    assert launcher.live_worker_pids() == []
    assert launch(_allreduce, world_size=2, quiet=True).results == [2.0, 2.0]


def _spin_or_wait():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        _spin()
    dist.barrier()


def test_a_hang_of_8_ranks_raises_within_the_timeout_and_a_second(warm_workers):
    warm_workers(8)
    pids = launcher.live_worker_pids()
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(_spin_or_wait, world_size=8, timeout=1.5, quiet=True)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.5 + 1.0 + 1.0, elapsed  # issue: timeout + 1 s; 1 s of slack for load
    assert info.value.ranks == list(range(8)) and info.value.blamed == [0]
    assert _wait_all_gone(pids, 1.0) is not None


# ---- 3: loopback only --------------------------------------------------------------------------------

def _listening(pid="self") -> list:
    """The addresses of the listening TCP sockets that process ``pid`` holds (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    host, port = cols[1].split(":")
                    raw = bytes.fromhex(host)
                    # /proc prints each 32-bit word in host (little-endian) order
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    found.append((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def _my_listening_sockets():
    import torch.distributed as dist

    dist.barrier()  # every rank's gloo pairs are connected: their listeners exist
    return _listening()


@pytest.mark.skipif(not os.path.isdir("/proc/self/net"), reason="reads Linux's /proc")
def test_every_listening_socket_of_a_cpu_job_is_on_loopback():
    run = launch(_my_listening_sockets, world_size=2, quiet=True)
    store_port = kernel_pool._POOL.store.port
    mine = _listening()
    assert any(port == store_port for _, port in mine), (store_port, mine)  # the store is seen
    for owner, socks in [("launcher", mine)] + [(f"rank {r}", s) for r, s in enumerate(run.results)]:
        assert socks, owner  # gloo listens in every rank: the check is not vacuous
        assert all(ipaddress.ip_address(host).is_loopback for host, _ in socks), (owner, socks)


# ---- 4: a hang names the rank that never came --------------------------------------------------------

def _rank_one_skips_the_fifth_all_reduce():
    import torch
    import torch.distributed as dist

    from helpers.launcher.commlog import span

    x = torch.ones(4)
    for _ in range(4):
        dist.all_reduce(x)
    if dist.get_rank() == 1:
        with span("compute"):
            time.sleep(60)
    dist.all_reduce(x)


def test_a_hang_names_the_rank_that_never_entered_the_collective(warm_workers):
    warm_workers(4)
    with pytest.raises(LaunchTimeout) as info:
        launch(_rank_one_skips_the_fifth_all_reduce, world_size=4, timeout=1.5, quiet=True)
    err = info.value
    assert str(err).splitlines()[0] == \
        "ranks 0, 2, 3 waiting in all_reduce #5 (group of 4); rank 1 never entered it (last: span 'compute')"
    assert err.blamed == [1] and err.ranks == [0, 1, 2, 3]
    assert "rank 1: not in a torch.distributed call, in span 'compute'" in str(err)
    assert launcher.live_worker_pids() == []


class _Op:  # what the diagnosis reads of a commlog.CommOp
    def __init__(self, op, seq, group="0", group_size=4, peer=None):
        self.op, self.seq, self.group, self.group_size, self.peer = op, seq, group, group_size, peer


def _state(op=None, call=None, counts=None, span=None, where="w, line 1", groups=None):
    return {"phase": "running", "dist_call": call, "last_op": op, "counts": counts or {}, "span": span,
            "where": where, "groups": groups or {"0": (0, 1, 2, 3)}}


def test_the_diagnosis_names_a_mismatch_a_missing_send_and_a_loop():
    from helpers.launcher.hang import diagnose

    ar = lambda: _state(_Op("all_reduce", 1), "all_reduce", {("0",): 1})
    mismatch = diagnose({0: ar(), 1: ar(), 2: ar(), 3: _state(_Op("all_gather", 1), "all_gather", {("0",): 1})}, range(4))
    assert mismatch.headline == "ranks 0, 1, 2 waiting in all_reduce #1 (group of 4); rank 3 in all_gather #1 instead (mismatched collectives)"
    assert mismatch.blamed == [3]
    p2p = diagnose({0: _state(_Op("recv", 3, peer=1), "recv", {("0", "recv", 1): 3}),
                    1: _state(_Op("send", 2, peer=0), None, {("0", "send", 0): 2}, span="compute")}, [0, 1])
    assert p2p.headline == "rank 0 waiting in recv #3 from rank 1; rank 1 never issued its send (last: span 'compute')"
    assert p2p.blamed == [1]
    loop = diagnose({0: _state(where="train, line 7"), 1: None}, [0, 1], finished=[2, 3])
    assert loop.headline == ("rank 0 not in a torch.distributed call (last: at train, line 7); "
                             "rank 1 not in a torch.distributed call (last: did not answer)")
    assert loop.blamed == [0, 1]
    finished = diagnose({0: ar()}, [0], finished=[1, 2, 3])
    assert finished.headline.startswith("rank 0 waiting in all_reduce #1 (group of 4); rank 1 finished without entering it")
    assert finished.blamed == [1, 2, 3]


# ---- 5: an argument that cannot be unpickled on the ranks ------------------------------------------

class _ImportsOnLoad:
    """Pickles fine here; unpickling it on a rank imports a module that does not exist there."""

    def __reduce__(self):
        return (importlib.import_module, ("helpers_no_such_module_issue14",))


def _takes(arg):
    return 1


def test_an_argument_that_fails_to_unpickle_is_a_rank_error_and_the_workers_stay(warm_workers):
    warm_workers(2)
    pids = launcher.live_worker_pids()
    with pytest.raises(RankError) as info:
        launch(_takes, _ImportsOnLoad(), world_size=2, quiet=True)
    err = info.value
    assert "ModuleNotFoundError: No module named 'helpers_no_such_module_issue14'" in str(err)
    assert "import_module" in err.remote_traceback and "cloudpickle" in err.remote_traceback
    assert err.workers_kept and launcher.live_worker_pids() == pids
    run = launch(_allreduce, world_size=2, quiet=True)
    assert run.results == [2.0, 2.0] and not run.started_pool


# ---- a failed connection while the ranks start: retried once, since nothing ran ---------------------

def _rank_one_fails_its_next_connection():
    """Make this worker's next init_process_group fail as gloo's full-mesh connect does under load."""
    import torch.distributed as dist

    if dist.get_rank() != 1:
        return
    real = dist.init_process_group

    def fail_once(*args, **kwargs):
        dist.init_process_group = real
        raise RuntimeError("Gloo connectFullMesh failed with [pair.cc:553] Connection closed by peer [127.0.0.1]:1")

    dist.init_process_group = fail_once


def _ranks_that_ran():
    import torch.distributed as dist

    print("ran")
    return dist.get_rank()


def test_a_connection_failure_before_any_rank_ran_is_retried_once_with_fresh_workers(warm_workers, capfd):
    warm_workers(3)
    launch(_rank_one_fails_its_next_connection, world_size=3, quiet=True)
    pids = launcher.live_worker_pids()
    run = launch(_ranks_that_ran, world_size=3, quiet=True, timeout=20)
    assert run.results == [0, 1, 2] and run.outputs == ["ran\n"] * 3  # the function ran once per rank
    assert run.started_pool and not set(launcher.live_worker_pids()) & set(pids)
    assert "rank 1 could not connect to its peers (RuntimeError: Gloo connectFullMesh failed" in capfd.readouterr().err


# ---- 6, 7, 9: a script interrupted while the pool starts, then killed -9 (left a zombie) -------------

KERNEL = r'''
import multiprocessing.forkserver as fs, os, signal, sys, threading, time
from helpers.launcher import launch, live_worker_pids

def w():
    import torch, torch.distributed as dist
    t = torch.ones(2)
    dist.all_reduce(t)
    return t[0].item()

def spin():
    while True:
        pass

def interrupt_while_the_forkserver_imports_torch():
    while fs._forkserver._forkserver_pid is None:
        time.sleep(0.01)
    # the launcher ignores SIGINT while it spawns the forkserver (a documented window: an interrupt
    # there is lost, never half-handled); a starved main thread could still be in it: wait it out
    while signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        time.sleep(0.01)
    time.sleep(0.5)  # the forkserver is importing torch, torch._dynamo (seconds)
    os.killpg(os.getpgrp(), signal.SIGINT)  # what Jupyter's interrupt does: the whole group

if __name__ == "__main__":
    # a Jupyter kernel always handles SIGINT; this process may have inherited it ignored (a suite
    # started in the background of a non-interactive shell), where no interrupt could arrive
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_while_the_forkserver_imports_torch, daemon=True).start()
    try:
        launch(w, world_size=2, quiet=True)
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    for attempt in range(3):  # the issue: after such an interrupt the next launch failed (EOFError)
        try:
            print("second launch", launch(w, world_size=2, quiet=True).results, flush=True)
            break
        except Exception as exc:
            print("launch failed:", type(exc).__name__, flush=True)
    print("pids", *live_worker_pids(), flush=True)
    launch(spin, world_size=2, quiet=True, timeout=600)
'''


def _litter(folder) -> list[str]:
    # torch's compiler cache (``torchinductor_<user>``, made when the forkserver imports
    # torch._dynamo) is one shared folder per user, reused by every run: not litter
    return sorted(n for n in os.listdir(folder) if not n.startswith("torchinductor_"))


@pytest.fixture(scope="module")
def killed_kernel(tmp_path_factory):
    """Run KERNEL in its own session and TMPDIR, wait for its busy workers, ``kill -9`` it, don't reap it."""
    tmp = tmp_path_factory.mktemp("kernel_tmp")
    script = tmp_path_factory.mktemp("kernel_script") / "kernel.py"
    script.write_text(KERNEL)
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    lines, pids = [], []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        lines.append(line.strip())
        if line.startswith("pids"):
            pids = [int(p) for p in line.split()[1:]]
            break
    out = {"lines": lines, "pids": pids, "tmp": tmp, "pid": proc.pid}
    if pids:
        time.sleep(0.5)  # the spinning job has started
        before = _litter(tmp)
        os.kill(proc.pid, signal.SIGKILL)  # not waited for: the kernel stays a zombie
        out["gone_after"] = _wait_all_gone(pids, 15.0)
        out["zombie"] = not _alive(proc.pid) and os.path.exists(f"/proc/{proc.pid}")
        out["before"], out["after"] = before, _litter(tmp)
    else:
        proc.kill()
    proc.wait()
    out["stderr"] = proc.stderr.read()
    yield out


def test_an_interrupt_during_pool_start_up_is_clean_and_the_next_launch_works(killed_kernel):
    k = killed_kernel
    assert k["lines"][:2] == ["interrupted", "second launch [2.0, 2.0]"], (k["lines"], k["stderr"][-3000:])
    assert "Traceback" not in k["stderr"], k["stderr"][-3000:]  # not the forkserver dying mid-import


def test_workers_end_on_their_own_after_their_kernels_death_even_while_it_is_a_zombie(killed_kernel):
    k = killed_kernel
    assert len(k["pids"]) == 2 and k["zombie"]
    # they ended on their own, with the kernel still unreaped (checked after the wait). How fast is
    # a figure for benchmarks/launcher_faults.py (0.14-0.22 s on a quiet machine), not a timed
    # test: a bound of 2 s failed once at 2.35 s with the whole suite running beside it
    assert k["gone_after"] is not None, "workers still alive 15 s after their kernel's death"


def test_a_killed_kernel_leaves_one_folder_that_the_next_launch_removes(killed_kernel, monkeypatch):
    k = killed_kernel
    assert not [n for n in k["before"] if n.startswith("pymp-")], k["before"]  # multiprocessing's folder
    assert len(k["before"]) == 1 and k["before"][0].startswith(f"helpers-launcher-{k['pid']}-"), k["before"]
    assert k["after"] == k["before"]
    monkeypatch.setattr("tempfile.tempdir", str(k["tmp"]))
    kernel_pool._sweep_stale_dirs()  # what the next pool start anywhere on the machine does
    assert _litter(k["tmp"]) == []


# ---- 8: bad arguments --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"world_size": "4"}, ValueError, "world_size must be an integer >= 1, got '4'"),
        ({"world_size": True}, ValueError, "world_size must be an integer"),
        ({"world_size": 2.0}, ValueError, "world_size must be an integer"),
        ({"timeout": float("inf")}, ValueError, "timeout must be a finite number > 0"),
        ({"timeout": float("nan")}, ValueError, "timeout must be a finite number > 0"),
        ({"timeout": -1}, ValueError, "timeout must be a finite number > 0"),
        ({"timeout": True}, TypeError, "timeout must be a number of seconds"),
        ({"timeout": "5"}, TypeError, "timeout must be a number of seconds"),
        ({"timeout": 1e9}, ValueError, "timeout must be at most"),
        ({"threads": 0}, ValueError, "threads must be an integer >= 1"),
        ({"threads": True}, ValueError, "threads must be an integer >= 1"),
        ({"record": "yes"}, TypeError, "record must be True or False"),
        ({"quiet": 1}, TypeError, "quiet must be True or False"),
        ({"profile": 3}, TypeError, "profile must be True, False or a folder"),
        ({"backend": "mpi"}, ValueError, "unknown backend 'mpi'"),
    ],
)
def test_bad_arguments_are_rejected_naming_them_before_anything_starts(kwargs, exc, match, monkeypatch, capsys):
    def started(*a, **k):
        raise AssertionError("a worker pool was asked for")

    monkeypatch.setattr(kernel_pool, "get_pool", started)
    with pytest.raises(exc, match=match):
        launch(_nothing, **kwargs)
    assert capsys.readouterr().out == ""  # not even the line saying what would run


def test_the_default_timeout_follows_the_world_size_the_plan_resolves(monkeypatch):
    plan, timeout = launcher.job_plan(gpus=8)
    assert (plan.world_size, timeout) == (8, 60.0)
    assert launcher.job_plan(world_size=16, gpus=0)[1] == 120.0 and launcher.job_plan(gpus=0)[1] == 30.0
    assert launcher.job_plan(timeout=5, gpus=8)[1] == 5.0
    seen = {}
    monkeypatch.setattr(launcher, "gpu_count", lambda: 8)  # an 8-GPU machine, world_size=None
    monkeypatch.setattr(launcher, "_launch", lambda payload, plan, timeout, *rest: seen.update(n=plan.world_size, t=timeout))
    launch(_nothing, quiet=True)
    assert seen == {"n": 8, "t": 60.0}


# ---- profiler traces (issue 17, point 4) ---------------------------------------------------------------

def _traced(n):
    import torch
    import torch.distributed as dist

    from helpers.launcher.commlog import span

    with span("compute"):
        x = torch.ones(n) * (dist.get_rank() + 1)
    dist.all_reduce(x)
    return x[0].item()


def test_profile_merges_every_rank_into_one_chrome_trace(tmp_path):
    folder = tmp_path / "trace"
    run = launch(_traced, 64, world_size=2, quiet=True, profile=folder)
    assert run.results == [3.0, 3.0] and run.trace_path == str(folder / "trace.json")
    assert os.listdir(folder) == ["trace.json"]  # the per-rank parts were merged and removed
    with open(run.trace_path) as f:
        events = json.load(f)["traceEvents"]
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert rows == {0: "rank 0", 1: "rank 1"}
    job_start = {}
    for r in range(2):
        spans = [e for e in events if e.get("pid") == r and e.get("ph") == "X"]
        names = {e["name"] for e in spans}
        assert {"helpers:job", "compute", "c10d::allreduce_"} <= names, (r, sorted(names)[:40])
        assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)
        job_start[r] = next(e["ts"] for e in spans if e["name"] == "helpers:job")
    assert min(e["ts"] for e in events if "ts" in e and e.get("ph") != "M") == 0
    assert max(job_start.values()) - min(job_start.values()) < 1e6  # one clock (µs): the ranks start together
