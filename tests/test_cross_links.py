"""Issue 29, point 4: where a chapter-12 notebook and a Part P notebook treat the same thing, each
links the other; and every link between notebooks lands on a notebook and a heading that exist."""
import json
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)
LINK = re.compile(r"\]\(((?:[^)\s]*/)?(\w+)\.ipynb)(#[^)\s]*)?\)")


def _markdown(path):
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]


def _anchors(path):
    """JupyterLab's anchors: a heading's rendered text (no code or emphasis marks) with its spaces as '-'."""
    return {"#" + re.sub(r"[`*]", "", line.lstrip("#").strip()).replace(" ", "-")
            for text in _markdown(path) for line in text.splitlines() if line.startswith("#")}


def _links():
    out = defaultdict(list)  # notebook -> [(target path, target stem, anchor)]
    for path in NOTEBOOKS:
        for text in _markdown(path):
            for target, stem, anchor in LINK.findall(text):
                if stem != path.stem:
                    out[path].append(((path.parent / target).resolve(), stem, anchor))
    return out


def test_every_link_between_notebooks_lands_on_a_heading():
    bad = []
    for path, links in _links().items():
        for target, stem, anchor in links:
            if not target.is_file():
                bad.append(f"{path.name} links {stem}.ipynb, which is not at {target.relative_to(ROOT)}")
            elif anchor and anchor not in _anchors(target):
                bad.append(f"{path.name} links {stem}.ipynb{anchor}: no such heading")
    assert not bad, "\n".join(bad)


def test_links_between_the_two_parts_go_both_ways():
    links = {p.stem: {stem for _, stem, _ in ls} for p, ls in _links().items()}
    one_way = [f"{a} -> {b}" for a, targets in links.items() for b in targets
               if (a[0] == "p") != (b[0] == "p") and a not in links.get(b, set())]
    assert not one_way, "a chapter-12 / Part P link with no link back:\n" + "\n".join(sorted(one_way))
