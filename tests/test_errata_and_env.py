"""The errata are the ledger's off rows, and the pip and conda dependency sets do not drift apart."""
import re
from pathlib import Path

from helpers import claims, errata

ROOT = Path(__file__).resolve().parent.parent


def test_the_errata_are_exactly_the_ledgers_off_rows():
    rows = errata.load()
    ledger = claims.load()
    off = [r["id"] for r in ledger if r["verdict"] in ("wrong", "inconsistent", "ambiguous", "rounding")]
    assert [r["id"] for r in rows] == off and len(off) > 50
    for r in rows:
        assert re.fullmatch(r"P\.\d+|12\.\d\.\d", r["section"]), r
        assert r["computed_value"] and r["why"], r
    assert [r["id"] for r in errata.for_section("12.2.1")] == [r["id"] for r in claims.errata("12.2.1")]
    assert all(r["verdict"] != "correct" for r in errata.for_section("P.13"))


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
