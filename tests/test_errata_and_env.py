"""The errata table is well formed, and the pip and conda dependency sets do not drift apart."""
import re
from pathlib import Path

import pytest

from helpers import errata

ROOT = Path(__file__).resolve().parent.parent


def test_every_errata_file_has_the_columns_and_verdicts_and_unique_ids():
    rows = errata.load()  # raises on a bad column, verdict or repeated id
    for r in rows:
        assert re.fullmatch(r"P\.\d+|12\.\d\.\d", r["section"]), r
        assert r["computed_value"] and r["why"], r


def test_a_bad_errata_file_is_rejected(tmp_path):
    (tmp_path / "x.csv").write_text("id,section,claim\n1,P.6,x\n")
    with pytest.raises(ValueError, match="columns must be"):
        errata.load(tmp_path)
    (tmp_path / "x.csv").write_text(",".join(errata.COLUMNS) + "\nP6-1,P.6,c,1,2,maybe,w\n")
    with pytest.raises(ValueError, match="verdict must be one of"):
        errata.load(tmp_path)


def _pip_pins():
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.lower()] = version
    return pins


def _conda_pins():
    pins = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+)==([^\s#]+)", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_pip_and_conda_install_the_same_pinned_set():
    pip, conda = _pip_pins(), _conda_pins()
    assert pip and all(pip.values()), "every pip requirement is pinned with =="
    assert pip == conda


def test_every_notebook_named_in_the_readme_exists_and_every_notebook_is_named():
    readme = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"notebooks/[\w/]+\.ipynb", readme))
    present = {str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in str(p)}
    assert listed == present
