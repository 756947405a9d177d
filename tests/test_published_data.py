"""data/published/: measured memory and throughput of real runs, read by helpers.published (issues 26, 27).

The file checks read the CSVs with the csv module, apart from the reader, so a reader that let a
bad row through would still be caught here.
"""
import csv
import math
import re
from pathlib import Path

import pytest

from helpers import published as pb

DATA = Path(__file__).resolve().parents[1] / "data" / "published"
DEGREES = ("dp_shard", "dp_replicate", "tp", "pp", "cp")


def raw(name):
    with open(DATA / name, newline="") as f:
        return list(csv.DictReader(f))


def spellings(x):
    """How a source may print the number x: 5762 as 5,762, 1.1 as 1.10 (fractions: :func:`in_quote`)."""
    return {f"{x:g}", f"{x:,g}", f"{x:.1f}", f"{x:.2f}", f"{x:,.0f}"}


def in_quote(value, quote, percent=False):
    x = float(value)
    if percent:
        return any(f"{s}%" in quote for s in {f"{x * 100:.1f}", f"{round(x * 100, 6):g}"})
    return any(s in quote for s in spellings(x))


# ---- the files themselves ----

@pytest.mark.parametrize("name,columns", [("memory.csv", pb.MEMORY_COLUMNS),
                                          ("throughput.csv", pb.THROUGHPUT_COLUMNS)])
def test_each_file_has_exactly_the_documented_columns_and_every_cell_filled(name, columns):
    with open(DATA / name, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    assert tuple(header) == columns
    for n, row in enumerate(rows, 2):
        assert len(row) == len(header), (name, n)
        empty = [c for c, v in zip(header, row) if not v.strip()]
        assert not empty, f"{name} line {n}: empty {empty} (write the value or 'unstated')"
    readme = (DATA / "README.md").read_text()
    undocumented = [c for c in columns if f"`{c}`" not in readme]
    assert not undocumented, f"README.md does not describe {undocumented}"


@pytest.mark.parametrize("name", ["memory.csv", "throughput.csv"])
def test_every_row_has_a_source_with_an_address_and_a_quote(name):
    for r in raw(name):
        assert re.search(r"https?://\S+", r["source"]), r["id"]
        assert re.search(r"Table|Section|Abstract|README|table", r["source"]), r["id"]
        assert len(r["quote"]) > 40 and r["quote"] != pb.UNSTATED, r["id"]


def test_every_memory_quote_contains_its_value_and_the_gib_follow_from_the_unit():
    for r in raw("memory.csv"):
        assert r["value_published"] in r["quote"], r["id"]
        factor = {"GiB": 1.0, "GB": 1e9 / 2**30, "MiB": 1 / 1024}[r["unit_published"]]
        assert math.isclose(float(r["value_gib"]), float(r["value_published"]) * factor, abs_tol=0.006), r["id"]
        assert 0 < float(r["value_gib"]) <= 192, r["id"]     # no GPU in these sources holds more


def test_every_throughput_figure_stated_is_in_its_quote():
    for r in raw("throughput.csv"):
        stated = [c for c in ("tokens_per_s_per_gpu", "tflops_per_gpu", "step_time_s", "mfu", "hfu")
                  if r[c] != pb.UNSTATED]
        assert stated, r["id"]
        for c in stated:
            assert in_quote(r[c], r["quote"], percent=c in ("mfu", "hfu")), (r["id"], c, r[c])


def test_the_minimum_counts_and_publications_are_met():
    mem, thr = raw("memory.csv"), raw("throughput.csv")
    assert len(mem) >= 14 and len({r["publication"] for r in mem}) >= 3
    assert len({r["team"] for r in mem}) >= 2
    assert len(thr) >= 8 and len({r["publication"] for r in thr}) >= 3
    assert len({r["team"] for r in thr}) >= 3            # independent: different teams


@pytest.mark.parametrize("name", ["memory.csv", "throughput.csv"])
def test_degrees_multiply_to_the_world_size_where_all_are_stated(name):
    checked = 0
    for r in raw(name):
        if pb.UNSTATED in (r[c] for c in DEGREES):
            assert r["notes"] != pb.UNSTATED, r["id"]     # an unstated degree is explained
            continue
        assert math.prod(int(r[c]) for c in DEGREES) == int(r["world_size"]), r["id"]
        checked += 1
    assert checked >= 8


def test_local_batch_times_data_parallel_degree_is_the_quoted_global_batch():
    checked = 0
    for r in raw("memory.csv") + raw("throughput.csv"):
        m = re.search(r"global batch size (\d+)", r["quote"])
        if m and r["local_batch"] != pb.UNSTATED:
            assert int(r["local_batch"]) * int(r["dp_shard"]) * int(r["dp_replicate"]) == int(m.group(1)), r["id"]
            checked += 1
    assert checked >= 10


def test_recompute_and_measures_use_the_documented_words():
    for r in raw("memory.csv") + raw("throughput.csv"):
        assert r["recompute"] in pb.RECOMPUTE or re.fullmatch(r"selective-layer-[1-9]\d*", r["recompute"]), r["id"]
    for r in raw("memory.csv"):
        assert r["measures"] in pb.MEASURES and r["measures_inferred"] in pb.MEASURES, r["id"]


# ---- the reader ----

def test_the_reader_types_every_row():
    points, runs = pb.memory_points(), pb.throughput_runs()
    assert len(points) == len(raw("memory.csv")) and len(runs) == len(raw("throughput.csv"))
    p = {x.id: x for x in points}["tt24-t6-04"]          # 405B, FSDP 1 CP 8, 262,144 tokens
    assert (p.value_gib, p.layout.cp, p.layout.seq_len, p.layout.micro_batches) == (84.9, 8, 262144, None)
    r = {x.id: x for x in runs}["llama3-t4-3"]           # DP printed 4: left unstated
    assert (r.mfu, r.tflops_per_gpu, r.layout.dp_shard, r.tokens_per_s_per_gpu) == (0.38, 380.0, None, None)
    assert all(isinstance(x.layout.world_size, int) for x in runs)


def rewrite(tmp_path, name, row_id, **cells):
    rows = raw(name)
    for r in rows:
        if r["id"] == row_id:
            r.update(cells)
    out = tmp_path / name
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return out


@pytest.mark.parametrize("cells,column,words", [
    ({"seq_len": ""}, "seq_len", "empty"),
    ({"tp": "two"}, "tp", "number"),
    ({"tp": "0"}, "tp", ">= 1"),
    ({"dp_shard": "4"}, "world_size", "not the world size 8"),
    ({"recompute": "some"}, "recompute", "must be one of"),
    ({"model": pb.UNSTATED}, "model", "cannot be unstated"),
    ({"value_gib": "80.0"}, "value_gib", "is not 82.4 GiB"),
    ({"quote": "a quote that lost its figure, long enough to read as one"}, "quote", "82.4"),
    ({"unit_published": "GB", "value_gib": "82.4"}, "value_gib", "GB"),
])
def test_a_bad_memory_file_is_refused_naming_file_row_and_column(tmp_path, cells, column, words):
    path = rewrite(tmp_path, "memory.csv", "tt24-t1-01", **cells)
    with pytest.raises(ValueError) as e:
        pb.memory_points(path)
    msg = str(e.value)
    assert "memory.csv" in msg and "'tt24-t1-01'" in msg and f"column {column!r}" in msg and words in msg, msg


def test_a_value_in_gb_is_converted_to_gib(tmp_path):
    path = rewrite(tmp_path, "memory.csv", "tt24-t1-01", unit_published="GB", value_gib="76.74")
    p = {x.id: x for x in pb.memory_points(path)}["tt24-t1-01"]
    assert p.value_gib == 76.74 and math.isclose(82.4e9 / 2**30, 76.74, abs_tol=0.006)


def test_a_bad_throughput_file_is_refused(tmp_path):
    path = rewrite(tmp_path, "throughput.csv", "megatron21-t1-01", mfu="1.5")
    with pytest.raises(ValueError, match=r"throughput.csv: row 'megatron21-t1-01' .*column 'mfu'"):
        pb.throughput_runs(path)
    blank = dict.fromkeys(("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "hfu", "step_time_s"), pb.UNSTATED)
    path = rewrite(tmp_path, "throughput.csv", "megatron21-t1-01", **blank)
    with pytest.raises(ValueError, match="at least one of"):
        pb.throughput_runs(path)


def test_a_file_with_a_missing_column_or_a_repeated_id_is_refused(tmp_path):
    rows = raw("memory.csv")
    out = tmp_path / "memory.csv"
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[c for c in rows[0] if c != "measures"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(ValueError, match=r"memory.csv: header lacks columns \['measures'\]"):
        pb.memory_points(out)
    path = rewrite(tmp_path, "memory.csv", "tt24-t1-02", id="tt24-t1-01")
    with pytest.raises(ValueError, match="column 'id': appears twice"):
        pb.memory_points(path)
