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
