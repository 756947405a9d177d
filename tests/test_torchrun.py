"""The scale-out path: the same worker functions under torchrun (one node, two processes)."""
import ast
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers.data_parallel import train_single
from helpers.launcher.torchrun_main import resolve


def test_torchrun_runs_a_workbook_worker():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "helpers.launcher.torchrun_main", "helpers.collectives:ring_check_worker", "--kwargs", '{"numel": 64}']
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "backend=gloo device=cpu world_size=2 (torchrun)" in out.stdout
    for r in (0, 1):
        assert f"[rank {r}] returned {{'max_abs_diff': 0.0, 'numel': 64}}" in out.stdout


def test_without_torchrun_it_says_how_to_start():
    out = subprocess.run([sys.executable, "-m", "helpers.launcher.torchrun_main", "helpers.collectives:ring_check_worker"],
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and "start this module with torchrun" in out.stderr


@pytest.mark.parametrize("target, match", [("nocolon", "expected 'module:function'"),
                                           ("helpers.collectives:nope", "has no function 'nope'")])
def test_resolve_rejects_bad_targets(target, match):
    with pytest.raises(ValueError, match=match):
        resolve(target)


# ---- two nodes: the README's line, run as two torchrun agents on this machine ---------------------

ROOT = Path(__file__).resolve().parent.parent
SBATCH = ROOT / "docs" / "slurm" / "train.sbatch"
PLACEHOLDERS = ("$NODE_RANK", "$HEAD_NODE_ADDR", "$HEAD_NODE_PORT")


def _command_after(text: str, start: str) -> str:
    """The shell command that begins with ``start`` in ``text``, its continuation lines joined."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith(start))
    out = []
    for line in lines[i:]:
        out.append(line.strip().removesuffix("\\").strip())
        if not line.rstrip().endswith("\\"):
            break
    return " ".join(out)


def readme_two_node_line() -> list[str]:
    return shlex.split(_command_after((ROOT / "README.md").read_text(), "torchrun --nnodes=2"))


def sbatch_torchrun_line() -> list[str]:
    return shlex.split(_command_after(SBATCH.read_text(), "torchrun "))


# What the driver does inside its own network namespace: only a loopback interface exists there, so
# torchrun's rendezvous store (a TCPStore, which binds every interface) is reachable from nowhere else.
DRIVER = r'''
import json, os, signal, socket, subprocess, sys, time
argv, out_dir, timeout = json.loads(sys.argv[1]), sys.argv[2], float(sys.argv[3])
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]

def fill(word, node):
    for name, value in (("$NODE_RANK", node), ("$HEAD_NODE_ADDR", "127.0.0.1"), ("$HEAD_NODE_PORT", port)):
        word = word.replace(name, str(value))
    return word

procs = []
for node in (0, 1):  # both agents at once, as on two nodes
    cmd = [sys.executable, "-m", "torch.distributed.run"] + [fill(w, node) for w in argv[1:]]
    out = open(os.path.join(out_dir, f"node{node}.out"), "w")
    err = open(os.path.join(out_dir, f"node{node}.err"), "w")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True))
deadline = time.monotonic() + timeout
codes = []
try:
    for p in procs:
        codes.append(p.wait(timeout=max(deadline - time.monotonic(), 0.1)))
except subprocess.TimeoutExpired:
    codes = ["timeout"]
finally:
    for p in procs:  # every agent and its ranks, whatever happened
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
print(json.dumps({"codes": codes, "port": port}))
'''


def _can_unshare() -> str | None:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "needs unshare and ip (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"cannot create a network namespace: {probe.stderr.strip()}"


def test_the_readme_two_node_line_runs_as_two_agents(tmp_path):
    argv = readme_two_node_line()
    assert argv[0] == "torchrun" and {"--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d"} <= set(argv)
    assert all(any(p in w for w in argv) for p in PLACEHOLDERS), argv
    why = _can_unshare()
    if why:
        pytest.skip(f"two torchrun agents stay loopback-only in a network namespace of their own: {why}")
    (tmp_path / "driver.py").write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    proc = subprocess.Popen(["unshare", "--net", sys.executable, str(tmp_path / "driver.py"), json.dumps(argv),
                             str(tmp_path), "150"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    report = json.loads(stdout.strip().splitlines()[-1])
    outs = {n: (tmp_path / f"node{n}.out").read_text() for n in (0, 1)}
    errs = {n: (tmp_path / f"node{n}.err").read_text()[-1500:] for n in (0, 1)}
    assert report["codes"] == [0, 0], f"{report}, after {time.monotonic() - started:.0f} s\n{errs}"
    # c10d gives the agents group ranks in the order they join: each node holds 2 consecutive ranks
    ranks = {n: sorted(int(r) for r in re.findall(r"^\[rank (\d+)\] returned", outs[n], re.M)) for n in (0, 1)}
    assert sorted(ranks.values()) == [[0, 1], [2, 3]], ranks
    both = outs[0] + outs[1]
    assert "backend=gloo device=cpu world_size=4 (torchrun)" in both
    # each rank's parameters after 5 DDP steps on its shard equal one process's full-batch training
    ref, _ = train_single(steps=5)
    for r in range(4):
        text = both.split(f"[rank {r}] returned ", 1)[1].split("\n[rank ", 1)[0]
        tree = ast.parse(text, mode="eval")  # a dict of tensor(...) reprs, nothing else
        assert {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} <= {"tensor", "torch"}, text[:200]
        result = eval(compile(tree, "rank output", "eval"), {"tensor": torch.tensor, "torch": torch})
        assert result["shard"] == 8
        assert len(result["params"]) == len(ref)
        for got, want in zip(result["params"], ref):  # printed to 4 decimals
            assert torch.allclose(got, want, atol=1e-4, rtol=0), (r, (got - want).abs().max())


def test_the_sbatch_template_runs_the_tested_line():
    check = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert sbatch_torchrun_line() == readme_two_node_line()
    text = SBATCH.read_text()
    nodes = re.search(r"^#SBATCH --nodes=(\d+)$", text, re.M)
    per_node = re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", text, re.M)
    assert nodes and f"--nnodes={nodes.group(1)}" in readme_two_node_line()
    assert per_node and per_node.group(1) == "1"  # one torchrun agent per node; it starts the ranks
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in text
    assert re.search(r"^\s*NODE_RANK=\$SLURM_NODEID$", text, re.M)
    assert re.search(r"^srun .*bash docs/slurm/train\.sbatch --node$", text, re.M)


def test_the_line_comparison_sees_a_changed_argument():
    changed = [w.replace("--nproc_per_node=2", "--nproc_per_node=8") for w in readme_two_node_line()]
    assert changed != sbatch_torchrun_line()
    assert _command_after("a\n  torchrun --x \\\n   --y\nz\n", "torchrun") == "torchrun --x --y"
