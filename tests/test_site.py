"""``./workbook site`` without a browser (issue 28, point 1): what it refuses to build from, that a
failed build leaves the old site as it was, and the pieces of its pages. The whole build and the
pages in a browser: tests/browser/test_site.py."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import doctor, site

ROOT = Path(__file__).resolve().parent.parent
P1 = ROOT / "notebooks" / "p_parallel_processing" / "p01_work_and_span.ipynb"


@pytest.fixture
def toolchain():
    """The site toolchain, installed when missing (as the browser test and ./workbook site do)."""
    missing = site.ensure_toolchain()
    if missing:
        pytest.skip(f"no site toolchain: {missing} missing after pip install -r docs/site/requirements.txt")


def _rows_with(tmp_path, spoil):
    """The README's sections, P.1's notebook replaced by a spoiled copy in tmp_path."""
    rows = site.sections()
    nb = json.loads(P1.read_text())
    spoil(nb)
    bad = tmp_path / "p01_work_and_span.ipynb"
    bad.write_text(json.dumps(nb))
    return [(s, bad if p == P1 else p, what) for s, p, what in rows], bad


def _clear_outputs(nb):
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            c["outputs"], c["execution_count"] = [], None


def _add_error(nb):
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    cell["outputs"].append({"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
                            "traceback": []})


@pytest.mark.parametrize("spoil, says", [(_clear_outputs, "no stored outputs"),
                                         (_add_error, "has an error output (ZeroDivisionError")])
def test_bad_notebooks_are_named_and_nothing_is_built(tmp_path, monkeypatch, spoil, says):
    rows, bad = _rows_with(tmp_path, spoil)
    monkeypatch.setattr(site, "sections", lambda: rows)
    out = tmp_path / "site"
    out.mkdir()
    (out / site.MARKER).write_text("")
    (out / "index.html").write_text("the previous site")
    with pytest.raises(site.SiteError) as err:
        site.build(out)
    msg = str(err.value)
    assert says in msg and "run ./workbook refresh" in msg and bad.name in msg, msg
    assert (out / "index.html").read_text() == "the previous site"  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p01_work_and_span.ipynb", "site"]  # no staging left


def test_the_stored_notebooks_can_all_be_shown():
    assert site.problems([p for _, p, _ in site.sections()]) == []
    assert [s for s, _, _ in site.sections()][:2] == ["P.1", "P.2"] and len(site.sections()) == 23


def test_it_refuses_to_replace_a_folder_it_did_not_build(tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(site.SiteError, match="is not a site this command built"):
        site.build(keep)
    assert (keep / "notes.txt").read_text() == "mine"
    with pytest.raises(SystemExit) as exc:
        site.main(["--bogus"])  # options are --out only
    assert exc.value.code == 2


def test_a_failed_build_leaves_the_old_site(tmp_path, monkeypatch, toolchain):
    out = tmp_path / "site"
    out.mkdir()
    (out / site.MARKER).write_text("")
    (out / "index.html").write_text("the previous site")

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 2, stdout="", stderr="WARNING: something")

    monkeypatch.setattr(site.subprocess, "run", failing)
    with pytest.raises(site.SiteError, match="jupyter-book build failed"):
        site.build(out)
    assert (out / "index.html").read_text() == "the previous site"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_headings_get_myst_anchors_and_links_between_notebooks_follow(toolchain):
    nb = {"cells": [{"cell_type": "markdown", "source": "# P.9 Title\n\n## 1. The `1F1B` schedule\n"},
                    {"cell_type": "markdown", "source": "## 1. The `1F1B` schedule\n### Why $p-1$?"}]}
    heads = site.headings(nb)
    # as MyST names them (the browser test checks that every such link resolves on the built pages)
    assert [h[2] for h in heads] == ["p9-title", "1-the-1f1b-schedule", "1-the-1f1b-schedule-1", "why-"]
    assert site.heading_slugs(nb)["1. The `1F1B` schedule"] == "1-the-1f1b-schedule"
    anchors = {"p09_x.ipynb": {"1.-The-1F1B-schedule": "1-the-1f1b-schedule"}}
    text = "see [the schedule](../p_parallel_processing/p09_x.ipynb#1.-The-1F1B-schedule)."
    assert site.relink(text, anchors) == "see [the schedule](p09_x.ipynb#1-the-1f1b-schedule)."
    with pytest.raises(site.SiteError, match="has no such heading"):
        site.relink("[x](p09_x.ipynb#Nope)", anchors)


def test_a_page_has_its_run_box_and_ledger_with_working_where_links(toolchain):
    nb = json.loads(P1.read_text())
    page = site.page_notebook(nb, "P.1", "notebooks/p_parallel_processing/p01_work_and_span.ipynb")
    sources = ["".join(c["source"]) for c in page["cells"]]
    assert sources[1].startswith(":::{admonition} Run this notebook") and "./workbook lab" in sources[1]
    assert "start ranks with `helpers.launcher.launch`" in sources[1]
    ledger = next(s for s in sources if s.startswith("**Errata of P.1**"))
    slugs = set(site.heading_slugs(nb).values())
    from helpers import claims

    rows = claims.for_section("P.1")
    links = [part.split(")")[0] for part in ledger.split("](#")[1:]]
    assert len(links) == len(rows) + len(claims.errata("P.1")) and set(links) <= slugs
    # the notebook's own markdown ledger output is replaced by the tables, not shown twice
    assert not any("text/markdown" in o.get("data", {}) for c in page["cells"] if c["cell_type"] == "code"
                   and "show_ledger" in "".join(c["source"]) for o in c["outputs"])
    bad = dict(rows[0], where="No such heading")
    with pytest.raises(site.SiteError, match="is no heading"):
        site._where_link(bad, "", site.heading_slugs(nb))


def test_no_rank_cells_says_so():
    nb = {"cells": [{"cell_type": "markdown", "source": "# T"}, {"cell_type": "code", "source": "1 + 1"}]}
    assert "No cell starts ranks" in site.run_box(nb, "x.ipynb")


def test_the_site_toolchain_is_not_in_the_pinned_set():
    pinned = {n for n, _ in doctor.pins((ROOT / "requirements.txt").read_text())}
    tools = {n for n, _ in doctor.pins(site.REQUIREMENTS.read_text())}
    assert tools == {"jupyter-book", "sphinx-mathjax-offline"} and not tools & pinned
    assert "/site/" in (ROOT / ".gitignore").read_text().splitlines()


def test_ensure_toolchain_installs_once_under_a_lock(tmp_path, monkeypatch):
    state = {"missing": "jupyter-book", "installs": []}

    def run(cmd, **kw):
        state["installs"].append(cmd)
        state["missing"] = None
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(site, "toolchain_missing", lambda: state["missing"])
    monkeypatch.setattr(site.subprocess, "run", run)
    monkeypatch.setattr(site.sys, "prefix", str(tmp_path))
    assert site.ensure_toolchain() is None and site.ensure_toolchain() is None
    assert len(state["installs"]) == 1 and state["installs"][0][-2:] == ["-r", str(site.REQUIREMENTS)]
    assert (tmp_path / ".workbook-site-install.lock").exists()
    monkeypatch.setattr(site.subprocess, "run", lambda cmd, **kw: None)  # an install that does nothing
    state["missing"] = "myst-nb"
    assert site.ensure_toolchain() == "myst-nb"  # still missing after the install: said, not hidden
