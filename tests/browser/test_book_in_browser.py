"""The static site of ``./workbook site`` in a real browser (issue 28, points 1-2).

Builds the whole site once (``python -m helpers.course.site --out <tmp>``; about 20 s here, under 60 s
required), then opens every page from ``file://`` in headless Chromium at 1366 x 768 with every
request that is not a file of the site routed to a failure, and checks: no console error, no
request leaving the site, every image decodes (and every figure is not blank), every internal link
and anchor resolves (the ledger's "shown in" links included), no raw ``$...$`` or ``\\(...\\)`` left
once MathJax has run, the page does not scroll sideways, and the search finds a term that occurs on
one page only. Chromium and Playwright come as for the JupyterLab test (``_ensure_tools``); the
site toolchain from ``docs/site/requirements.txt`` (installed into the running environment when
missing, as ``./workbook site`` does; skipped, saying so, when it cannot be had).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from test_browser import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, _ensure_tools

ROOT = Path(__file__).resolve().parents[2]
SITE_REQUIREMENTS = ROOT / "docs" / "site" / "requirements.txt"
BUILD_LIMIT_S = 60


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from helpers import site as book

    _ensure_tools()
    missing = book.ensure_toolchain()
    if missing:
        pytest.skip(f"no site toolchain: {missing} missing after pip install -r "
                    f"{SITE_REQUIREMENTS.relative_to(ROOT)}")
    out = tmp_path_factory.mktemp("site") / "site"
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "helpers.course.site", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - started
    assert res.returncode == 0, res.stderr[-3000:]
    return {"dir": out, "seconds": seconds, "stdout": res.stdout}


class _Page(HTMLParser):
    """ids, links and images of one built page."""

    def __init__(self):
        super().__init__()
        self.ids, self.links, self.images = set(), [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "img" and a.get("src"):
            self.images.append(a["src"])


def _parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def _pages(site_dir: Path) -> list[Path]:
    return sorted(site_dir.glob("*.html"))


def test_the_site_builds_in_reading_order_within_the_limit(site):
    from helpers import site as book

    # the build time is a figure (the target is under 60 s here), printed, not asserted
    print(f"the site built in {site['seconds']:.1f} s (target under {BUILD_LIMIT_S} s on the 2-core machine)")
    names = [p.name for p in _pages(site["dir"])]
    rows = book.sections()
    assert len(rows) == 23
    assert {f"{p.stem}.html" for _, p, _ in rows} | {"index.html", "errata.html", "search.html"} <= set(names)
    # reading order: the index links the sections in the README's order, and so does the sidebar
    index = (site["dir"] / "index.html").read_text()
    order = [index.index(f'href="{p.stem}.html"') for _, p, _ in rows]
    assert order == sorted(order)
    for section, path, _ in rows:
        text = (site["dir"] / f"{path.stem}.html").read_text()
        assert section in re.search(r"<title>(.*?)</title>", text, re.S).group(1), section
        assert "Run this notebook" in text and f"Claims ledger of {section}" in text
    assert not list(site["dir"].glob("_sources")), "the notebooks' sources are not shipped twice"


def test_every_internal_link_and_anchor_resolves(site):
    from helpers import claims

    site_dir = site["dir"]
    parsed = {p.name: _parse(p) for p in _pages(site_dir)}
    broken, checked = [], 0
    for name, page in parsed.items():
        for href in page.links:
            parts = urlsplit(href)
            if parts.scheme in ("http", "https", "mailto") or href.startswith("javascript:"):
                continue
            target = name if not parts.path else unquote(parts.path)
            file = (site_dir / name).parent / target
            if not file.exists():
                broken.append(f"{name}: {href} (no file)")
                continue
            checked += 1
            if parts.fragment and file.suffix == ".html":
                ids = parsed[file.name].ids if file.name in parsed else _parse(file).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{name}: {href} (no anchor)")
    assert not broken, "\n".join(broken[:30])
    # every ledger row's "where" is a link on its section's page (its two tables: errata, ledger)
    for path in claims.CLAIMS_DIR.glob("*.csv"):
        rows = claims.load_file(path)
        links = [h for h in parsed[f"{path.stem}.html"].links if h.startswith("#")]
        errs = [r for r in rows if r["verdict"] in claims.ERRATA_VERDICTS]
        assert len(links) >= len(rows) + len(errs), path.stem
    assert checked > 500


def _nonblank(path: Path) -> float:
    import matplotlib.image as mpimg

    rgb = mpimg.imread(str(path))[..., :3]
    return float((rgb.min(axis=-1) < 0.9).mean())


RAW_MATH = """() => {
  const body = document.querySelector('main') || document.body;
  const copy = body.cloneNode(true);
  copy.querySelectorAll('pre, code, script, style, mjx-container').forEach(n => n.remove());
  const text = copy.innerText;
  const found = text.match(/\\$[^$\\n]{1,80}\\$|\\\\\\(|\\\\\\[/g) || [];
  return {raw: found.slice(0, 5), rendered: document.querySelectorAll('mjx-container svg').length,
          sources: document.querySelectorAll('.math').length};
}"""
IMAGES = """() => Promise.all(Array.from(document.images).map(async im => {
  let ok = true; try { await im.decode(); } catch (e) { ok = false; }
  return {src: im.getAttribute('src'), ok, nw: im.naturalWidth, nh: im.naturalHeight};
}))"""
MATHJAX_DONE = """() => (window.MathJax && MathJax.startup && MathJax.startup.promise)
  ? MathJax.startup.promise.then(() => true) : false"""


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _open(browser, url: str):
    pg = browser.new_page(viewport=VIEWPORT)
    pg.errors, pg.outside = [], []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(f"page error: {e}"))

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            pg.outside.append(r.request.url)
            r.abort()

    pg.route("**/*", route)
    pg.goto(url, wait_until="load")
    return pg


def test_every_page_loads_offline_with_math_images_and_no_errors(site, browser):
    site_dir = site["dir"]
    problems, math_pages = [], 0
    for path in _pages(site_dir):
        pg = _open(browser, path.as_uri())
        try:
            has_mathjax = pg.evaluate(MATHJAX_DONE)
            math = pg.evaluate(RAW_MATH)
            images = pg.evaluate(IMAGES)
            width = pg.evaluate("document.documentElement.scrollWidth")
            pg.wait_for_timeout(50)
            if pg.errors:
                problems.append(f"{path.name}: console errors {pg.errors[:3]}")
            if pg.outside:
                problems.append(f"{path.name}: requests leaving the site {pg.outside[:3]}")
            if path.name not in ("search.html", "genindex.html") and not has_mathjax:
                problems.append(f"{path.name}: MathJax did not load")
            if math["raw"]:
                problems.append(f"{path.name}: raw math left {math['raw']}")
            if math["sources"] and math["rendered"] == 0:
                problems.append(f"{path.name}: {math['sources']} formulas, none rendered")
            math_pages += math["rendered"] > 0
            if width > VIEWPORT["width"]:
                problems.append(f"{path.name}: {width} px wide, scrolls sideways at {VIEWPORT['width']}")
            for im in images:
                if not im["ok"] or im["nw"] == 0:
                    problems.append(f"{path.name}: image {im['src']} does not decode")
                elif im["src"].startswith("_images/") and im["src"].endswith(".png"):
                    if _nonblank(site_dir / im["src"]) <= 0.01:
                        problems.append(f"{path.name}: image {im['src']} is blank")
        finally:
            pg.close()
    assert not problems, "\n".join(problems[:40])
    assert math_pages >= 15  # most sections have formulas: the check above saw them rendered


def _unique_term(site_dir: Path) -> tuple[str, str]:
    """A term of the search index that occurs on exactly one notebook page, and that page."""
    text = (site_dir / "searchindex.js").read_text()
    index = json.loads(text[text.index("(") + 1:text.rindex(")")])
    docs = index["docnames"]
    for term, where in sorted(index["terms"].items()):
        hits = [where] if isinstance(where, int) else where
        if len(term) < 9 or not term.isalpha() or len(set(hits)) != 1:
            continue
        doc = docs[hits[0]]
        if doc in ("index", "errata"):
            continue
        pages_with = [p for p in _pages(site_dir) if term in p.read_text().lower()]
        if [p.stem for p in pages_with] == [doc]:  # the word itself, not only its stem, is on that page alone
            return term, doc
    raise AssertionError("no term occurs on one page only")


def test_the_search_finds_a_term_on_one_page_only(site, browser):
    site_dir = site["dir"]
    term, doc = _unique_term(site_dir)
    pg = _open(browser, (site_dir / "index.html").as_uri())
    try:  # as a reader: the search button, the term typed into the box, Enter
        pg.locator("button.search-button__button:visible").first.click()
        box = pg.locator("#pst-search-dialog input[type=search]")
        box.fill(term)
        with pg.expect_navigation():
            box.press("Enter")
        assert pg.url.split("/")[-1].startswith(f"search.html?q={term}"), pg.url
        pg.wait_for_function("document.querySelector('#search-results p.search-summary') !== null",
                             timeout=30_000)
        hits = pg.evaluate("Array.from(document.querySelectorAll('#search-results ul.search li a'))"
                           ".map(a => a.getAttribute('href'))")
        assert not pg.errors and not pg.outside, (pg.errors, pg.outside)
    finally:
        pg.close()
    pages = sorted({h.split("#")[0].split("?")[0] for h in hits})
    assert pages == [f"{doc}.html"], (term, hits)


def test_the_errata_page_sorts_by_section_and_verdict(site, browser):
    pg = _open(browser, (site["dir"] / "errata.html").as_uri())
    try:
        col = """(i) => Array.from(document.querySelectorAll('section#all-errata table tbody tr'))
                 .map(r => r.cells[i].textContent.trim())"""
        before = pg.evaluate(col, 5)
        assert len(before) > 100 and before != sorted(before)  # in section order, not by verdict
        pg.click("section#all-errata table thead th:nth-child(6)")  # verdict
        verdicts = pg.evaluate(col, 5)
        assert verdicts == sorted(verdicts) and sorted(verdicts) == sorted(before)
        pg.click("section#all-errata table thead th:nth-child(1)")  # section, natural order
        pg.click("section#all-errata table thead th:nth-child(1)")  # again: reversed
        back = pg.evaluate(col, 0)
        key = lambda s: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]
        assert back == sorted(back, key=key, reverse=True) and "P.10" in back
        assert back.index("P.10") < back.index("P.9")  # P.10 after P.9 when ascending
        assert not pg.errors and not pg.outside, (pg.errors, pg.outside)
    finally:
        pg.close()
