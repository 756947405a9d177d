"""The linter is part of the suite: ruff with pyflakes' rules, import order and syntax errors
(pyproject.toml, [tool.ruff]) over helpers/, tests/, benchmarks/ and the notebooks."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff():
    exe = Path(sys.executable).with_name("ruff")
    return str(exe) if exe.exists() else shutil.which("ruff")


def test_ruff_finds_nothing():
    ruff = _ruff()
    assert ruff, "ruff is not installed: it is in requirements.txt (./workbook test installs it)"
    out = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, "ruff check found:\n" + out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_fails_on_an_unused_import_and_a_redefinition(tmp_path):
    """The rules the suite relies on are on: a planted unused import and a function defined twice
    are reported (with this checkout's configuration)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f():\n    return 1\n\n\ndef f():\n    return 2\n")
    out = subprocess.run([_ruff(), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
                          "--output-format", "concise", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout
    assert "F401" in out.stdout and "F811" in out.stdout, out.stdout
