"""torch's private APIs behind one door (issue 24, point 3): every entry present on the pinned
torch, a lookup that fails names what moved, the doctor prints the verdict, and the door itself
imports no torch."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import doctor
from helpers import torch_private as tp

ROOT = Path(__file__).resolve().parents[1]


def test_the_pin_is_requirements_txt_s():
    pins = dict(doctor.pins((ROOT / "requirements.txt").read_text()))
    assert pins["torch"] == f"=={tp.PINNED_TORCH}"
    from helpers import fake_world

    assert fake_world.PINNED_TORCH == tp.PINNED_TORCH  # still importable where it was


@pytest.mark.parametrize("entry", tp.API, ids=lambda e: e.name)
def test_each_private_api_is_present_on_the_pinned_torch(entry):
    assert torch.__version__.split("+")[0] == tp.PINNED_TORCH
    assert tp._check(entry) == []
    assert entry.what and entry.users
    if ":" in entry.where:
        assert tp.get(entry.name) == getattr(tp, entry.name)  # the public name looks it up (== : a bound method)


def test_memtracker_instance_state_is_present():
    assert tp._check_memtracker_state() == []
    assert tp.probe() == []


def test_the_door_imports_no_torch():
    code = ("import sys\nfrom helpers import torch_private, pool, commlog, fake_world, layer_overlap, overlap\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _says_what_moved(exc, path):
    text = str(exc)
    assert f"torch {torch.__version__}: {path} is gone" in text, text
    assert f"pinned to torch {tp.PINNED_TORCH}" in text and "helpers/torch_private.py" in text, text


def test_a_missing_attribute_is_named(monkeypatch):
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    monkeypatch.delattr(ShardingPropagator, "_fake_mode_lock")
    with pytest.raises(tp.MissingPrivateAPI) as info:
        tp.swap_propagation_lock(object())
    _says_what_moved(info.value, "torch.distributed.tensor._sharding_prop.ShardingPropagator._fake_mode_lock")
    assert tp.probe() == ["torch.distributed.tensor._sharding_prop.ShardingPropagator._fake_mode_lock"]


def test_a_missing_module_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed._tools.mem_tracker", None)  # importing it now fails
    with pytest.raises(ImportError) as info:
        from helpers.torch_private import MemTracker  # noqa: F401
    assert isinstance(info.value, tp.MissingPrivateAPI)
    _says_what_moved(info.value, "torch.distributed._tools.mem_tracker.MemTracker")
    gone = tp.probe()
    assert {line.split(":")[0] for line in gone} == {
        "torch.distributed._tools.mem_tracker.MemTracker", "torch.distributed._tools.mem_tracker._TOTAL_KEY",
        "torch.distributed._tools.mem_tracker._MemRefType", "torch.distributed._tools.mem_tracker._ModState",
        "torch.distributed._tools.mem_tracker._UpdateType"}
    assert tp.verdict().startswith("torch private APIs: 5 missing (update helpers/torch_private.py): ")


def test_a_missing_member_or_instance_attribute_is_named(monkeypatch):
    from torch.distributed.tensor._collective_utils import MeshTopoInfo

    monkeypatch.delattr(MeshTopoInfo, "build_from_mesh")
    with pytest.raises(tp.MissingPrivateAPI) as info:
        tp.clear_dtensor_caches()
    _says_what_moved(info.value, "torch.distributed.tensor._collective_utils.MeshTopoInfo.build_from_mesh")
    monkeypatch.setattr(tp, "MEMTRACKER_STATE", tp.MEMTRACKER_STATE + ("_peak_mem_v2",))
    assert tp.probe() == ["torch.distributed.tensor._collective_utils.MeshTopoInfo.build_from_mesh",
                          "torch.distributed._tools.mem_tracker.MemTracker._peak_mem_v2 (an instance's)"]


def test_a_renamed_private_state_is_refused_not_written(monkeypatch):
    class Renamed:  # a MemTracker whose peak lives elsewhere: writing _peak_mem would go unnoticed
        def get_tracker_snapshot(self, kind):
            return {}

    with pytest.raises(tp.MissingPrivateAPI) as info:
        tp.restart_peak(Renamed())
    _says_what_moved(info.value, "torch.distributed._tools.mem_tracker.MemTracker._peak_mem_snap")


def test_restart_peak_starts_from_what_is_held():
    t = tp.MemTracker()
    x = torch.ones(1024)
    t.track_external(x)
    with t:
        y = torch.ones(4096)
        del y
        assert t.get_tracker_snapshot("peak")[x.device]["Total"] >= 5 * 4096
        tp.restart_peak(t)
        assert t.get_tracker_snapshot("peak") == t.get_tracker_snapshot("current")


@pytest.mark.parametrize("implementation", ["for-loop", "foreach", "fused"])
def test_adam_init_state_makes_what_a_first_step_makes(implementation):
    """The fake world's optimizer state without the first step's arithmetic: every parameter gets the
    same state entries, each of the same type, shape, strides, dtype and device, as after a real
    first step of the same AdamW (only the values differ: ``step`` is 0, the moments zeros)."""
    from helpers.fake_world.recipes import make_optimizer

    def made(first_step: bool):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(3, 5)), torch.nn.Parameter(torch.randn(7).t()),
                  torch.nn.Parameter(torch.randn(4, 6)[:, ::2])]
        opt = make_optimizer(params, implementation)
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step() if first_step else tp.adam_init_state(opt)
        return [{k: (type(v), v.shape, v.stride(), v.dtype, v.device) for k, v in opt.state[p].items()}
                for p in params], opt

    stepped, _ = made(True)
    initialised, opt = made(False)
    assert initialised == stepped and all(set(s) >= {"step", "exp_avg", "exp_avg_sq"} for s in stepped)
    assert all(float(opt.state[p]["step"]) == 0 for p in opt.param_groups[0]["params"])


def test_the_doctor_prints_the_verdict():
    lines, _ = doctor.report()
    assert f"torch private APIs: all {len(tp.API)} present" in lines


def test_the_doctor_names_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.testing._internal.distributed.fake_pg", None)
    line = doctor.private_apis()
    assert re.fullmatch(r"torch private APIs: 1 missing \(update helpers/torch_private\.py\): "
                        r"torch\.testing\._internal\.distributed\.fake_pg\.FakeStore", line), line
