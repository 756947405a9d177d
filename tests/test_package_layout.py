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
    for name in ("helpers.nbfiles", "helpers.course.nbfiles"):  # no relative import of the parent
        out = subprocess.run([sys.executable, "-m", name, str(nb)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, (name, out.stderr[-2000:])


def test_an_unknown_old_path_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("helpers.no_such_module")


def test_python_dash_m_by_the_old_path_runs_relative_imports_from_the_new_package(tmp_path):
    # torchrun_main and site import from their package's parent ("from .. import ..."): run by the
    # old path, they must still find it (the alias spec gives runpy the real package)
    for name in ("helpers.torchrun_main", "helpers.site", "helpers.launcher.torchrun_main"):
        out = subprocess.run([sys.executable, "-W", "error::ImportWarning", "-m", name, "--help"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120,
                             env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0 and "usage:" in out.stdout, (name, out.stderr[-2000:])


def test_importing_an_old_path_leaves_the_module_its_own_spec():
    """In both orders, old path first or new path first: one module, whose __spec__ still names its
    real path (reload and relative imports depend on it), with no import warning."""
    code = ("import importlib, warnings; warnings.simplefilter('error')\n"
            "{first}\n{second}\n"
            "import helpers.pool as old, helpers.launcher.pool as new\n"
            "assert old is new and new.__spec__.name == new.__name__ == 'helpers.launcher.pool', new.__spec__\n"
            "importlib.reload(new); assert new.__name__ == 'helpers.launcher.pool'\n")
    for first, second in (("import helpers.pool", "import helpers.launcher.pool"),
                          ("import helpers.launcher.pool", "import helpers.pool")):
        out = subprocess.run([sys.executable, "-c", code.format(first=first, second=second)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, (first, out.stderr[-2000:])


def test_the_package_imports_its_own_code_by_the_new_paths():
    """The old paths are for readers' code and the notebooks: helpers/ itself never goes through them."""
    import ast

    moved = set(helpers.MOVED)
    bad = []
    for path in sorted(HELPERS.rglob("*.py")):
        rel = path.relative_to(ROOT)
        pkg = list(rel.with_suffix("").parts[:-1]) if path.name != "__init__.py" else list(rel.parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = pkg[:len(pkg) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
                parts = target.split(".")
                names = [parts[1]] if len(parts) > 1 else [a.name for a in node.names] if target == "helpers" else []
                if parts[0] == "helpers" and any(n in moved for n in names):
                    bad.append(f"{rel}:{node.lineno}: imports {target} {[a.name for a in node.names]}")
    assert not bad, "\n".join(bad)
