"""Benchmark: one notebook executed cell by cell with nbclient; each cell's wall time, and what a
stalled cell waits for. Prints one line per code cell, then `total_s` and the slowest cells.

When a cell runs longer than --stall seconds it prints the state of the kernel and of every
process under it (the launcher's forkserver and workers): /proc state and wchan per thread, and
the Python stacks when py-spy is installed (`pip install py-spy`). With --nudge it then reads
ZMQ_EVENTS of the client's sockets, which says whether the cell's reply is already waiting there
(a lost wakeup in the client; helpers.course.nbexec) and makes zmq.asyncio deliver it.

  python benchmarks/notebook_cells.py NB [--plain] [--timeout 600] [--stall 60] [--nudge]

--plain runs with nbclient's own kernel manager instead of helpers.course.nbexec.KernelManager, for a
comparison: on a loaded machine, cells with an ipywidgets `interact` then sometimes take exactly
--timeout seconds and no error. Timings; not a test: quote them with the machine's load.
"""
import argparse
import asyncio
import io
import os
import shutil
import subprocess
import threading
import time

import nbformat
import zmq
from nbclient import NotebookClient

from helpers.course.nbexec import KernelManager


def descendants(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError as exc:
        return f"({exc.strerror})"


def dump_processes(kernel_pid: int):
    pyspy = shutil.which("py-spy")
    for pid in descendants(kernel_pid):
        print(f"--- pid {pid}: {_read(f'/proc/{pid}/cmdline')[:150]}")
        for tid in sorted(os.listdir(f"/proc/{pid}/task")) if os.path.isdir(f"/proc/{pid}/task") else []:
            state = next((l for l in _read(f"/proc/{pid}/task/{tid}/status").splitlines() if l.startswith("State")), "")
            print(f"    thread {tid} {_read(f'/proc/{pid}/task/{tid}/comm')}: {state}, "
                  f"wchan {_read(f'/proc/{pid}/task/{tid}/wchan')}")
        if pyspy:
            r = subprocess.run([pyspy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            print(r.stdout + r.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook")
    ap.add_argument("--plain", action="store_true", help="nbclient's own kernel manager")
    ap.add_argument("--timeout", type=float, default=600.0, help="nbclient's cell timeout, s")
    ap.add_argument("--stall", type=float, default=60.0, help="a cell running longer is reported, s")
    ap.add_argument("--nudge", action="store_true", help="after the report, read the client's ZMQ_EVENTS")
    a = ap.parse_args()
    nb = nbformat.read(a.notebook, as_version=4)
    kw = {} if a.plain else {"kernel_manager_class": KernelManager}
    client = NotebookClient(nb, timeout=a.timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": os.path.dirname(os.path.abspath(a.notebook))}}, **kw)
    now = {"index": None, "t0": 0.0, "reported": False}
    stop = threading.Event()

    def nudge():  # on the client's event loop
        for task in asyncio.all_tasks():
            buf = io.StringIO()
            task.print_stack(limit=2, file=buf)
            print("  waiting:", buf.getvalue().strip().splitlines()[-1].strip())
        for name in ("shell_channel", "iopub_channel", "control_channel"):
            events = getattr(client.kc, name).socket.get(zmq.EVENTS)
            print(f"  {name}: {'a message is waiting' if events & zmq.POLLIN else 'nothing to read'}")

    def watchdog(kernel_pid, loop):
        while not stop.wait(1.0):
            if now["index"] is not None and not now["reported"] and time.monotonic() - now["t0"] > a.stall:
                now["reported"] = True
                print(f"=== cell {now['index']} still running after {a.stall:g} s; load {os.getloadavg()[0]:.1f}")
                dump_processes(kernel_pid)
                if a.nudge:
                    loop.call_soon_threadsafe(nudge)

    t_all, times = time.monotonic(), []
    with client.setup_kernel():
        from jupyter_core.utils import ensure_event_loop

        threading.Thread(target=watchdog, args=(client.km.provisioner.process.pid, ensure_event_loop()),
                         daemon=True).start()
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            now.update(index=index, t0=time.monotonic(), reported=False)
            client.execute_cell(cell, index)
            dt = time.monotonic() - now["t0"]
            now["index"] = None
            times.append((dt, index))
            errs = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stderr").strip()
            print(f"cell {index:3d}: {dt:7.1f} s  load {os.getloadavg()[0]:5.1f}" + (f"  stderr: {errs[-200:]!r}" if errs else ""))
    stop.set()
    print(f"total_s: {time.monotonic() - t_all:.1f}")
    print("slowest cells (s, index):", [(round(t, 1), i) for t, i in sorted(times, reverse=True)[:3]])


if __name__ == "__main__":
    main()
