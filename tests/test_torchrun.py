"""The scale-out path: the same worker functions under torchrun (one node, two processes)."""
import subprocess
import sys

import pytest

from helpers.torchrun_main import resolve


def test_torchrun_runs_a_workbook_worker():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "helpers.torchrun_main", "helpers.collectives:ring_check_worker", "--kwargs", '{"numel": 64}']
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "backend=gloo device=cpu world_size=2 (torchrun)" in out.stdout
    for r in (0, 1):
        assert f"[rank {r}] returned {{'max_abs_diff': 0.0, 'numel': 64}}" in out.stdout


def test_without_torchrun_it_says_how_to_start():
    out = subprocess.run([sys.executable, "-m", "helpers.torchrun_main", "helpers.collectives:ring_check_worker"],
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and "start this module with torchrun" in out.stderr


@pytest.mark.parametrize("target, match", [("nocolon", "expected 'module:function'"),
                                           ("helpers.collectives:nope", "has no function 'nope'")])
def test_resolve_rejects_bad_targets(target, match):
    with pytest.raises(ValueError, match=match):
        resolve(target)
