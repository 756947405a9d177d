"""Published measurements of real training runs, as data (issues 26 and 27; 12.4.1, 12.4.2, P.13).

``data/published/`` holds what teams outside this project measured on real GPU clusters, each row
with its source, the exact figure text (``quote``) and the run's configuration:

* ``memory.csv``: per-GPU peak memory (:func:`memory_points`, one :class:`MemoryPoint` a row);
* ``throughput.csv``: tokens per second per GPU, TFLOP/s per GPU, MFU, step time
  (:func:`throughput_runs`, one :class:`ThroughputRun` a row).

Every cell is filled: a value, or ``unstated`` where the source does not give it (the row's notes
say what is assumed). The reader turns ``unstated`` into ``None``, numbers into ints and floats,
memory into GiB (:data:`UNITS`: a source's GB is 10^9 bytes), and refuses a file that breaks the
schema with a ValueError naming the file, the row and the column. ``data/published/README.md``
describes every column and source.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from . import validate

DATA = Path(__file__).resolve().parent.parent / "data" / "published"
UNSTATED = "unstated"

# bytes of one unit, over bytes of one GiB
UNITS = {"GiB": 1.0, "MiB": 1 / 1024, "GB": 1e9 / 2**30, "MB": 1e6 / 2**30}
MEASURES = ("allocated", "active", "reserved", "nvidia-smi", UNSTATED)
# "selective": the source says selective without saying which kind
RECOMPUTE = ("none", "full", "selective", "selective-op", UNSTATED)
SELECTIVE_LAYER = re.compile(r"selective-layer-([1-9][0-9]*)")

LAYOUT = ("model", "params_b", "hardware", "world_size", "dp_shard", "dp_replicate", "tp", "pp", "cp",
          "pp_schedule", "micro_batches", "local_batch", "seq_len", "precision", "recompute", "optimizer", "other")
COMMON = ("id", "publication", "team", "source", "quote") + LAYOUT
MEMORY_COLUMNS = COMMON + ("value_published", "unit_published", "value_gib", "measures", "measures_inferred",
                           "notes")
THROUGHPUT_COLUMNS = COMMON + ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "hfu", "step_time_s",
                               "mfu_counts", "peak_tflops", "notes")
INTEGERS = ("world_size", "dp_shard", "dp_replicate", "tp", "pp", "cp", "micro_batches", "local_batch", "seq_len")
DEGREES = ("dp_shard", "dp_replicate", "tp", "pp", "cp")
# columns a row cannot leave unstated
REQUIRED = ("id", "publication", "team", "source", "quote", "model", "hardware", "world_size")


@dataclass(frozen=True)
class Layout:
    """How a run was set up; ``None`` wherever the source leaves it unstated."""
    model: str
    params_b: float | None
    hardware: str
    world_size: int
    dp_shard: int | None
    dp_replicate: int | None
    tp: int | None
    pp: int | None
    cp: int | None
    pp_schedule: str | None
    micro_batches: int | None
    local_batch: int | None     # sequences per DP rank per step
    seq_len: int | None
    precision: str | None
    recompute: str | None       # none, full, selective, selective-op, selective-layer-<k>
    optimizer: str | None
    other: str | None


@dataclass(frozen=True)
class Published:
    """What every row has: where it was published, the exact figure text, the run's configuration."""
    id: str
    publication: str
    team: str
    source: str
    quote: str
    layout: Layout


@dataclass(frozen=True)
class MemoryPoint(Published):
    """One published per-GPU peak memory figure."""
    value_published: str        # the number as printed
    unit_published: str         # its unit as printed (GiB, GB, ...)
    value_gib: float
    measures: str               # what the source says it measures, or "unstated"
    measures_inferred: str      # what the logging code of that version records, or "unstated"
    notes: str


@dataclass(frozen=True)
class ThroughputRun(Published):
    """One published run's throughput; each figure ``None`` where the source does not give it."""
    tokens_per_s_per_gpu: float | None
    tflops_per_gpu: float | None
    mfu: float | None           # a fraction, counted as mfu_counts says
    hfu: float | None
    step_time_s: float | None
    mfu_counts: str
    peak_tflops: float | None
    notes: str


class _Row:
    """One CSV row, whose every error names the file, the row and the column."""

    def __init__(self, path: Path, line: int, cells: dict):
        self.path, self.line, self.cells = path, line, cells
        self.id = cells.get("id") or "?"

    def error(self, column: str, message: str) -> ValueError:
        return ValueError(f"{self.path.name}: row {self.id!r} (line {self.line}), column {column!r}: {message}")

    def text(self, column: str) -> str | None:
        v = self.cells[column]
        if v is None or not v.strip():
            raise self.error(column, f"is empty; write the value or {UNSTATED!r}")
        if v == UNSTATED:
            if column in REQUIRED:
                raise self.error(column, "cannot be unstated")
            return None
        return v

    def number(self, column: str, integer: bool = False, fraction: bool = False):
        v = self.text(column)
        if v is None:
            return None
        try:
            x = int(v) if integer else float(v)
            if integer:
                return validate.integer_at_least(x, column)
            if fraction:
                return validate.probability(x, column)
            return validate.positive_number(x, column)
        except ValueError as e:
            raise self.error(column, str(e).replace("invalid literal", "not a number")) from None

    def choice(self, column: str, options) -> str | None:
        v = self.text(column)
        if column == "recompute" and v is not None and SELECTIVE_LAYER.fullmatch(v):
            return v
        try:
            validate.one_of(UNSTATED if v is None else v, column, options)
        except ValueError as e:
            raise self.error(column, str(e)) from None
        return v

    def layout(self) -> Layout:
        kw = {c: self.number(c, integer=True) for c in INTEGERS}
        kw |= {c: self.text(c) for c in ("model", "hardware", "pp_schedule", "precision", "optimizer", "other")}
        kw["params_b"] = self.number("params_b")
        kw["recompute"] = self.choice("recompute", RECOMPUTE)
        degrees = {c: kw[c] for c in DEGREES}
        if None not in degrees.values():
            try:
                validate.product_is(degrees, kw["world_size"], "the world size")
            except ValueError as e:
                raise self.error("world_size", str(e)) from None
        return Layout(**kw)


def _rows(path: Path, columns: tuple):
    """Each row of ``path`` as a :class:`_Row`, after checking the header and the ids."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = tuple(reader.fieldnames or ())
        missing = [c for c in columns if c not in header]
        extra = [c for c in header if c not in columns]
        if missing or extra:
            raise ValueError(f"{path.name}: header lacks columns {missing} and has unknown ones {extra}")
        seen = set()
        for cells in reader:
            row = _Row(path, reader.line_num, cells)
            if None in cells or any(v is None for v in cells.values()):
                raise row.error("*", f"has {len(cells.get(None, []))} cells too many or too few")
            if row.text("id") in seen:
                raise row.error("id", "appears twice")
            seen.add(row.id)
            yield row


def _common(row) -> dict:
    return dict(id=row.id, publication=row.text("publication"), team=row.text("team"), source=row.text("source"),
                quote=row.text("quote"), layout=row.layout())


def memory_points(path: str | Path | None = None) -> list[MemoryPoint]:
    """The rows of ``data/published/memory.csv`` (or ``path``), checked, with the value in GiB."""
    path = Path(path) if path is not None else DATA / "memory.csv"
    points = []
    for row in _rows(path, MEMORY_COLUMNS):
        unit = row.choice("unit_published", tuple(UNITS))
        published = row.number("value_published")
        gib = row.number("value_gib")
        if published is None or gib is None:
            raise row.error("value_gib" if gib is None else "value_published", "a memory point needs its value")
        expected = published * UNITS[unit]
        if not math.isclose(gib, expected, abs_tol=0.006):
            raise row.error("value_gib", f"{gib} GiB is not {published} {unit} = {expected:.3f} GiB")
        if row.cells["quote"].find(row.cells["value_published"]) < 0:
            raise row.error("quote", f"does not contain the published value {row.cells['value_published']!r}")
        points.append(MemoryPoint(
            **_common(row), value_published=row.cells["value_published"],
            unit_published=unit, value_gib=gib, measures=row.choice("measures", MEASURES) or UNSTATED,
            measures_inferred=row.choice("measures_inferred", MEASURES) or UNSTATED,
            notes=row.text("notes") or UNSTATED))
    return points


def throughput_runs(path: str | Path | None = None) -> list[ThroughputRun]:
    """The rows of ``data/published/throughput.csv`` (or ``path``), checked; MFU and HFU as fractions."""
    path = Path(path) if path is not None else DATA / "throughput.csv"
    runs = []
    for row in _rows(path, THROUGHPUT_COLUMNS):
        figures = dict(tokens_per_s_per_gpu=row.number("tokens_per_s_per_gpu"),
                       tflops_per_gpu=row.number("tflops_per_gpu"), mfu=row.number("mfu", fraction=True),
                       hfu=row.number("hfu", fraction=True), step_time_s=row.number("step_time_s"))
        if all(v is None for v in figures.values()):
            raise row.error("tokens_per_s_per_gpu",
                            "a run needs at least one of tokens/s, TFLOP/s, MFU, step time")
        runs.append(ThroughputRun(
            **_common(row), **figures,
            mfu_counts=row.text("mfu_counts") or UNSTATED,
            peak_tflops=row.number("peak_tflops"),
            notes=row.text("notes") or UNSTATED))
    return runs
