"""The suite's guard against tests that write inside the checkout (the root ``conftest.py``)."""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the root conftest.py by path: `import conftest` finds tests/conftest.py
_spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guard)


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                   env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                            GIT_COMMITTER_EMAIL="t@t"))


def _repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "notebooks" / "a.ipynb").write_text("{}")
    (repo / ".gitignore").write_text(".traces/\n.venv/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "init")
    return repo


def test_snapshot_sees_a_rewrite_a_new_file_and_an_ignored_file_but_not_the_environment(tmp_path):
    repo = _repo(tmp_path)
    before = guard.checkout_snapshot(repo)
    assert "notebooks/a.ipynb" in before
    nb = repo / "notebooks" / "a.ipynb"
    nb.write_text("{}")  # the same bytes, rewritten in place (what a JupyterLab save does)
    os.utime(nb, ns=(before["notebooks/a.ipynb"][1] + 10**9,) * 2)
    (repo / "notebooks" / "b.txt").write_text("new")
    (repo / "notebooks" / ".traces").mkdir()
    (repo / "notebooks" / ".traces" / "t.json").write_text("{}")
    (repo / ".venv" / "lib").mkdir(parents=True)
    (repo / ".venv" / "lib" / "x.py").write_text("")
    (repo / "notebooks" / "__pycache__").mkdir()
    (repo / "notebooks" / "__pycache__" / "m.pyc").write_text("")
    changed = guard.changed_paths(before, guard.checkout_snapshot(repo))
    assert changed == ["notebooks/.traces/t.json", "notebooks/a.ipynb", "notebooks/b.txt"]


def test_snapshot_is_none_outside_a_git_checkout(tmp_path):
    assert guard.checkout_snapshot(tmp_path) is None


def test_a_suite_whose_test_writes_into_the_checkout_fails_and_names_the_file(tmp_path):
    repo = _repo(tmp_path)
    shutil.copy(ROOT / "conftest.py", repo / "conftest.py")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_w.py").write_text(
        "from pathlib import Path\n"
        "def test_writes():\n"
        "    (Path(__file__).parents[1] / 'notebooks' / 'a.ipynb').write_text('{\"x\": 1}')\n")
    (repo / "tests" / "test_ok.py").write_text("def test_ok():\n    pass\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "tests")
    run = lambda *a: subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *a],  # noqa: E731
                                    cwd=repo, capture_output=True, text=True, timeout=120)
    ok = run("tests/test_ok.py")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = run("tests")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "the suite wrote inside the checkout" in bad.stdout and "notebooks/a.ipynb" in bad.stdout, bad.stdout


def test_nbval_cells_wait_longer_for_their_outputs_than_nbvals_five_seconds():
    """nbval's own 5 s per IOPub message failed a finished cell on a loaded 2-core machine."""
    import inspect

    from nbval.plugin import IPyNbCell

    # the attribute the hook raises is still nbval's name for that wait, set when a cell is collected
    assert "self.output_timeout = 5" in inspect.getsource(IPyNbCell.__init__)

    class Cell:
        output_timeout = 5

    class Other:  # a test that is not an nbval cell is left alone
        pass

    cell, other = Cell(), Other()
    guard.pytest_collection_modifyitems(None, None, [cell, other])
    assert cell.output_timeout == guard.NBVAL_OUTPUT_TIMEOUT >= 60
    assert not hasattr(other, "output_timeout")
