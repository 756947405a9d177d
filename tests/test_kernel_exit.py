"""A Jupyter kernel that launched ranks shuts down on its own, at once, and leaves no folder
(issue 25, point 7: the launcher folder outlived its kernel)."""
import os
import tempfile
import time
from pathlib import Path

import jupyter_client

ROOT = Path(__file__).resolve().parents[1]


def test_a_kernel_with_workers_exits_on_its_own_and_removes_its_launcher_folder(tmp_path):
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.shutdown_wait_time = 60  # room to exit on its own: a kill would show in the exit code
    # this checkout's helpers, in the kernel and in the workers its forkserver starts
    km.start_kernel(cwd=str(tmp_path), env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        out = []
        code = ("from helpers.launcher import launch\nfrom helpers import pool\n"
                "assert launch(lambda: 1, world_size=2, quiet=True).results == [1, 1]\nprint(pool.kernel_dir())")
        reply = kc.execute_interactive(code, timeout=180, output_hook=lambda m: out.append(m["content"].get("text", "")))
        assert reply["content"]["status"] == "ok", reply["content"]
        folder = "".join(out).strip().splitlines()[-1]
        assert os.path.isdir(folder) and folder.startswith(tempfile.gettempdir())
    finally:
        kc.stop_channels()
    process = km.provisioner.process
    t0 = time.monotonic()
    km.shutdown_kernel(now=False)
    took = time.monotonic() - t0
    assert process.returncode == 0, f"the kernel was ended by a signal ({process.returncode}) after {took:.1f} s"
    assert took < 30, f"the kernel took {took:.1f} s to shut down"
    assert not os.path.exists(folder), f"{folder} outlived its kernel"
