"""Issue 24, point 10: helpers/ along its facades, with the notebooks' import paths intact."""
import importlib
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import helpers

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "helpers"


def test_at_most_40_entries_at_the_top_of_helpers():
    entries = sorted(p.name for p in HELPERS.iterdir()
                     if p.name != "__pycache__" and (p.suffix == ".py" or (p / "__init__.py").exists()))
    assert len(entries) <= 40, entries
    stray = [p.name for p in HELPERS.iterdir() if p.is_dir() and p.name != "__pycache__" and not (p / "__init__.py").exists()]
    assert not stray, f"folders without __init__.py: {stray}"


@pytest.mark.parametrize("old", sorted(helpers.MOVED))
def test_a_moved_module_keeps_its_old_path_as_the_same_module(old):
    new = importlib.import_module(f"helpers.{helpers.MOVED[old]}")
    assert importlib.import_module(f"helpers.{old}") is new
    assert not (HELPERS / f"{old}.py").exists(), f"helpers/{old}.py is back beside its moved copy"


def test_a_submodule_under_an_old_package_path_is_the_same_module():
    from helpers.exercises import p06

    assert p06 is importlib.import_module("helpers.course.exercises.p06")
    assert p06.__name__ == "helpers.course.exercises.p06"


def test_functions_of_moved_modules_pickle_under_their_new_path():
    from helpers.worker import device

    assert device.__module__ == "helpers.launcher.worker"
    assert pickle.loads(pickle.dumps(device)) is device


def test_python_dash_m_runs_a_moved_module_by_its_old_path(tmp_path):
    # helpers.nbfiles' command line strips stored widget views from the notebooks it is given
    nb = tmp_path / "empty.ipynb"
    nb.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}\n')
    for name in ("helpers.nbfiles", "helpers.course.nbfiles"):
        out = subprocess.run([sys.executable, "-m", name, str(nb)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, (name, out.stderr[-2000:])


def test_an_unknown_old_path_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("helpers.no_such_module")
