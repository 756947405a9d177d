"""The errata: where the chapters' numbers or definitions are off, with the correct value.

Serves every notebook (step 2 of "What every notebook does"): each notebook recomputes its
section's worked examples and renders its section's errata with :func:`show`. The errata are not
a list of their own: they are the rows of the claims ledger (:mod:`helpers.course.claims`,
``data/claims/``) whose verdict says the book is off: ``wrong`` (arithmetic or fact),
``inconsistent`` (contradicts another statement, or a definition or unit changes between places),
``ambiguous`` (true under one unstated assumption only) and ``rounding`` (right to within a
rounding the book does not state). One source of truth: edit the ledger.
"""
from __future__ import annotations

from . import claims

COLUMNS = ("id", "section", "claim", "book_value", "computed_value", "verdict", "why")
VERDICTS = claims.ERRATA_VERDICTS


def _as_erratum(row: dict[str, str]) -> dict[str, str]:
    out = {k: row[k] for k in COLUMNS if k in row}
    out["computed_value"] = row["our_value"]
    return out


def load(directory=claims.CLAIMS_DIR) -> list[dict[str, str]]:
    """Every erratum of every section (the ledger's off rows), with :data:`COLUMNS`."""
    return [_as_erratum(r) for r in claims.load(directory) if r["verdict"] in VERDICTS]


def for_section(section: str, directory=claims.CLAIMS_DIR) -> list[dict[str, str]]:
    """The errata of one section id, e.g. ``"12.1.1"`` or ``"P.7"``, in the ledger's order."""
    return [_as_erratum(r) for r in claims.errata(section, directory)]


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
