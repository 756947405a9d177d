"""The mutation suite's list stays applicable as the code changes (benchmarks/mutants.py, issue 15).

Running the mutants takes minutes and is not part of the suite; this checks in milliseconds that
each mutation still names a snippet found exactly once in its file and tests that exist, and that
the list covers every module with a closed form or a distributed mechanism."""
import importlib.util
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutants", ROOT / "benchmarks" / "mutants.py")
mutants = sys.modules.setdefault("mutants", importlib.util.module_from_spec(spec))
spec.loader.exec_module(mutants)

COVERED = ["costs", "amdahl", "dag", "pipeline_schedule", "memory", "zero.reference", "planner.specs",
           "planner.assess", "planner.recipes", "intensity", "efficiency", "scaling",
           "failures.reference", "inference", "ring_attention.partition", "attention_numpy", "tp_numpy",
           "collectives", "ring_attention.core", "ring_attention.kernel", "zero.hand",
           "tensor_parallel.layers", "tensor_parallel.block", "pipeline_parallel", "data_parallel"]


def test_every_mutation_applies_once_and_names_existing_tests():
    ms = mutants.MUTATIONS
    assert len(ms) >= 30 and len({m.name for m in ms}) == len(ms)
    for m in ms:
        text = (ROOT / m.file).read_text()
        assert text.count(m.original) == 1, f"{m.name}: snippet found {text.count(m.original)} times in {m.file}"
        assert m.replacement != m.original and m.why
        files = [a for a in shlex.split(m.tests) if a.startswith("tests/")]
        assert files and all((ROOT / f.split("::")[0]).is_file() for f in files), m.name


def test_the_list_covers_every_module_with_a_closed_form_or_a_mechanism():
    # a module by its path under helpers/, dotted: "costs", "planner.assess", "zero.reference"
    mutated = {'.'.join(Path(m.file).relative_to('helpers').with_suffix('').parts).removesuffix('.__init__')
               for m in mutants.MUTATIONS}
    assert not set(COVERED) - mutated, sorted(set(COVERED) - mutated)
