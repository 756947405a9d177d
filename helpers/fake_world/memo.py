"""Each fake-world configuration traced once per test run (issue 23: the suite's repeated work).

The same :func:`helpers.fake_world.simulate` call is made by more than one process of a test run:
12.4.1's three chapter cases by nbval's kernel and by the browser test's JupyterLab kernel, 12.1.1's
7.5B by nbval and by the student-edition test, a small model by three tests of one file. Each is a
trace of seconds to tens of seconds. When ``WORKBOOK_FAKE_WORLD_MEMO`` names a folder, ``simulate``
keeps every result there and answers a later identical call from it, in any process.

The root ``conftest.py`` sets it to a fresh temporary folder for each run of the suite, which its
workers, the kernels that nbval, nbgrader and JupyterLab start, and every other child inherit, and
removes the folder at the end; outside the suite it is unset and nothing is kept. (Set it yourself
to keep traces between sessions: the key below makes an entry unusable after any change to the
workbook's code or to torch.)

* **The key**: every argument of the call (their ``repr``: the model and layout are dataclasses)
  and a fingerprint of the code that computes the result, the source of every module of
  ``helpers`` and torch's version. An edit anywhere in ``helpers`` (a planted mutant, say) misses.
* **Progress**: a call given ``progress`` always traces (its caller shows the trace as it runs);
  it keeps its result for the others.
* **Nothing half-written**: an entry is written to a temporary file in the folder and renamed
  into place, so a reader in another process sees all of it or nothing; an entry that cannot be
  read is traced again.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path

ENV = "WORKBOOK_FAKE_WORLD_MEMO"
_CODE: list = []  # the code's fingerprint, computed once per process


def folder() -> Path | None:
    """The folder results are kept in, or None when ``WORKBOOK_FAKE_WORLD_MEMO`` is unset or empty."""
    name = os.environ.get(ENV)
    return Path(name) if name else None


def code_fingerprint(root: Path | None = None) -> str:
    """SHA-256 of torch's version and the source of every module under ``root`` (by path; default:
    this package's ``helpers``, read once per process)."""
    if root is None and _CODE:
        return _CODE[0]
    import torch

    top = Path(__file__).resolve().parents[1] if root is None else Path(root)
    h = hashlib.sha256(torch.__version__.encode())
    for path in sorted(top.rglob("*.py")):
        h.update(path.relative_to(top).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    if root is None:
        _CODE.append(h.hexdigest())
    return h.hexdigest()


def key(*args) -> str:
    """The entry's name for a call with these arguments (each given by its ``repr``)."""
    h = hashlib.sha256(code_fingerprint().encode())
    for a in args:
        h.update(repr(a).encode())
        h.update(b"\0")
    return h.hexdigest()


def load(name: str):
    """The result kept under ``name``, or None (none kept, no folder, or an entry that cannot be read)."""
    where = folder()
    if where is None:
        return None
    try:
        with open(where / f"{name}.pkl", "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return None


def store(name: str, result) -> None:
    """Keep ``result`` under ``name`` (written whole, then renamed into place); nothing without a folder."""
    where = folder()
    if where is None:
        return
    where.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=where, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, where / f"{name}.pkl")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
