"""The workbook's helper package: the math, the launcher, the worker code, plots and checks.

Each module serves named sections of the two chapters (see its docstring). Import what you need,
e.g. ``from helpers.launcher import launch``; importing ``helpers`` itself is cheap.

The folders (README.md, "What is inside", has the map): ``launcher/`` (running a function on
ranks from a notebook, and the rank side), ``fake_world/`` (one rank of a large job on torch's
fake process group), ``course/`` (exercises, student editions, the claims ledger, notebook files),
and one package per concept whose parts read in one sitting (``planner/``, ``tensor_parallel/``,
``ring_attention/``, ``zero/``, ``failures/``); every other concept is one module here.

Modules that moved into a folder keep their old import path (``helpers.worker`` is
``helpers.launcher.worker``, the same module object): notebooks, pickled functions and readers'
own code written against the flat layout keep working. :data:`MOVED` lists them.
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

__version__ = "0.1.0"

# old path under helpers. -> where the module lives now
MOVED = {
    "planner_specs": "planner.specs", "planner_assess": "planner.assess", "planner_recipes": "planner.recipes",
    "tp_layers": "tensor_parallel.layers", "tp_block": "tensor_parallel.block", "tp_costs": "tensor_parallel.costs",
    "ring_partition": "ring_attention.partition", "ring_kernel": "ring_attention.kernel",
    "ring_core": "ring_attention.core",
    "zero_numpy": "zero.reference", "zero_hand": "zero.hand",
    "failures_numpy": "failures.reference",
    "pool": "launcher.pool", "worker": "launcher.worker", "collect": "launcher.collect", "hang": "launcher.hang",
    "commlog": "launcher.commlog", "traces": "launcher.traces", "torchrun_main": "launcher.torchrun_main",
    "protocol": "launcher.protocol", "procfs": "launcher.procfs",
    "fake_step": "fake_world.step", "fake_cases": "fake_world.cases", "llama_model": "fake_world.llama_model",
    "exercises": "course.exercises", "student": "course.student", "claims": "course.claims",
    "errata": "course.errata", "nbexec": "course.nbexec", "nbfiles": "course.nbfiles", "prose": "course.prose",
    "readability": "course.readability", "site": "course.site", "doctor": "course.doctor",
}


class _AliasSpec(importlib.machinery.ModuleSpec):
    """The spec of an old path: named as asked, but with the real module's package, so that
    ``python -m helpers.<old>`` runs its relative imports from where the module lives."""

    def __init__(self, name, loader, real):
        super().__init__(name, loader, origin=real.origin, is_package=real.submodule_search_locations is not None)
        self.submodule_search_locations = real.submodule_search_locations
        self.real = real

    @property
    def parent(self):
        return self.real.parent


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``helpers.<old>`` (and ``helpers.<old>.<sub>``) of :data:`MOVED` and hands back the module
    at its new path, so that both names are one module (one set of globals, one class identity); the
    module keeps its own ``__spec__`` (reload, relative imports and runpy see its real name)."""

    @staticmethod
    def _target(fullname: str):
        head, _, rest = fullname.partition(".")
        if head != __name__ or not rest:
            return None
        first, _, tail = rest.partition(".")
        return f"{__name__}.{MOVED[first]}" + (f".{tail}" if tail else "") if first in MOVED else None

    def find_spec(self, fullname, path=None, target=None):
        real = self._target(fullname)
        spec = importlib.util.find_spec(real) if real is not None else None
        return None if spec is None else _AliasSpec(fullname, self, spec)

    def create_module(self, spec):
        module = importlib.import_module(spec.real.name)
        spec.loader_state = module.__spec__  # importlib sets __spec__ to the alias's: exec_module puts it back
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # already executed under its real name

    def get_code(self, fullname):  # python -m helpers.<old> (runpy asks the loader for the code)
        real = self._target(fullname) or fullname
        return importlib.util.find_spec(real).loader.get_code(real)


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.insert(0, _Moved())

# WORKBOOK_CHECK_FIGURES=1 (the suite sets it): in an IPython kernel, check every figure a cell
# displays and fail the cell on an unreadable one (helpers/course/readability.py). Costs nothing otherwise.
if os.environ.get("WORKBOOK_CHECK_FIGURES") == "1":
    from .course import readability as _readability

    _readability.install_if_asked()
