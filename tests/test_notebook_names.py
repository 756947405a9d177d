"""Every notebook imports each helper module under the one name CONTRIBUTING.md lists for it."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _table() -> dict:
    """{module: name} from the table of CONTRIBUTING.md's "One name per helper module" section."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("## One name per helper module", 1)[1].split("\n## ", 1)[0]
    pairs = re.findall(r"\| `(\w+)` \| `(\w+)` ", section)
    return dict(pairs)


def _imports(source: str):
    """(module, name) for every ``from helpers import a as b, c`` line of a cell."""
    for line in source.splitlines():
        m = re.match(r"\s*from helpers import ([\w ,]+)$", line)
        for part in (m.group(1).split(",") if m else []):
            mod, _, alias = part.strip().partition(" as ")
            yield mod.strip(), (alias or mod).strip()


def test_the_table_names_every_helper_module_once():
    table = _table()
    import helpers

    modules = ({p.stem for p in (ROOT / "helpers").glob("*.py")} | {p.parent.name for p in (ROOT / "helpers").glob("*/__init__.py")}
               | set(helpers.MOVED))  # the old paths of moved modules still import (helpers/__init__.py)
    assert len(table) >= 25 and set(table) <= modules, set(table) - modules
    assert len(set(table.values())) == len(table), "two modules share a name"


def test_notebooks_use_the_names_of_the_table():
    table, wrong = _table(), []
    for nb in sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                for mod, alias in _imports("".join(cell["source"])):
                    if table.get(mod) != alias:
                        wrong.append(f"{nb.name}: helpers.{mod} imported as {alias!r}, CONTRIBUTING.md says {table.get(mod)!r}")
    assert not wrong, "\n".join(wrong)
