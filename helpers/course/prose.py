"""The text's figures tied to the outputs: every figure a notebook's markdown states is supported.

A *figure* is a number with a unit of measure (``83.9 GB``, ``470 ms``, ``42%``, ``2.4x``,
``989 TFLOP/s``). Each figure in a notebook's markdown must be supported, or ``tests/
test_prose_numbers.py`` fails naming it:

* by a **stored output** of the same notebook (text, tables, the ledger and errata it renders):
  some output figure of the same kind (bytes, seconds, bytes/s, FLOP/s, FLOPs, percent, ratio)
  equals it to the precision the text gives, in any unit of its kind (``84 GB`` is supported by an
  output ``83.92 GB`` and by ``78.2 GiB``; ``83.9 GB`` is not supported by ``83.97 GB``). When an
  output changes, the sentence that quoted the old value fails: that is the point.
* or by a **mark** in the cell, an HTML comment (invisible in JupyterLab and in the book) that says
  where a figure not computed by the notebook comes from::

      <!-- figures: 470 ms = book P.6-4; 50 ms = input; 2 bytes = fact data/hardware.json -->

  - ``book ID``: the chapter's figure, quoted; ``ID`` is a row of the ledger (``data/claims/``,
    usually this notebook's own) whose claim or book value holds the same figure;
  - ``input``: a value the notebook chose (a sleep, a message size); a code cell of the notebook
    holds it as a literal (``0.05`` or ``50`` for ``50 ms``);
  - ``fact SOURCE``: a figure about the world that is not the chapter's (a datasheet's peak, a
    format's size); ``SOURCE`` names where it comes from, and a source that is a file of this
    repository (``data/hardware.json``) must hold the number.

Written as text, not parsed from code: the checker reads what a reader reads. ``python -m
helpers.course.prose [NOTEBOOK ...]`` lists every unsupported figure (all notebooks without arguments).
"""
from __future__ import annotations

import csv
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CLAIMS = ROOT / "data" / "claims"

# unit -> (kind, size of one unit in the kind's base unit)
UNITS = {
    "%": ("percent", 1), "percent": ("percent", 1),
    "x": ("ratio", 1), "×": ("ratio", 1), "times": ("ratio", 1),
    "bytes": ("bytes", 1), "byte": ("bytes", 1),  # not "B": "70 B" is as often 70 billion parameters
    "B/param": ("bytes", 1), "B/parameter": ("bytes", 1),
    "KB": ("bytes", 1e3), "kB": ("bytes", 1e3), "MB": ("bytes", 1e6), "GB": ("bytes", 1e9), "TB": ("bytes", 1e12),
    "PB": ("bytes", 1e15), "KiB": ("bytes", 2**10), "MiB": ("bytes", 2**20), "GiB": ("bytes", 2**30),
    "TiB": ("bytes", 2**40),
    "ns": ("seconds", 1e-9), "µs": ("seconds", 1e-6), "us": ("seconds", 1e-6), "ms": ("seconds", 1e-3),
    "s": ("seconds", 1), "sec": ("seconds", 1), "second": ("seconds", 1), "seconds": ("seconds", 1),
    "min": ("seconds", 60), "minute": ("seconds", 60), "minutes": ("seconds", 60),
    "h": ("seconds", 3600), "hour": ("seconds", 3600), "hours": ("seconds", 3600),
    "day": ("seconds", 86400), "days": ("seconds", 86400),
    "MB/s": ("bytes/s", 1e6), "GB/s": ("bytes/s", 1e9), "TB/s": ("bytes/s", 1e12),
    "Gb/s": ("bytes/s", 1e9 / 8), "Tb/s": ("bytes/s", 1e12 / 8), "bytes/s": ("bytes/s", 1),
    "GFLOP/s": ("FLOP/s", 1e9), "TFLOP/s": ("FLOP/s", 1e12), "PFLOP/s": ("FLOP/s", 1e15), "TF/s": ("FLOP/s", 1e12),
    "TFLOPS": ("FLOP/s", 1e12),
    "FLOP": ("FLOPs", 1), "FLOPs": ("FLOPs", 1), "GFLOP": ("FLOPs", 1e9), "TFLOP": ("FLOPs", 1e12),
    "PFLOP": ("FLOPs", 1e15),
}
# a unit written right after the digits ("70B", "4h") means billions or "4 x hidden size": only
# these count when attached
ATTACHED = {"%", "x", "×", "ms", "µs", "us", "ns", "GB", "MB", "KB", "TB", "GiB", "MiB", "KiB", "TiB", "GB/s", "TB/s",
            "Gb/s", "TFLOP/s", "PFLOP/s", "GFLOP/s", "TF/s"}
_UNIT = "|".join(sorted(map(re.escape, UNITS), key=len, reverse=True))
_NUMBER = r"(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?:e([-+]?\d+))?"
# a figure: digits (1,234 or 12.5 or 3e9), a unit, and not a dimension ("32 x 32") or part of a name;
# "GB/GPU" and "GB per GPU" are figures in GB; "40-65%", "79.5 of 80 GB" and "1 to 16 MiB" are two figures
_FIGURE = re.compile(r"(?<![\w.,/^_{])(?:" + _NUMBER + r"(?:[-–]|\s(?:of|to)\s))?" + _NUMBER + r"(\s?)(" + _UNIT
                     + r")(?!\w)(?!/(?!GPU|rank|device|step|token|param|micro))(?!\s?\d)")
# "times" is a ratio only in a comparison ("17 times fewer"), not a count ("repeated 3 times")
_COMPARISON = re.compile(r"\s+(more|fewer|less|larger|smaller|faster|slower|higher|lower|as|bigger|longer|shorter"
                         r"|the|over|that)\b")
_PER_BYTE = re.compile(r"\s*(per|/)\s*(bytes?|B)\b")
_MARKS = re.compile(r"<!--\s*figures:(.*?)-->", re.S)
_LITERAL = re.compile(r"(?<![\w.])\d[\d_]*(?:\.\d+)?(?:e[-+]?\d+)?")


@dataclass(frozen=True)
class Figure:
    """One figure as written: ``text`` (``"83.9 GB"``), its ``kind``, its ``value`` in the kind's base
    unit (bytes, seconds...) and ``half``, half the last digit's step (what its rounding allows)."""

    text: str
    kind: str
    value: float
    half: float

    def agrees(self, other: "Figure") -> bool:
        """The two can be the same quantity: same kind, and the more precise of the two rounds to the
        coarser one (its value lies strictly inside the coarser one's rounding interval). A zero
        supports only a zero."""
        if self.kind != other.kind:
            return False
        if (self.value == 0) != (other.value == 0):
            return False
        coarse = max(self.half, other.half)
        return abs(self.value - other.value) < coarse * (1 - 1e-9)


def _figure(text, digits, exp, unit) -> Figure:
    kind, size = UNITS[unit]
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    scale = size * 10 ** int(exp or 0)
    return Figure(text, kind, float(digits.replace(",", "")) * scale, 0.5 * 10 ** -decimals * scale)


def figures(text: str) -> list[Figure]:
    """Every figure in ``text`` (inline code excluded: a name like ``bytes_sent`` is not a figure)."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)  # a fenced code block, then inline code
    text = re.sub(r"``.*?``|`[^`\n]*`", " ", text)
    text = re.sub(r"\]\([^)\s]*\)", "]", text)  # a link's target is an address, not prose
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text).replace("\\,", " ").replace("\\%", "%").replace("$", " ")
    out = []
    for m in _FIGURE.finditer(text):
        first, first_exp, digits, exp, space, unit = m.groups()
        if not space and unit not in ATTACHED:
            continue
        after = text[m.end():]
        if unit == "times" and not _COMPARISON.match(after):
            continue
        if UNITS[unit][0] == "FLOPs" and _PER_BYTE.match(after):
            continue  # an intensity (FLOPs per byte), not a count of FLOPs
        whole = m.group(0).strip()
        if first is not None:
            out.append(_figure(f"{first} {unit}" if space else f"{first}{unit}", first, first_exp, unit))
            whole = whole[whole.index(digits, len(first)):]
        out.append(_figure(whole, digits, exp, unit))
    return out


def _figure_in_code(fig: Figure, literal: float) -> bool:
    """A code literal that is the figure in some unit of its kind (a percentage also as a fraction)."""
    sizes = [size for kind, size in UNITS.values() if kind == fig.kind] + ([100] if fig.kind == "percent" else [])
    return any(abs(literal * size - fig.value) <= fig.half for size in sizes)


def _cell_text(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def output_text(nb: dict) -> str:
    """What the notebook's stored outputs show: streams, text, markdown and HTML."""
    parts = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            parts.append("".join(o.get("text", "")))
            for mime, v in o.get("data", {}).items():
                if mime in ("text/plain", "text/markdown", "text/html"):
                    parts.append("".join(v) if isinstance(v, list) else v)
    return "\n".join(parts)


def marks(source: str) -> dict[str, tuple[str, str]]:
    """``{figure text: (kind, reference)}`` from the cell's ``<!-- figures: ... -->`` comments."""
    out = {}
    for block in _MARKS.findall(source):
        for entry in filter(None, (e.strip() for e in block.split(";"))):
            fig, sep, how = entry.partition("=")
            kind, _, ref = how.strip().partition(" ")
            if not sep or kind not in ("book", "input", "fact"):
                raise ValueError(f"a figures mark must read 'FIGURE = book ID | input | fact SOURCE', got {entry!r}")
            out[fig.strip()] = (kind, ref.strip())
    return out


def _ledger() -> dict[str, str]:
    """Every ledger row's claim and book value, by id (a notebook may quote another section's claim)."""
    rows = {}
    for path in sorted(CLAIMS.glob("*.csv")):
        with open(path, newline="") as f:
            rows.update({r["id"]: f"{r['claim']} {r['book_value']}" for r in csv.DictReader(f)})
    return rows


def _in_code(fig: Figure, code: str) -> bool:
    """A literal of ``code`` equals the figure in some unit of its kind."""
    return any(_figure_in_code(fig, float(lit.replace("_", ""))) for lit in _LITERAL.findall(code))


def _check_mark(fig: Figure, kind: str, ref: str, ledger: dict[str, str], code: str) -> str | None:
    """None if the mark supports the figure, else why not (``ledger``: :func:`_ledger`)."""
    if kind == "book":
        row = ledger.get(ref)
        if row is None:
            return f"'{fig.text}' is marked as the chapter's figure {ref}, which is not a row of the ledger (data/claims/)"
        if not any(fig.agrees(g) for g in figures(row)):
            return f"'{fig.text}' is marked as the chapter's figure {ref}, but that ledger row does not state it"
        return None
    if kind == "input":
        return None if _in_code(fig, code) else f"'{fig.text}' is marked as an input, but no code cell holds it"
    if not ref:
        return f"'{fig.text}' is marked as a fact without a source"
    path = ROOT / ref.split()[0]
    if ref.startswith(("data/", "helpers/")):
        if not path.is_file():
            return f"'{fig.text}': its source {ref.split()[0]} does not exist"
        if not _in_code(fig, path.read_text()):
            return f"'{fig.text}': its source {ref.split()[0]} does not hold that number"
    return None


def check(path: Path | str) -> list[str]:
    """Every unsupported figure of the notebook at ``path``, and every mark that does not hold."""
    path = Path(path)
    nb = json.loads(path.read_text())
    shown = figures(output_text(nb))
    code = "\n".join(_cell_text(c) for c in nb["cells"] if c["cell_type"] == "code")
    problems, ledger = [], None
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        source = _cell_text(cell)
        marked = marks(source)
        text = _MARKS.sub(" ", source)
        found = figures(text)
        for fig in found:
            if fig.text in marked:
                if ledger is None:  # read once a notebook, and only when a mark needs it
                    ledger = _ledger()
                why = _check_mark(fig, *marked[fig.text], ledger, code)
                if why:
                    problems.append(f"{path.name} cell {i}: {why}")
            elif not any(fig.agrees(s) for s in shown):
                at = text.find(fig.text)
                context = " ".join(text[max(0, at - 60): at + len(fig.text) + 20].split())
                problems.append(f"{path.name} cell {i}: '{fig.text}' is in no output and not marked (...{context}...)")
        for text_of_mark in set(marked) - {f.text for f in found}:
            problems.append(f"{path.name} cell {i}: the mark for '{text_of_mark}' names a figure the cell does not state")
    return problems


def notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def main(argv=None) -> int:
    paths = [Path(a) for a in (sys.argv[1:] if argv is None else argv)] or notebooks()
    problems = [p for path in paths for p in check(path)]
    print("\n".join(problems) or f"every figure of {len(paths)} notebook(s) is supported")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
