"""A student never sees the answer (issue 25): every exercise of every student edition, run in a
real kernel once with its blank stub and once with a wrong answer, displays its check's message and
nothing that gives the answer away: no expected value, no line of the instructor's solution, no
traceback, nothing of ``helpers/course/exercises``.

The expected values are the instructor's: the solution cells of the exercises whose answer is a
value (not a launch) are executed in the same kernel and their answers read back; their printed
forms (``repr``, 3 to 6 significant digits, thousands separators, a percentage) must not appear
as a number of their own in what the failed check shows. One-digit integers are not searched for
(any sentence holds one), and a choice's options, which its messages list by design, are cut out
before its expected option is searched for.

What runs, in one kernel for the 23 notebooks (``%reset -f`` between them): the notebook's first
code cell (imports), then only the statements of the earlier cells that the exercises' answer and
check cells and the solutions use, found by an AST scan as tests/browser/test_browser.py's
``control_cells`` does, but per statement (P.3's ``A, Bm`` without the launch beside them); a
statement that calls a method of a needed name (``rng.normal``) counts as changing it. Only P.5's
fitted overhead needs a launch (2 ranks); the wrong answer of an exercise on the ranks is a Run of
one rank, launched once for the whole file.
"""
from __future__ import annotations

import ast
import builtins
import json
import re

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import nbexec, student

NOTEBOOKS = student.notebook_paths()
FORBIDDEN = ("Traceback", "helpers/course/exercises")
WRONG_RUN = '__import__("sys").modules["_answers_hidden"].run'


# ---- what to run: the statements the exercises need ------------------------------------------------

def _code(src: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in src.splitlines())


class _Names(ast.NodeVisitor):
    """Names a top-level statement binds, uses and changes (an item or attribute store, a method call
    made as a statement of its own)."""

    def __init__(self):
        self.binds, self.uses, self.local, self.changes, self.depth = set(), set(), set(), set(), 0

    def _scope(self, node, names=()):
        self.depth += 1
        self.local.update(names)
        self.generic_visit(node)
        self.depth -= 1

    def visit_FunctionDef(self, node):
        if self.depth == 0:
            self.binds.add(node.name)
        a = node.args
        args = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + [x.arg for x in (a.vararg, a.kwarg) if x]
        self._scope(node, args)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self._scope(node, [x.arg for x in node.args.args])

    def visit_ListComp(self, node):  # a comprehension's variables are its own
        self._scope(node)

    visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp

    def visit_Import(self, node):
        names = {(a.asname or a.name).split(".")[0] for a in node.names}
        (self.binds if self.depth == 0 else self.local).update(names)

    visit_ImportFrom = visit_Import

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self.uses.add(node.id)
        else:
            (self.binds if self.depth == 0 else self.local).add(node.id)

    def _base(self, node):
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    def visit_Attribute(self, node):
        if not isinstance(node.ctx, ast.Load) and self.depth == 0 and self._base(node):
            self.changes.add(self._base(node))
        self.generic_visit(node)

    visit_Subscript = visit_Attribute

    def visit_Expr(self, node):  # a call made for its effect: x.append(...), rng.shuffle(x)
        if self.depth == 0 and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
            self.changes.add(self._base(node.value.func))
        self.generic_visit(node)


def _statements(src: str) -> list[tuple[str, _Names]]:
    code = _code(src)
    out = []
    for stmt in ast.parse(code).body:
        names = _Names()
        names.visit(stmt)
        names.uses -= names.local
        out.append((ast.get_source_segment(code, stmt), names))
    return out


def _uses(src: str) -> set[str]:
    """Names a cell reads that neither it nor Python defines."""
    stmts = [n for _, n in _statements(src)]
    return set().union(*(n.uses for n in stmts)) - set().union(*(n.binds for n in stmts)) - set(dir(builtins))


def needed_statements(cells: list[str], uses: set[str], imported: set[str]) -> str:
    """The statements of ``cells`` (in order) that define or change the names ``uses`` needs,
    transitively; names ``imported`` (modules) are never changed by a method call."""
    stmts = [s for src in cells for s in _statements(src)]
    need, keep = set(uses), []
    for k in range(len(stmts) - 1, -1, -1):
        src, n = stmts[k]
        if n.binds & need or (n.changes - imported) & need:
            keep.append(k)
            need -= n.binds - n.changes - n.uses  # rebound whole here, unless it reads itself
            need |= n.uses
    return "\n".join(stmts[k][0] for k in sorted(keep))


# ---- the exercises of a notebook ------------------------------------------------------------------------

def _variables(stub: str) -> list[str]:
    """The names an answer cell's ``x = None`` / ``a, b = None, None`` lines set."""
    names = []
    for stmt in ast.parse(_code(stub)).body:
        values = stmt.value.elts if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Tuple) else [
            getattr(stmt, "value", None)]
        if isinstance(stmt, ast.Assign) and all(isinstance(v, ast.Constant) and v.value is None for v in values):
            for t in stmt.targets:
                names += [n.id for n in ast.walk(t) if isinstance(n, ast.Name)]
    return names


def _solution_lines(src: str) -> list[str]:
    body = src.partition(student.BEGIN)[2].partition(student.END)[0]
    return [ln.strip() for ln in body.splitlines() if len(ln.strip()) >= 10 and not ln.strip().startswith("#")]


def exercises(path):
    """Per exercise: the student's answer cell, its check, the instructor's answer cell, the answer's
    variables, and whether the instructor's solution is a value to execute (no launch in it)."""
    inst = nbformat.read(path, as_version=4)
    st = student.student_notebook(inst)
    code_i = [c for c in inst.cells if c.cell_type == "code"]
    code_s = [c for c in st.cells if c.cell_type == "code"]
    out = []
    for check in student.check_cells(st):
        k = code_s.index(check)
        names = _variables(code_s[k - 1].source)
        solution = code_i[k - 1].source
        value = all(n.startswith("answer") for n in names) and "launch(" not in solution
        out.append({"k": k, "stub": code_s[k - 1].source, "check": check.source, "solution": solution,
                    "names": names, "value": value})
    return code_s, out


DUMP = """import json as _json, numpy as _np
def _plain(v):
    if isinstance(v, _np.ndarray):
        v = v.tolist()
    if isinstance(v, _np.generic):
        v = v.item()
    kind = type(v).__name__
    if isinstance(v, (list, tuple)):
        v = [_plain(x)[1] for x in v]
    return kind, v if isinstance(v, (int, float, str, list)) else repr(v)
print(_json.dumps({n: _plain(globals()[n]) for n in %r}))
"""


# ---- what must not show ----------------------------------------------------------------------------

def _number_forms(v) -> set[str]:
    if isinstance(v, bool):
        return set()
    if isinstance(v, int):
        if abs(v) < 10:
            return set()
        forms = {str(v), f"{v:,}"}
        return forms | ({f"{float(v):.{d}g}" for d in (3, 4, 5, 6)} if abs(v) >= 1e6 else set())
    forms = {repr(v)} | {f"{v:.{d}g}" for d in (3, 4, 5, 6)}
    if v.is_integer():
        forms |= _number_forms(int(v))
    if abs(v) >= 1000:
        forms.add(f"{v:,.0f}")
    if 0 < abs(v) < 1:
        forms |= {f"{v:.1%}", f"{v:.2%}"}
    return {f for f in forms if sum(ch.isdigit() for ch in f.lstrip("-0.")) >= 2}


def value_forms(kind: str, v) -> set[str]:
    if kind in ("int", "float"):
        return _number_forms(v)
    if kind in ("list", "tuple", "ndarray") and isinstance(v, list):
        items = [repr(x) for x in v]
        return {f"[{', '.join(items)}]", f"({', '.join(items)})", f"[{' '.join(items)}]"}
    if kind == "str":
        return {repr(v), f'"{v}"'}
    return set()


def shows(text: str, form: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(form)}(?![\w]|\.\d)", text) is not None


# %reset -f also removes __main__'s __spec__, which multiprocessing reads to start ranks: put it back
RESET = "%reset -f\n__spec__ = __import__('sys').modules['_answers_hidden'].spec"
OPTIONS = re.compile(r"one of (\[.*?\])")


def displayed(cells) -> str:
    parts = []
    for c in cells:
        for o in c.outputs:
            if o.output_type == "stream":
                parts.append(o.text)
            elif o.output_type == "error":
                parts += [o.ename, o.evalue, *o.traceback]
            else:
                parts += [str(v) for k, v in o.get("data", {}).items() if k.startswith("text/")]
    return "\n".join(parts)


# ---- the wrong answers --------------------------------------------------------------------------------

def wrong_value(name: str, values: dict, options: list | None):
    """Source of a wrong answer for variable ``name``."""
    kind, v = values.get(name, (None, None))
    if options is not None:
        return repr(next(o for o in options if o != v))
    if kind == "int":
        return repr(3 * v + 1)
    if kind == "float":
        return repr(1.37 * v if v else 0.37)
    if kind in ("list", "tuple", "ndarray") and isinstance(v, list):
        items = ", ".join(repr(x + 1) for x in v)
        return f"({items})" if kind == "tuple" else f"[{items}]"
    if "run" in name.lower():
        return WRONG_RUN  # a Run, of the wrong world size
    return "0.123" if name.startswith("answer") else "42"  # an object of the wrong type


# ---- running -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    from jupyter_core.utils import run_sync

    km = nbexec.KernelManager(kernel_name="python3")
    run_sync(km.start_kernel)(cwd=str(tmp_path_factory.mktemp("kernel")))
    setup = ("import sys, types\nfrom helpers.launcher import launch\n"
             "sys.modules['_answers_hidden'] = types.ModuleType('_answers_hidden')\n"
             "sys.modules['_answers_hidden'].spec = __spec__\n"
             f"{WRONG_RUN} = launch(lambda: None, world_size=1, quiet=True)")
    _run([setup], km)
    yield km
    run_sync(km.shutdown_kernel)()


def _run(sources: list[str], km, metadata=None):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources], metadata=metadata or {})
    client = NotebookClient(nb, km=km, timeout=300, kernel_name="python3", allow_errors=True,
                            kernel_manager_class=nbexec.KernelManager)
    try:
        client.execute()
    finally:
        if client.kc is not None:
            client.kc.stop_channels()
    return nb.cells


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_failed_check_shows_the_answer(path, kernel):
    code, exs = exercises(path)
    first = code[0].source
    exercise_cells = {i for e in exs for i in (e["k"] - 1, e["k"])}
    before = [c.source for i, c in enumerate(code[:max(exercise_cells)]) if i and i not in exercise_cells]
    answers = {n for e in exs for n in e["names"]}
    uses = set().union(*(_uses(e["stub"]) | _uses(e["check"]) for e in exs),
                       *(_uses(e["solution"]) for e in exs if e["value"])) - answers
    firsts = {n for _, s in _statements(first) for n in s.binds}
    modules = {(a.asname or a.name).split(".")[0] for src in [first, *before]
               for node in ast.walk(ast.parse(_code(src))) if isinstance(node, (ast.Import, ast.ImportFrom))
               for a in node.names}
    setup = needed_statements(before, uses - firsts, modules)
    values = [n for e in exs if e["value"] for n in e["names"]]

    # 1. imports, the statements needed, the instructor's value solutions, then every blank stub and its check
    cells = [RESET, first, setup, *[e["solution"] for e in exs if e["value"]], DUMP % (values,)]
    blank_at = len(cells)
    for e in exs:
        cells += [e["stub"], e["check"]]
    ran = _run(cells, kernel)
    errors = [(i, o.ename, o.evalue) for i, c in enumerate(ran[:blank_at]) for o in c.outputs
              if o.output_type == "error"]
    assert not errors, f"{path.name}: the set-up failed: {errors}\n{setup}"
    got = json.loads(ran[blank_at - 1].outputs[-1].text)
    blank = {j: ran[blank_at + 2 * j: blank_at + 2 * j + 2] for j in range(len(exs))}

    # 2. every wrong answer and its check
    options, wrong_cells = {}, []
    for j, e in enumerate(exs):
        m = OPTIONS.search(displayed(blank[j]))
        options[j] = ast.literal_eval(m.group(1)) if m else None
        sets = "".join(f"\n{n} = {wrong_value(n, got, options[j])}" for n in e["names"])
        wrong_cells += [e["stub"] + sets, e["check"]]
    ran = _run(wrong_cells, kernel)
    wrong = {j: ran[2 * j: 2 * j + 2] for j in range(len(exs))}

    problems = []
    for j, e in enumerate(exs):
        label = f"{path.stem} {e['check'].splitlines()[0]}"
        forms = set().union(*(value_forms(*got[n]) for n in e["names"] if n in got))
        for variant, cells_run in (("blank", blank[j]), ("wrong", wrong[j])):
            errs = [o for c in cells_run for o in c.outputs if o.output_type == "error"]
            want = "NotAnswered" if variant == "blank" else "CheckFailed"
            if [o.ename for o in errs] != [want] or cells_run[0].outputs and errs[0] in cells_run[0].outputs:
                problems.append(f"{label} ({variant}): expected one {want} from the check, got "
                                f"{[(o.ename, o.evalue) for o in errs]}")
                continue
            text = displayed(cells_run)
            searched = OPTIONS.sub("", text) if options[j] is not None else text
            seen = [s for s in FORBIDDEN if s in text]
            seen += [ln for ln in _solution_lines(e["solution"]) if ln in text]
            seen += [f for f in sorted(forms) if shows(searched, f)]
            if seen:
                problems.append(f"{label} ({variant}) shows {seen}:\n{text}")
    assert not problems, "\n".join(problems)


def test_the_search_finds_an_expected_value_in_its_printed_forms():
    assert "2.5" in value_forms("float", 4 * 20 / 32)  # P.6 ex. 2, the example
    assert shows("not quite: the loss scale is 2.5.", "2.5") and shows("(2.5)", "2.5")
    assert not shows("off by 12.5%", "2.5") and not shows("2.55 or 2.5e3", "2.5")
    assert any(shows("it holds 1,342,177,280 bytes", f) for f in value_forms("int", 1_342_177_280))
    assert any(shows("about 1.34e+09 bytes", f) for f in value_forms("float", 1_342_177_280.0))
    assert any(shows("a bubble of 23.4%", f) for f in value_forms("float", 0.234))
    assert value_forms("int", 8) == set() and value_forms("tuple", [1, 1, 1]) >= {"(1, 1, 1)"}
    cells = ["rng = np.random.default_rng(0)\nx = rng.normal(size=3)\nrun = launch(f, x, world_size=4)",
             "A = rng.normal(size=(4, 4)); B = launch(g)\nplt.show()"]
    got = needed_statements(cells, {"A"}, {"np", "plt"})
    assert got == "rng = np.random.default_rng(0)\nA = rng.normal(size=(4, 4))"
