"""``./workbook site``: the 23 notebooks as a static HTML book, from their stored outputs (issue 28).

Nothing is executed: the pages show the outputs stored in the notebooks (``./workbook refresh``
makes them fresh). The book is built with jupyter-book 1.x (Sphinx 7 and myst-nb, execution off),
installed on demand from ``docs/site/requirements.txt`` by ``./workbook`` (not part of the pinned
set). It works offline at build and at view time: MathJax 3 with SVG output (no web fonts, which
Chromium does not load from ``file://``) comes from the ``sphinx-mathjax-offline`` package and is
copied into the site, the theme's icons and the search index are Sphinx's own files, and the
build fails if a page would load anything from another host.

Each notebook page, in reading order (P.1-P.15, then 12.1.1-12.4.2), gets a "Run this notebook"
box, and its section's errata and claims ledger (``data/claims/``) as tables where the notebook
shows them, each claim's ``where`` a link to the heading that shows it. An index page carries the
section table, one page lists every erratum of both chapters (sortable by any column).

A notebook without stored outputs (a code cell never executed) or with an error output is named
and nothing is built; the site is built in a temporary folder and moved into place whole.

    python -m helpers.course.site [--out DIR]     # what ./workbook site runs; DIR defaults to site/
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import __version__
from . import claims, errata

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
REQUIREMENTS = ROOT / "docs" / "site" / "requirements.txt"
STATIC = ROOT / "docs" / "site" / "static"
DEFAULT_OUT = ROOT / "site"
_ROW = re.compile(r"^\| (P\.\d+|12\.\d\.\d) \| `(notebooks/[^`]+\.ipynb)` \| (.*) \|$")
_LAUNCH = re.compile(r"\blaunch\s*\(")
_LEDGER_CALL = re.compile(r"\b(errata\.show|claims\.show_ledger)\s*\(")
_TRACE_LINK = re.compile(r"<a href='(\.?traces/[^']+)'[^>]*>(.*?)</a>", re.S)
# anything a page would fetch from another host: a script, a stylesheet, an image, a font
_REMOTE = re.compile(r"""<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.I)


class SiteError(Exception):
    """The site cannot be built (the message says why and what to do)."""


def sections() -> list[tuple[str, Path, str]]:
    """``(section id, notebook path, what it makes tangible)`` in reading order, from the README."""
    rows = []
    for line in README.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m:
            rows.append((m.group(1), ROOT / m.group(2), m.group(3)))
    if not rows:
        raise SiteError("README.md has no notebook table ('| P.1 | `notebooks/...ipynb` | ... |')")
    return rows


def problems(paths) -> list[str]:
    """What keeps these notebooks out of the site: no stored outputs, or an error output."""
    out = []
    for path in paths:
        rel = os.path.relpath(path, ROOT)
        try:
            nb = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            out.append(f"{rel}: cannot be read ({exc})")
            continue
        code = [(i, c) for i, c in enumerate(nb.get("cells", [])) if c.get("cell_type") == "code"]
        never = [i for i, c in code if "".join(c.get("source", "")).strip() and c.get("execution_count") is None]
        if never:
            out.append(f"{rel}: no stored outputs ({len(never)} of {len(code)} code cells never executed, "
                       f"first: cell {never[0]})")
        for i, c in code:
            for o in c.get("outputs", []):
                if o.get("output_type") == "error":
                    evalue = str(o.get("evalue", ""))[:80]
                    out.append(f"{rel}: cell {i} has an error output ({o.get('ename')}: {evalue})")
    return out


# ---- headings and their anchors, as MyST computes them ------------------------------------------

def _md_parser():
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser

    exts = {"colon_fence", "dollarmath", "substitution", "tasklist"}  # as CONFIG enables them
    return create_md_parser(MdParserConfig(enable_extensions=exts, heading_anchors=6), RendererHTML)


def headings(nb: dict, parser=None) -> list[tuple[str, str, str]]:
    """``(heading source, heading as rendered text, anchor)`` of every heading, in page order."""
    from markdown_it.tree import SyntaxTreeNode
    from myst_parser.mdit_to_docutils.base import compute_unique_slug

    parser = parser or _md_parser()
    seen: dict[str, int] = {}
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        tree = SyntaxTreeNode(parser.parse("".join(cell["source"])))
        for node in tree.walk():
            if node.type != "heading":
                continue
            slug = compute_unique_slug(node, seen)
            seen[slug] = 1
            inline = node.children[0]
            parts = inline.to_tokens()[0].children or []
            text = "".join(t.content for t in parts if t.type in ("text", "code_inline"))
            out.append((inline.content.strip(), text, slug))
    return out


def heading_slugs(nb: dict, parser=None) -> dict[str, str]:
    """Heading source (as the ledger's ``where`` writes it) -> its anchor on the page (first wins)."""
    out: dict[str, str] = {}
    for source, _, slug in headings(nb, parser):
        out.setdefault(source, slug)
    return out


_NB_LINK = re.compile(r"\]\((?:\.\./[a-z0-9_]+/)?([a-z0-9_]+\.ipynb)#([^)\s]+)\)")


def relink(text: str, anchors: dict[str, dict[str, str]]) -> str:
    """Links between notebooks (``../part/nb.ipynb#JupyterLab-anchor``) as links between pages:
    the site is flat, and MyST names a heading's anchor otherwise than JupyterLab."""
    def sub(m):
        page, anchor = m.group(1), m.group(2)
        if page not in anchors:
            raise SiteError(f"a link to {page}#{anchor}: no such notebook in the book")
        if anchor not in anchors[page]:
            raise SiteError(f"a link to {page}#{anchor}: {page} has no such heading")
        return f"]({page}#{anchors[page][anchor]})"
    return _NB_LINK.sub(sub, text)


# ---- the pages ------------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip()


def _where_link(row, page: str, slugs: dict[str, str]) -> str:
    slug = slugs.get(row["where"])
    if slug is None:
        raise SiteError(f"ledger row {row['id']}: 'where' {row['where']!r} is no heading of {page}")
    target = f"#{slug}" if page == "" else f"{page}#{slug}"
    return f"[{_cell(row['where'])}]({target})"


def ledger_markdown(section: str, slugs: dict[str, str], page: str = "") -> str:
    """The section's errata, then its whole ledger, as MyST tables (``where`` as links)."""
    rows = claims.for_section(section)
    errs = [r for r in rows if r["verdict"] in claims.ERRATA_VERDICTS]
    out = [f"**Errata of {section}** ({len(errs)}; every erratum of both chapters: [errata](errata.md))\n"]
    if errs:
        out.append("\n| id | claim | book | computed | verdict | why | shown in |\n"
                   "|---|---|---|---|---|---|---|\n")
        out += [f"| {r['id']} | {_cell(r['claim'])} | {_cell(r['book_value'])} | {_cell(r['our_value'])} | "
                f"**{r['verdict']}** | {_cell(r['why'])} | {_where_link(r, page, slugs)} |\n" for r in errs]
    else:
        out.append("\n_No errata recorded for this section._\n")
    c = claims.counts(rows)
    out.append(f"\n**Claims ledger of {section}**: {len(rows)} claims, "
               + ", ".join(f"{k} {v}" for v, k in c.items() if k) + ".\n")
    out.append("\n| id | claim | book | ours | verdict | found by | shown in |\n|---|---|---|---|---|---|---|\n")
    out += [f"| {r['id']} | {_cell(r['claim'])} | {_cell(r['book_value'])} | {_cell(r['our_value'])} | "
            f"{r['verdict']} | {r['found_by']} | {_where_link(r, page, slugs)} |\n" for r in rows]
    return "".join(out)


def _headings_above(nb: dict, index: int) -> str:
    for cell in reversed(nb["cells"][:index]):
        if cell["cell_type"] == "markdown":
            for line in reversed("".join(cell["source"]).splitlines()):
                m = re.match(r"^#{1,6}\s+(.*\S)\s*$", line)
                if m:
                    return m.group(1)
    return "(the top)"


def run_box(nb: dict, rel: str) -> str:
    """The "Run this notebook" box: the two commands, the cells that start ranks, what a GPU changes."""
    rank_cells = [i for i, c in enumerate(nb["cells"])
                  if c["cell_type"] == "code" and _LAUNCH.search("".join(c["source"]))]
    if rank_cells:
        ranks = (f"{len(rank_cells)} code cells start ranks with `helpers.launcher.launch`, under: "
                 + "; ".join(f"*{_cell(h)}*" for h in dict.fromkeys(_headings_above(nb, i) for i in rank_cells))
                 + ". The rest runs in the kernel alone.")
    else:
        ranks = "No cell starts ranks: the whole notebook runs in the kernel alone."
    return (":::{admonition} Run this notebook\n:class: tip\n\n"
            "This page shows the outputs stored in the notebook. To run it yourself (Python 3.11+, bash):\n\n"
            "```bash\n./workbook lab             # the student edition (solutions stubbed)\n"
            "./workbook lab --teacher   # the instructor edition, solutions in\n"
            "./workbook test            # the whole suite, every notebook included\n```\n\n"
            f"In JupyterLab, open `{rel.split('/', 1)[-1]}` (under `student/` or `notebooks/`).\n\n"
            f"{ranks}\n\n"
            "**What a GPU changes**: with GPUs, `launch` picks NCCL with one rank per GPU "
            "(`cuda:<rank>`); without, gloo on CPU processes (4 by default). Exact checks hold on both; "
            "measured times and bandwidths are this machine's, not a cluster's.\n:::\n")


def _markdown_cell(text: str, n: int) -> dict:
    return {"cell_type": "markdown", "id": f"workbook-site-{n}", "metadata": {}, "source": text}


def page_notebook(nb: dict, section: str, rel: str, parser=None, anchors=None) -> dict:
    """The notebook as its page shows it: the run box after the title, the ledger tables where
    the notebook shows its errata and ledger, trace links (files a run writes) as plain names."""
    nb = copy.deepcopy(nb)
    slugs = heading_slugs(nb, parser)
    cells = []
    shown = False
    for k, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown" and anchors is not None:
            cell["source"] = relink("".join(cell["source"]), anchors)
        if cell["cell_type"] == "code":
            for o in cell.get("outputs", []):
                data = o.get("data", {})
                if "text/html" in data:
                    text = "".join(data["text/html"])
                    data["text/html"] = _TRACE_LINK.sub(lambda m: f"<code>{m.group(1)}</code> (written "
                                                        "beside the notebook when you run it)", text)
        cells.append(cell)
        if k == 0:
            cells.append(_markdown_cell(run_box(nb, rel), 0))
        if cell["cell_type"] == "code" and _LEDGER_CALL.search("".join(cell["source"])):
            cell["outputs"] = [o for o in cell.get("outputs", []) if "text/markdown" not in o.get("data", {})]
            if not shown:
                cells.append(_markdown_cell(ledger_markdown(section, slugs), 1))
                shown = True
    if not shown:
        cells.append(_markdown_cell("## Errata and claims ledger\n\n" + ledger_markdown(section, slugs), 1))
    nb["cells"] = cells
    return nb


def index_page(rows, pages: dict[str, str]) -> str:

    counts = {s: (len(claims.for_section(s)), len(errata.for_section(s))) for s, _, _ in rows}
    table = "| section | notebook | what it makes tangible | claims | errata |\n|---|---|---|---|---|\n"
    table += "".join(f"| {s} | [{Path(p).stem}]({pages[s]}) | {what} | {counts[s][0]} | {counts[s][1]} |\n"
                     for s, p, what in rows)
    return (f"# The parallelism workbook\n\nVersion {__version__}. Jupyter notebooks that accompany two "
            "textbook chapters on parallelism for AI training: **Parallel Processing** (P.1-P.15) and "
            "**Chapter 12, Parallelism Strategies** (12.1.1-12.4.2). Every worked number of the chapters is "
            "recomputed; every mechanism is shown exactly in numpy first and then run with "
            "`torch.distributed`. These pages show the notebooks with their stored outputs; each page "
            "says how to run it. Every erratum of both chapters is on one page: [errata](errata.md).\n\n"
            f"## The sections\n\n{table}\n"
            "## Licence\n\nThe notebooks' text and figures are under CC BY 4.0, their code under the MIT "
            "licence (the repository's LICENSE and LICENSES/). No chapter text is included: the "
            "notebooks cite sections.\n")


def errata_page(rows, slug_maps: dict[str, dict[str, str]], pages: dict[str, str]) -> str:
    body = ("| section | id | claim | book | computed | verdict | why | shown in |\n"
            "|---|---|---|---|---|---|---|---|\n")
    total = 0
    for s, _, _ in rows:
        for r in claims.errata(s):
            total += 1
            body += (f"| {s} | {r['id']} | {_cell(r['claim'])} | {_cell(r['book_value'])} | "
                     f"{_cell(r['our_value'])} | {r['verdict']} | {_cell(r['why'])} | "
                     f"{_where_link(r, pages[s], slug_maps[s])} |\n")
    return ("# Errata of both chapters\n\n"
            f"{total} claims of the chapters that the workbook finds off (verdicts "
            + ", ".join(claims.ERRATA_VERDICTS) + "), from the claims ledger. Click a column's "
            "heading to sort by it (section, verdict, ...); click again to reverse.\n\n"
            f"## All errata\n\n{body}")


CONFIG = """\
title: The parallelism workbook
author: The parallelism workbook authors
copyright: "2026"
only_build_toc_files: true
execute:
  execute_notebooks: "off"
parse:
  # no linkify: it would make "FACTS.md" a link to a host named FACTS.md
  myst_enable_extensions: [colon_fence, dollarmath, substitution, tasklist]
html:
  use_repository_button: false
  use_issues_button: false
  use_edit_page_button: false
  use_multitoc_numbering: false
  home_page_in_navbar: true
launch_buttons:
  notebook_interface: jupyterlab
  thebe: false
sphinx:
  config:
    # jupyter-book's own list less sphinx_thebe (it names a CDN copy of thebe in every page) and
    # intersphinx (nothing here is fetched from elsewhere)
    extensions: [sphinx_togglebutton, sphinx_copybutton, myst_nb, jupyter_book, sphinx_comments,
                 sphinx_external_toc, sphinx_design, sphinx_book_theme]
    # MathJax 3 with SVG output (no web fonts, which Chromium will not load from file://), from
    # the sphinx-mathjax-offline package, copied into the site
    mathjax_path: "mathjax/tex-svg.js"
    mathjax3_config:
      tex:
        inlineMath: [["\\\\(", "\\\\)"]]
        displayMath: [["\\\\[", "\\\\]"]]
        processEscapes: true
      options:
        processHtmlClass: "tex2jax_process|mathjax_process|math|output_area"
        menuOptions: {settings: {assistiveMml: false}}
      svg: {fontCache: global}
    myst_heading_anchors: 6
    nb_ipywidgets_js: {}
    html_static_path: ["_static"]
    html_js_files: ["sortable.js"]
    html_css_files: ["workbook.css"]
    html_show_sourcelink: false
    html_show_search_summary: false  # summaries are fetched from the pages: refused from file://
    html_context: {default_mode: light}  # else the theme logs "Got invalid theme mode" offline
    html_theme_options:
      use_download_button: false
      use_fullscreen_button: false
      search_bar_text: "Search the workbook..."
    suppress_warnings: ["myst.header", "mystnb.unknown_mime_type"]
"""


def _mathjax_dir() -> Path:
    """MathJax 3.2.2's files as the sphinx-mathjax-offline package installs them."""
    from importlib import metadata

    try:
        found = Path(metadata.distribution("sphinx-mathjax-offline").locate_file(
            "sphinx-mathjax-offline/static/mathjax"))
    except metadata.PackageNotFoundError:
        found = None
    if found is None or not (found / "tex-svg.js").exists():
        raise SiteError(f"MathJax is missing: pip install -r {REQUIREMENTS.relative_to(ROOT)}")
    return found


def write_source(src: Path) -> list[str]:
    """The book's source folder: config, table of contents, the pages. Returns the page names."""
    rows = sections()
    missing = [str(p.relative_to(ROOT)) for _, p, _ in rows if not p.exists()]
    if missing:
        raise SiteError(f"notebooks named in README.md are missing: {missing}")
    bad = problems([p for _, p, _ in rows])
    if bad:
        names = " ".join(sorted({b.split(":")[0] for b in bad}))
        raise SiteError("not built: these notebooks cannot be shown as they are stored:\n  " + "\n  ".join(bad)
                        + f"\nrun ./workbook refresh {names} and build again")
    parser = _md_parser()
    (src / "_static").mkdir(parents=True)
    for f in ("sortable.js", "workbook.css"):
        shutil.copy(STATIC / f, src / "_static" / f)
    pages, slug_maps, anchors, nbs = {}, {}, {}, {}
    for section, path, _ in rows:
        nbs[section] = nb = json.loads(path.read_text(encoding="utf-8"))
        slug_maps[section] = heading_slugs(nb, parser)
        pages[section] = path.name
        # JupyterLab's anchor of a heading: its text with spaces as dashes
        anchors[path.name] = {text.replace(" ", "-"): slug for _, text, slug in headings(nb, parser)}
    for section, path, _ in rows:
        out = page_notebook(nbs[section], section, str(path.relative_to(ROOT)), parser, anchors)
        (src / path.name).write_text(json.dumps(out, indent=1, ensure_ascii=False), encoding="utf-8")
    (src / "index.md").write_text(index_page(rows, pages), encoding="utf-8")
    (src / "errata.md").write_text(errata_page(rows, slug_maps, pages), encoding="utf-8")
    (src / "_config.yml").write_text(CONFIG, encoding="utf-8")
    part = lambda title, chapter: (f"  - caption: {title}\n    chapters:\n" + "".join(
        f"      - file: {Path(p).stem}\n" for s, p, _ in rows if claims.chapter(s) == chapter))
    toc = ("format: jb-book\nroot: index\nparts:\n" + part("Parallel Processing (P.1-P.15)", "P")
           + part("Chapter 12, Parallelism Strategies", "12")
           + "  - caption: Errata\n    chapters:\n      - file: errata\n")
    (src / "_toc.yml").write_text(toc, encoding="utf-8")
    return list(pages.values())


def toolchain_missing() -> str | None:
    """What of the site toolchain this environment lacks (None when it has all of it)."""
    from importlib import metadata

    for name in ("jupyter-book", "myst-nb", "sphinx-mathjax-offline"):
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return name
    return None


def ensure_toolchain() -> str | None:
    """Install ``docs/site/requirements.txt`` into this environment when something is missing
    (what the tests do; ``./workbook site`` does it in bash). One install at a time: a lock in the
    environment, since the suite runs test files side by side. Returns what is still missing."""
    import fcntl
    import importlib

    if toolchain_missing() is None:
        return None
    with open(Path(sys.prefix) / ".workbook-site-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if toolchain_missing() is not None:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", "-r", str(REQUIREMENTS)],
                           capture_output=True)
            importlib.invalidate_caches()
    return toolchain_missing()


def remote_loads(html_dir: Path) -> list[str]:
    """``page: tag`` for every resource a page would load from another host."""
    out = []
    for page in sorted(html_dir.rglob("*.html")):
        for m in _REMOTE.finditer(page.read_text(encoding="utf-8", errors="replace")):
            out.append(f"{page.relative_to(html_dir)}: {m.group(0)[:120]}")
    return out


MARKER = ".workbook-site"  # in every built site: only such a folder (or none, or an empty one) is replaced


def build(out: Path | str = DEFAULT_OUT) -> dict:
    """Build the site into ``out`` (replaced whole, only once the build has succeeded)."""
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise SiteError(f"{out} exists and is not a site this command built (no {MARKER} in it): "
                        "give --out a new or empty folder")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="workbook-site-") as tmp:
        src = Path(tmp) / "src"
        write_source(src)  # first: a notebook that cannot be shown stops the build here
        mathjax = _mathjax_dir()
        jb = Path(sys.executable).with_name("jupyter-book")
        # -W: a warning (a link or anchor that does not resolve, say) fails the build
        cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(src), "--path-output",
               str(Path(tmp) / "out"), "--builder", "html", "-W", "-n", "--keep-going"]
        env = dict(os.environ, PYDEVD_DISABLE_FILE_VALIDATION="1")
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode != 0:
            raise SiteError(f"jupyter-book build failed ({res.returncode}); nothing changed in {out}:\n"
                            + (res.stdout + res.stderr)[-4000:])
        html_dir = Path(tmp) / "out" / "_build" / "html"
        # the SVG build and what it may load on demand (TeX extensions, menu, speech); not the
        # CommonHTML builds and their fonts
        shutil.copytree(mathjax, html_dir / "_static" / "mathjax",
                        ignore=shutil.ignore_patterns("chtml", "*chtml*.js", "mml-svg.js", "node-main.js"))
        remote = remote_loads(html_dir)
        if remote:
            raise SiteError("not offline: pages would load from other hosts:\n  " + "\n  ".join(remote[:20]))
        for junk in (".buildinfo", ".doctrees", "_sources"):
            p = html_dir / junk
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        (html_dir / MARKER).write_text("built by ./workbook site (helpers/course/site.py); the next build replaces it\n")
        # into place whole: a sibling folder first (same file system), then two renames
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-new-", dir=out.parent))
        shutil.rmtree(staging)
        shutil.copytree(html_dir, staging)
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
            shutil.rmtree(old)
            out.rename(old)
        staging.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    pages = sorted(p.name for p in out.glob("*.html"))
    return {"out": out, "pages": pages, "seconds": time.monotonic() - started}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="./workbook site", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to build into (default: site/)")
    args = parser.parse_args(argv)
    try:
        info = build(args.out)
    except SiteError as exc:
        print(f"./workbook site: {exc}", file=sys.stderr)
        return 1
    print(f"built {len(info['pages'])} pages into {info['out']} in {info['seconds']:.1f} s; "
          f"open {info['out'] / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
