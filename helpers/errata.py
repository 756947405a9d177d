"""The errata list: where the chapters' numbers or definitions are wrong, with the correct value.

Serves every notebook (step 2 of "What every notebook does"): each notebook recomputes its
section's worked examples and renders its section's rows with :func:`show`. The list lives in
``data/errata/``, one CSV file per notebook (so that work on two sections never edits the same
file); together they are one table. One row per claim: ``id, section, claim, book_value, computed_value, verdict, why``.
Verdicts: ``wrong`` (arithmetic or fact), ``inconsistent`` (a definition or unit that changes
between places), ``imprecise`` (right to within a rounding or an approximation the book does not
state).
"""
from __future__ import annotations

import csv
from pathlib import Path

COLUMNS = ("id", "section", "claim", "book_value", "computed_value", "verdict", "why")
VERDICTS = ("wrong", "inconsistent", "imprecise")
ERRATA_DIR = Path(__file__).resolve().parent.parent / "data" / "errata"


def load_file(path: Path | str) -> list[dict[str, str]]:
    """The rows of one errata CSV, checked for its columns and verdicts."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: columns must be {COLUMNS}, got {reader.fieldnames}")
        rows = list(reader)
    for row in rows:
        if row["verdict"] not in VERDICTS:
            raise ValueError(f"{path}: row {row['id']}: verdict must be one of {VERDICTS}, got {row['verdict']!r}")
    return rows


def load(directory: Path | str = ERRATA_DIR) -> list[dict[str, str]]:
    """Every row of every errata file; ValueError on a repeated id."""
    rows = [row for p in sorted(Path(directory).glob("*.csv")) for row in load_file(p)]
    ids = [r["id"] for r in rows]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"errata ids must be unique; repeated: {dup}")
    return rows


def for_section(section: str, directory: Path | str = ERRATA_DIR) -> list[dict[str, str]]:
    """The rows for one section id, e.g. ``"12.1.1"`` or ``"P.7"``.

    A section whose claims ledger exists (``data/claims``) takes its errata from the ledger's
    off rows (:func:`helpers.claims.errata`), shown with the same columns.
    """
    from . import claims

    if directory == ERRATA_DIR and any(r["section"] == section for r in claims.load()):
        return [{**r, "computed_value": r["our_value"]} for r in claims.errata(section)]
    return [r for r in load(directory) if r["section"] == section]


def as_markdown(rows: list[dict[str, str]]) -> str:
    """A markdown table of errata rows (what :func:`show` displays)."""
    if not rows:
        return "_No errata recorded for this section._"
    head = "| id | claim | book | computed | verdict | why |\n|---|---|---|---|---|---|\n"
    esc = lambda s: s.replace("|", "\\|").replace("\n", " ")
    return head + "".join(
        f"| {r['id']} | {esc(r['claim'])} | {esc(r['book_value'])} | {esc(r['computed_value'])} | "
        f"**{r['verdict']}** | {esc(r['why'])} |\n"
        for r in rows
    )


def show(section: str):
    """Render a section's errata in a notebook and return the rows."""
    from IPython.display import Markdown, display

    rows = for_section(section)
    display(Markdown(as_markdown(rows)))
    return rows
