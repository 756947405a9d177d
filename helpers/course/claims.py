"""The claims ledger: every claim of every section, what we found, and where the notebook shows it.

Serves every notebook (the ledger at the end of each) and the README's counts. The ledger lives
in ``data/claims/``, one CSV per notebook (``<notebook stem>.csv``), one row per claim of the
section, numeric or qualitative:

``id, section, claim, book_value, our_value, verdict, where, found_by, why``

* ``verdict``: ``correct``; ``rounding`` (right up to the book's rounding); ``wrong`` (arithmetic
  or fact); ``inconsistent`` (contradicts another statement of the chapters, or a definition or
  unit changes between places); ``ambiguous`` (true under one unstated assumption, false under
  another); ``not-demonstrable`` (needs a cluster, data or time we do not have here: ``why``
  says why and what the notebook shows instead).
* ``where``: the heading (markdown ``#`` line, without the hashes) of the notebook cell that
  shows the claim; a test checks that it exists in the section's notebook.
* ``found_by``: ``first`` (our audit, when the notebooks were written), ``second`` (only the
  independent second audit, made from the chapter text alone, found it) or ``both``. A row the
  second audit found cites its id (``12.2.1-A17``, several as ``12.2.1-A17, A18``) in ``why``;
  the second audit itself is kept in ``data/audit/<section>.csv`` so that the reconciliation can
  be checked: every claim it lists is cited by a ledger row (:func:`uncited_audit_ids`).

The errata are the ledger's rows whose verdict says the book is off (:data:`ERRATA_VERDICTS`);
:mod:`helpers.course.errata` renders them from here, so there is one source of truth.
"""
from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path

COLUMNS = ("id", "section", "claim", "book_value", "our_value", "verdict", "where", "found_by", "why")
VERDICTS = ("correct", "rounding", "wrong", "inconsistent", "ambiguous", "not-demonstrable")
ERRATA_VERDICTS = ("wrong", "inconsistent", "ambiguous", "rounding")
FOUND_BY = ("first", "second", "both")
ROOT = Path(__file__).resolve().parents[2]
CLAIMS_DIR = ROOT / "data" / "claims"
AUDIT_DIR = ROOT / "data" / "audit"
NOTEBOOKS = ROOT / "notebooks"
_SECTION = re.compile(r"P\.\d+|12\.\d\.\d")
_AUDIT_REF = re.compile(r"(P\.\d+|12\.\d\.\d)-A(\d+)((?:\s*(?:,|and|&|/|\+)\s*A\d+)*)")


def load_file(path: Path | str) -> list[dict[str, str]]:
    """The rows of one ledger CSV; ValueError naming the file and row on a bad column or value."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: columns must be {COLUMNS}, got {reader.fieldnames}")
        rows = list(reader)
    for row in rows:
        where = f"{path}: row {row['id'] or '(no id)'}"
        if not row["id"] or not row["claim"].strip():
            raise ValueError(f"{where}: every row needs an id and a claim")
        if not _SECTION.fullmatch(row["section"]):
            raise ValueError(f"{where}: section must look like P.7 or 12.2.1, got {row['section']!r}")
        if row["verdict"] not in VERDICTS:
            raise ValueError(f"{where}: verdict must be one of {VERDICTS}, got {row['verdict']!r}")
        if row["found_by"] not in FOUND_BY:
            raise ValueError(f"{where}: found_by must be one of {FOUND_BY}, got {row['found_by']!r}")
        if not row["where"].strip():
            raise ValueError(f"{where}: 'where' must name the notebook heading that shows the claim")
        if row["verdict"] != "correct" and not row["why"].strip():
            raise ValueError(f"{where}: a {row['verdict']} verdict needs its reasoning in 'why'")
    return rows


def load(directory: Path | str = CLAIMS_DIR) -> list[dict[str, str]]:
    """Every row of every ledger file; ValueError on a repeated id."""
    rows = [row for p in sorted(Path(directory).glob("*.csv")) for row in load_file(p)]
    counts = Counter(r["id"] for r in rows)
    dup = sorted(i for i, k in counts.items() if k > 1)
    if dup:
        raise ValueError(f"claim ids must be unique; repeated: {dup}")
    return rows


def for_section(section: str, directory: Path | str = CLAIMS_DIR) -> list[dict[str, str]]:
    """The ledger rows of one section id, e.g. ``"12.1.1"`` or ``"P.7"``, in file order."""
    if not _SECTION.fullmatch(str(section)):
        raise ValueError(f"section must look like P.7 or 12.2.1, got {section!r}")
    return [r for r in load(directory) if r["section"] == section]


def errata(section: str, directory: Path | str = CLAIMS_DIR) -> list[dict[str, str]]:
    """The section's rows where the book is off (verdict in :data:`ERRATA_VERDICTS`)."""
    return [r for r in for_section(section, directory) if r["verdict"] in ERRATA_VERDICTS]


def counts(rows) -> dict[str, int]:
    """Number of rows per verdict, every verdict present (zeros included), in VERDICTS order."""
    c = Counter(r["verdict"] for r in rows)
    return {v: c.get(v, 0) for v in VERDICTS}


def chapter(section: str) -> str:
    """``"P"`` for Parallel Processing sections, ``"12"`` for Chapter 12."""
    return "P" if section.startswith("P.") else "12"


def headings(notebook: Path | str) -> list[str]:
    """The markdown headings of a notebook, without the leading hashes."""
    import json

    cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
    out = []
    for c in cells:
        if c["cell_type"] != "markdown":
            continue
        for line in "".join(c["source"]).splitlines():
            m = re.match(r"^#{1,6}\s+(.*\S)\s*$", line)
            if m:
                out.append(m.group(1))
    return out


def notebook_for(stem: str) -> Path:
    """The notebook a ledger file belongs to (same stem); ValueError if there is none."""
    found = [p for p in NOTEBOOKS.rglob(f"{stem}.ipynb") if ".ipynb_checkpoints" not in str(p)]
    if len(found) != 1:
        raise ValueError(f"no single notebook named {stem}.ipynb under notebooks/ (found {len(found)})")
    return found[0]


def _esc(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def as_markdown(rows: list[dict[str, str]]) -> str:
    """The ledger of a section as markdown: the counts, then one compact table per verdict."""
    if not rows:
        return "_No claims recorded for this section._"
    c = counts(rows)
    out = ["**Claims in this section: " + ", ".join(f"{k} {v}" for v, k in c.items() if k) + ".**\n"]
    for verdict in VERDICTS:
        group = [r for r in rows if r["verdict"] == verdict]
        if not group:
            continue
        out.append(f"\n**{verdict}** ({len(group)})\n\n| id | claim | book | ours | where |\n|---|---|---|---|---|\n")
        for r in group:
            ours = r["our_value"] if verdict == "correct" else f"{r['our_value']} ({r['why']})".strip()
            out.append(f"| {r['id']} | {_esc(r['claim'])} | {_esc(r['book_value'])} | {_esc(ours)} | {_esc(r['where'])} |\n")
    return "".join(out)


def show_ledger(section: str):
    """Render a section's ledger in a notebook (claims grouped by verdict) and return its rows."""
    from IPython.display import Markdown, display

    rows = for_section(section)
    display(Markdown(as_markdown(rows)))
    return rows


def readme_table(rows=None) -> str:
    """The README's table: claims per chapter by verdict (what a test keeps equal to the README)."""
    rows = load() if rows is None else rows
    head = ("| chapter | claims | " + " | ".join(VERDICTS) + " | found only by the second audit |\n|---|---|"
            + "---|" * len(VERDICTS) + "---|\n")
    lines = []
    for ch, name in (("P", "Parallel Processing (P.1-P.15)"), ("12", "Chapter 12 (12.1.1-12.4.2)")):
        rs = [r for r in rows if chapter(r["section"]) == ch]
        c = counts(rs)
        second = sum(r["found_by"] == "second" for r in rs)
        lines.append(f"| {name} | {len(rs)} | " + " | ".join(str(c[v]) for v in VERDICTS) + f" | {second} |\n")
    return head + "".join(lines)


def cited_audit_ids(row: dict[str, str]) -> set[str]:
    """The second audit's ids a ledger row cites (``12.2.1-A17, A18`` counts as two)."""
    out = set()
    for m in _AUDIT_REF.finditer(row["why"] + " " + row["our_value"]):
        out.add(f"{m.group(1)}-A{m.group(2)}")
        out.update(f"{m.group(1)}-A{n}" for n in re.findall(r"A(\d+)", m.group(3)))
    return out


def uncited_audit_ids(rows=None, audit_dir: Path | str = AUDIT_DIR) -> list[str]:
    """The second audit's claims (``data/audit/<section>.csv``) that no ledger row cites: what the
    reconciliation missed. Empty when every claim either audit found is in the ledger."""
    rows = load() if rows is None else rows
    cited = set().union(*(cited_audit_ids(r) for r in rows)) if rows else set()
    listed = []
    for p in sorted(Path(audit_dir).glob("*.csv")):
        if not _SECTION.fullmatch(p.stem):  # e.g. verdicts.csv, the review of the ledger's verdicts
            continue
        with open(p, newline="", encoding="utf-8") as f:
            listed += [r["id"] for r in csv.DictReader(f)]
    return [i for i in listed if i not in cited]
