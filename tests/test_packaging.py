"""The package installs whole: a wheel built from pyproject.toml holds every helper module,
helpers.course.exercises included, and each imports from the installed copy, outside the source tree."""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> list[str]:
    """Every module of the source tree's helpers package, by dotted name."""
    names = []
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_a_built_wheel_installs_every_helper_module(tmp_path):
    src = tmp_path / "src"  # build from a copy, so no build/ or egg-info lands in the worktree
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "helpers", src / "helpers", ignore=shutil.ignore_patterns("__pycache__"))
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(src)],
                   check=True, timeout=300, cwd=tmp_path)
    (wheel,) = wheels.glob("*.whl")
    subprocess.run(pip + ["install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                   check=True, timeout=300, cwd=tmp_path)
    modules = _modules()
    assert "helpers.course.exercises.p01" in modules and "helpers.costs" in modules
    # -S: no site processing, so the editable install of this checkout cannot answer the imports;
    # the installed copy comes first on the path, then this environment's packages (torch, numpy)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]])}
    code = ("import importlib\n"
            f"for name in {modules!r}:\n"
            "    m = importlib.import_module(name)\n"
            f"    assert m.__file__.startswith({str(site)!r}), (name, m.__file__)\n"
            "print('imported', len(" + repr(modules) + "))\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == f"imported {len(modules)}"
