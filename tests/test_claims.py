"""The claims ledger's reader: columns, verdicts, reasoning and ids are enforced; rendering groups by verdict."""
import csv

import pytest

from helpers import claims


def _write(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=claims.COLUMNS)
        w.writeheader()
        w.writerows(rows)


def _row(**kw):
    row = {"id": "P.6-1", "section": "P.6", "claim": "averaging equal shards is exact", "book_value": "True",
           "our_value": "True", "verdict": "correct", "where": "1. Worked examples", "found_by": "both", "why": ""}
    row.update(kw)
    return row


def test_a_good_file_loads_and_errata_are_the_off_rows(tmp_path):
    _write(tmp_path / "p06.csv", [_row(), _row(id="P.6-2", verdict="wrong", why="it is 44, not 40"),
                                  _row(id="P.6-3", verdict="not-demonstrable", why="needs 64 GPUs")])
    assert [r["id"] for r in claims.for_section("P.6", tmp_path)] == ["P.6-1", "P.6-2", "P.6-3"]
    assert [r["id"] for r in claims.errata("P.6", tmp_path)] == ["P.6-2"]
    assert claims.counts(claims.load(tmp_path)) == {"correct": 1, "rounding": 0, "wrong": 1, "inconsistent": 0,
                                                    "ambiguous": 0, "not-demonstrable": 1}


@pytest.mark.parametrize("bad, match", [
    ({"verdict": "maybe"}, "verdict must be one of"),
    ({"found_by": "me"}, "found_by must be one of"),
    ({"where": " "}, "'where' must name the notebook heading"),
    ({"verdict": "wrong", "why": ""}, "needs its reasoning"),
    ({"verdict": "not-demonstrable", "why": " "}, "a not-demonstrable verdict needs its reasoning"),
    ({"section": "6"}, "section must look like"),
    ({"claim": ""}, "needs an id and a claim"),
])
def test_bad_rows_are_rejected_naming_the_constraint(tmp_path, bad, match):
    _write(tmp_path / "p06.csv", [_row(**bad)])
    with pytest.raises(ValueError, match=match):
        claims.load(tmp_path)


def test_bad_columns_and_repeated_ids_are_rejected(tmp_path):
    (tmp_path / "a.csv").write_text("id,section,claim\n1,P.6,x\n")
    with pytest.raises(ValueError, match="columns must be"):
        claims.load(tmp_path)
    _write(tmp_path / "a.csv", [_row()])
    _write(tmp_path / "b.csv", [_row()])
    with pytest.raises(ValueError, match=r"repeated: \['P.6-1'\]"):
        claims.load(tmp_path)


def test_the_rendering_groups_claims_by_verdict_with_counts():
    rows = [_row(), _row(id="P.6-2", verdict="wrong", why="it is 44"), _row(id="P.6-3")]
    md = claims.as_markdown(rows)
    assert md.startswith("**Claims in this section: 2 correct, 1 wrong.**")
    assert md.index("**correct** (2)") < md.index("**wrong** (1)")
    assert "(it is 44)" in md and md.count("| P.6-") == 3
    table = claims.readme_table(rows)
    assert "| Parallel Processing (P.1-P.15) | 3 | 2 | 0 | 1 | 0 | 0 | 0 | 0 |" in table
    assert "| Chapter 12 (12.1.1-12.4.2) | 0 |" in table


def test_headings_are_read_from_markdown_cells(tmp_path):
    import json

    nb = {"cells": [{"cell_type": "markdown", "source": ["# P.6 Title\n", "text\n", "## 2. Why it is exact\n"]},
                    {"cell_type": "code", "source": ["# not a heading\n"]}]}
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    assert claims.headings(tmp_path / "x.ipynb") == ["P.6 Title", "2. Why it is exact"]


# ---- the ledger itself --------------------------------------------------------------------------

import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in str(p))


def _section_of(nb: Path) -> str:
    first = next(c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "markdown")
    return re.search(r"\b(P\.\d+|12\.\d\.\d)\b", "".join(first["source"])).group(1)


def test_every_notebook_has_a_ledger_of_its_own_section_and_no_ledger_is_orphaned():
    stems = {p.stem for p in NOTEBOOKS}
    files = {p.stem for p in claims.CLAIMS_DIR.glob("*.csv")}
    assert files == stems
    for nb in NOTEBOOKS:
        rows = claims.load_file(claims.CLAIMS_DIR / f"{nb.stem}.csv")
        assert rows and {r["section"] for r in rows} == {_section_of(nb)}, nb.stem


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_where_is_a_heading_and_the_notebook_ends_with_its_ledger(nb):
    heads = set(claims.headings(nb))
    missing = [(r["id"], r["where"]) for r in claims.load_file(claims.CLAIMS_DIR / f"{nb.stem}.csv")
               if r["where"] not in heads]
    assert not missing, f"'where' names no heading of {nb.name}: {missing}"
    cells = json.loads(nb.read_text())["cells"]
    last_heading = [c for c in cells if c["cell_type"] == "markdown" and "".join(c["source"]).lstrip().startswith("#")][-1]
    assert "".join(last_heading["source"]).lstrip().splitlines()[0].strip() == "## Claims ledger", nb.name
    code = "".join("".join(c["source"]) for c in cells[cells.index(last_heading):] if c["cell_type"] == "code")
    assert f'claims.show_ledger("{_section_of(nb)}")' in code, nb.name


def test_every_claim_of_the_second_audit_is_in_the_ledger_and_rows_say_who_found_them():
    rows = claims.load()
    assert claims.uncited_audit_ids(rows) == []
    wrong_origin = [r["id"] for r in rows if (r["found_by"] != "first") != bool(claims.cited_audit_ids(r))]
    assert wrong_origin == [], "a row found by the second audit must cite its id, and only such rows"


def test_an_uncited_audit_claim_is_reported(tmp_path):
    (tmp_path / "P.6.csv").write_text("id,claim\nP.6-A1,x\nP.6-A2,y\nP.6-A3,z\n")
    rows = [_row(found_by="both", why="(audit P.6-A1, A3)")]
    assert claims.cited_audit_ids(rows[0]) == {"P.6-A1", "P.6-A3"}
    assert claims.uncited_audit_ids(rows, tmp_path) == ["P.6-A2"]


def test_the_readme_states_the_ledger_counts():
    assert claims.readme_table() in (ROOT / "README.md").read_text()
