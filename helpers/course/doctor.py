"""``./workbook doctor``: what this machine and environment are, for a bug report (issue 28).

Prints the platform, the Python, every package pinned in ``requirements.txt`` with the version
installed beside the pin, torch's build, the GPUs and NCCL it finds, and the backend and world
size a launch would pick: :func:`helpers.launcher.plan_ranks` for ``launch`` from a notebook,
:func:`helpers.launcher.torchrun_main.pick_backend` for torchrun, and whether the private torch APIs the
workbook uses are where it expects them (:func:`helpers.torch_private.probe`). It imports torch
only to ask it, and reports a missing or broken torch instead of failing. Exit status 1 when a
pinned package is missing or at another version (the report says which), else 0.

    python -m helpers.course.doctor            # what ./workbook doctor runs
"""
from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata
from pathlib import Path

from ..launcher import plan_ranks
from ..launcher.torchrun_main import pick_backend

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements.txt"


def pins(text: str) -> list[tuple[str, str]]:
    """``(name, specifier)`` of every requirement line (comments and blank lines dropped)."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name = line
        for i, ch in enumerate(line):
            if ch in "=<>!~;[ ":
                name = line[:i]
                break
        out.append((name.strip(), line[len(name):].strip()))
    return out


def _satisfies(version: str, spec: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version
    except ImportError:  # no packaging: an exact pin compared by hand, local label (+cpu) ignored
        return not spec or (spec.startswith("==") and version.split("+")[0] == spec[2:].strip())
    return not spec or SpecifierSet(spec).contains(Version(version), prereleases=True)


def check_pins(text: str, installed=None) -> list[tuple[str, str, str | None, bool]]:
    """``(name, pin, installed version or None, ok)`` per requirement; ``installed(name)`` gives a
    version or raises ``PackageNotFoundError`` (default: this environment's metadata)."""
    installed = installed or metadata.version
    out = []
    for name, spec in pins(text):
        try:
            have = installed(name)
        except metadata.PackageNotFoundError:
            out.append((name, spec, None, False))
            continue
        out.append((name, spec, have, _satisfies(have, spec)))
    return out


def torch_facts(torch=None) -> dict:
    """torch's version and build, the GPUs it sees, NCCL and gloo; ``{"error": ...}`` without torch."""
    if torch is None:
        try:
            import torch
        except Exception as exc:  # a missing or broken torch is what the report is for
            return {"error": f"{type(exc).__name__}: {exc}"}
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    facts = {
        "version": torch.__version__,
        "cuda_build": torch.version.cuda or "none (CPU build)",
        "gpus": gpus,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "distributed": dist.is_available(),
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl": dist.is_available() and dist.is_nccl_available(),
        "nccl_version": None,
    }
    if facts["nccl"] and gpus:
        try:
            facts["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:
            facts["nccl_version"] = f"unknown ({type(exc).__name__})"
    return facts


def private_apis() -> str:
    """The verdict of :func:`helpers.torch_private.probe`: all present, or which are missing."""
    from ..torch_private import verdict

    try:
        return verdict()
    except Exception as exc:  # a torch broken in another way: say so, the rest of the report still counts
        return f"torch private APIs: cannot be probed: {type(exc).__name__}: {exc}"


def report(requirements: Path | str = REQUIREMENTS, installed=None, torch=None) -> tuple[list[str], int]:
    """The doctor's lines and exit status (1 when a pin is missing or differs)."""
    lines = [
        f"platform: {platform.platform()} ({platform.system()} {platform.machine()})",
        f"python: {platform.python_version()} ({sys.executable})",
        f"workbook: {ROOT}",
        f"pinned packages ({Path(requirements).name}):",
    ]
    bad = []
    for name, spec, have, ok in check_pins(Path(requirements).read_text(), installed):
        state = "ok" if ok else ("MISSING" if have is None else "DIFFERENT")
        lines.append(f"  {name:<14} want {spec or '(any)':<12} have {have or '-':<16} {state}")
        if not ok:
            bad.append(name)
    facts = torch_facts(torch)
    if "error" in facts:
        lines.append(f"torch: cannot be imported: {facts['error']}")
    else:
        lines.append(f"torch: {facts['version']}, CUDA build {facts['cuda_build']}")
        names = ", ".join(facts["gpu_names"]) or "none"
        lines.append(f"GPUs: {facts['gpus']} ({names})")
        nccl = "yes" if facts["nccl"] else "no"
        if facts["nccl_version"]:
            nccl += f" (NCCL {facts['nccl_version']})"
        lines.append(f"torch.distributed: {'yes' if facts['distributed'] else 'no'}; gloo: "
                     f"{'yes' if facts['gloo'] else 'no'}; NCCL: {nccl}")
        lines.append(private_apis())

        lines.append(f"launch() from a notebook would run: {plan_ranks(gpus=facts['gpus']).describe()}")
        per_node = max(facts["gpus"], 1)
        lines.append(f"torchrun --nproc_per_node={per_node} would pick: "
                     f"backend={pick_backend(facts['gpus'], per_node)}")
    if bad:
        lines.append(f"not as pinned: {', '.join(bad)}")
        lines.append("  (./workbook reinstalls when requirements.txt changes; by hand: "
                     ".venv/bin/python -m pip install -r requirements.txt)")
    return lines, 1 if bad else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="./workbook doctor", description=__doc__.splitlines()[0])
    parser.parse_args(argv)  # no options: anything given is refused
    lines, status = report()
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
