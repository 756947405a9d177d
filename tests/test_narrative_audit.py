"""Issue 29, point 2: the third, independent audit of the notebooks' narrative is kept in
data/audit/narrative/ (one CSV per section), and every finding is fixed or answered."""
import csv
import json
from pathlib import Path

import pytest

from helpers import claims
from helpers.course import prose

ROOT = Path(__file__).resolve().parents[1]
AUDIT = ROOT / "data" / "audit" / "narrative"
COLUMNS = ["id", "notebook", "cell", "quote", "kind", "finding", "evidence", "severity", "resolution", "response"]
KINDS = {"figure", "unit", "formula", "fact", "verdict", "contradiction", "source", "cross-reference", "overstatement"}
SEVERITIES = {"error", "slip", "note"}
RESOLUTIONS = {"fixed", "clarified", "answered"}
SECTIONS = sorted({r["section"] for r in claims.load()})
FILES = sorted(AUDIT.glob("*.csv"))


def _rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS, f"{path.name}: columns {reader.fieldnames}"
        return list(reader)


def _notebook_text(name):
    path = next(ROOT.glob(f"notebooks/*/{name}"), None)
    assert path is not None, f"no notebook {name}"
    nb = json.loads(path.read_text())
    parts = ["".join(c["source"]) for c in nb["cells"]]
    return "\n".join(parts) + "\n" + prose.output_text(nb)


def test_every_section_was_audited():
    assert sorted(p.stem for p in FILES) == SECTIONS


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_finding_is_fixed_or_answered(path):
    rows = _rows(path)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) and all(i.startswith(f"N-{path.stem}-") for i in ids), ids
    for r in rows:
        where = f"{path.name} {r['id']}"
        assert r["kind"] in KINDS and r["severity"] in SEVERITIES, where
        assert r["resolution"] in RESOLUTIONS, f"{where}: resolution {r['resolution']!r}"
        assert r["response"].strip(), f"{where}: no response"
        text = _notebook_text(r["notebook"].split("/")[-1])
        if r["resolution"] == "fixed":
            assert r["quote"] not in text, f"{where} is 'fixed' but its quote is still in the notebook"
