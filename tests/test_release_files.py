"""The files that let a reader adopt, cite and correct the workbook (issue 28, points 3, 4, 5, 7):
licences, CITATION.cff (validated against the CFF 1.2.0 schema), the changelog and one version,
the GitHub issue forms, ``./workbook doctor`` and the notice on other platforms."""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import jsonschema
import pytest
import yaml

import helpers
from helpers import claims, doctor
from helpers.launcher import plan_ranks

ROOT = Path(__file__).resolve().parent.parent
FORMS = ROOT / ".github" / "ISSUE_TEMPLATE"
# The CFF 1.2.0 schema as cffconvert 2.0.0 ships it (cffconvert/schemas/1.2.0/schema.json). cffconvert
# itself is not installed: it requires jsonschema<4, and JupyterLab's jupyter-events needs >=4.18.
CFF_SCHEMA = ROOT / "tests" / "data" / "cff-schema-1.2.0.json"


# ---- licences ------------------------------------------------------------------------------------

def test_licences_are_there_and_the_readme_says_which_files_fall_under_which():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    cc = (ROOT / "LICENSES" / "CC-BY-4.0.txt").read_text()
    assert cc.startswith("Attribution 4.0 International")
    for section in range(1, 9):  # the whole legal code, not an excerpt
        assert f"Section {section} " in cc, section
    readme = (ROOT / "README.md").read_text()
    part = readme.split("\n## Licence\n", 1)[1].split("\n## ", 1)[0]
    for needle in ("[MIT licence](LICENSE)", "LICENSES/CC-BY-4.0.txt", "helpers/", "markdown cells",
                   "No chapter text"):
        assert needle in part, needle


# ---- citation, changelog, one version ------------------------------------------------------------

def _cff() -> dict:
    return yaml.safe_load((ROOT / "CITATION.cff").read_text())


def _cff_errors(data: dict) -> list[str]:
    schema = json.loads(CFF_SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return [e.message for e in validator.iter_errors(data)]


def test_citation_cff_is_valid_cff_1_2_0():
    schema = json.loads(CFF_SCHEMA.read_text())
    assert schema["$id"] == "https://citation-file-format.github.io/1.2.0/schema.json"
    data = _cff()
    # YAML would read an unquoted date as a datetime.date; CFF validators read the text, so keep it quoted
    assert data["cff-version"] == "1.2.0" and isinstance(data["date-released"], str)
    assert _cff_errors(data) == []


@pytest.mark.parametrize("spoil, match", [
    (lambda d: d.pop("authors"), "'authors' is a required property"),
    (lambda d: d.update(license="MIT-ish"), "is not valid under any of the given schemas|is not one of"),
    (lambda d: d.update({"date-released": "1 December 2026"}), "does not match|is not a 'date'"),
    (lambda d: d.update(titel="typo"), "Additional properties are not allowed"),
])
def test_the_cff_validator_rejects_a_spoiled_file(spoil, match):
    data = copy.deepcopy(_cff())
    spoil(data)
    errors = _cff_errors(data)
    assert errors and any(re.search(match, e) for e in errors), errors


def _changelog_versions() -> list[str]:
    text = (ROOT / "CHANGELOG.md").read_text()
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, flags=re.M)


def test_changelog_keeps_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n") and "keepachangelog.com/en/1.1.0" in text
    assert "\n## [Unreleased]\n" in text
    heads = re.findall(r"^## .*$", text, flags=re.M)
    assert all(re.fullmatch(r"## \[(Unreleased|\d+\.\d+\.\d+)\]( - \d{4}-\d{2}-\d{2})?", h) for h in heads), heads
    kinds = set(re.findall(r"^### (.*)$", text, flags=re.M))
    assert kinds and kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds
    assert _changelog_versions(), "no released version in CHANGELOG.md"


def test_one_version_everywhere():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert helpers.__version__ == version
    assert str(_cff()["version"]) == version
    assert _changelog_versions()[0] == version  # the latest release is the current version
    cff_date = _cff()["date-released"]
    assert f"## [{version}] - {cff_date}" in (ROOT / "CHANGELOG.md").read_text()
    assert re.findall(r"\bVersion (\d+\.\d+\.\d+)\b", (ROOT / "README.md").read_text()) == [version]


# ---- the issue forms -----------------------------------------------------------------------------

FIELD_TYPES = {"markdown", "input", "textarea", "dropdown", "checkboxes"}


def _form(name: str) -> dict:
    return yaml.safe_load((FORMS / name).read_text())


def form_problems(form: dict) -> list[str]:
    """What GitHub's issue-form schema would refuse, as far as these forms use it."""
    out = []
    for key in ("name", "description", "body"):
        if not form.get(key):
            out.append(f"missing top-level {key!r}")
    if not isinstance(form.get("labels"), list) or not form.get("labels"):
        out.append("no labels")
    ids = []
    body = form.get("body") or []
    if not any(item.get("type") != "markdown" for item in body):
        out.append("no input field")
    for n, item in enumerate(body):
        kind, attrs = item.get("type"), item.get("attributes")
        if kind not in FIELD_TYPES:
            out.append(f"body[{n}]: type {kind!r} is not one of {sorted(FIELD_TYPES)}")
        if not isinstance(attrs, dict):
            out.append(f"body[{n}]: no attributes")
            continue
        if kind == "markdown":
            if not attrs.get("value"):
                out.append(f"body[{n}]: markdown without a value")
            continue
        if not item.get("id") or not re.fullmatch(r"[A-Za-z0-9_-]+", item["id"]):
            out.append(f"body[{n}]: needs an id of letters, digits, - and _")
        ids.append(item.get("id"))
        if not attrs.get("label"):
            out.append(f"body[{n}]: no label")
        if kind in ("dropdown", "checkboxes"):
            options = attrs.get("options") or []
            if not options or len(set(map(str, options))) != len(options):
                out.append(f"body[{n}]: options must be non-empty and unique")
        required = (item.get("validations") or {}).get("required", False)
        if not isinstance(required, bool):
            out.append(f"body[{n}]: validations.required must be true or false")
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        out.append(f"ids repeated: {dup}")
    return out


@pytest.mark.parametrize("name, label", [("erratum.yml", "erratum"), ("bug.yml", "bug")])
def test_issue_forms_are_well_formed(name, label):
    form = _form(name)
    assert form_problems(form) == []
    assert label in form["labels"]


def test_the_form_check_rejects_broken_forms():
    form = _form("erratum.yml")
    broken = copy.deepcopy(form)
    broken["body"][2]["id"] = broken["body"][1]["id"]
    broken["body"][3]["type"] = "text"
    del broken["body"][4]["attributes"]
    del broken["labels"]
    problems = " | ".join(form_problems(broken))
    for needle in ("ids repeated", "type 'text'", "no attributes", "no labels"):
        assert needle in problems, problems


# found_by says which audit found a row; a reader's report is triaged first, so it is set then
SET_AT_TRIAGE = {"found_by"}


def test_the_erratum_form_asks_for_the_ledgers_columns():
    items = {item["id"]: item for item in _form("erratum.yml")["body"] if item["type"] != "markdown"}
    assert set(items) == set(claims.COLUMNS) - SET_AT_TRIAGE
    sections = {r["section"] for r in claims.load()}
    assert set(items["section"]["attributes"]["options"]) == sections
    assert set(items["verdict"]["attributes"]["options"]) == set(claims.VERDICTS)
    for column in ("section", "claim", "book_value", "our_value", "verdict", "why"):
        assert items[column]["validations"]["required"] is True, column


def test_the_bug_form_asks_for_the_doctors_output():
    items = {item["id"]: item for item in _form("bug.yml")["body"] if item["type"] != "markdown"}
    doc = items["doctor"]
    assert "./workbook doctor" in doc["attributes"]["label"] + doc["attributes"]["description"]
    assert doc["validations"]["required"] is True and doc["attributes"]["render"] == "text"


# ---- ./workbook doctor ---------------------------------------------------------------------------

def test_doctor_reports_this_environment():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "helpers.course.doctor"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env=env)
    text = out.stdout
    lines = text.splitlines()
    import platform

    import torch

    assert f"python: {platform.python_version()} ({sys.executable})" in lines
    assert lines[0].startswith(f"platform: {platform.platform()}")
    pinned = doctor.pins((ROOT / "requirements.txt").read_text())
    assert [n for n, _ in pinned][:2] == ["torch", "numpy"] and len(pinned) >= 10
    status = 0
    for name, spec in pinned:
        row = next(line for line in lines if line.split()[:1] == [name])
        have = metadata.version(name)
        assert f"want {spec}" in row and f"have {have}" in row, row
        ok = doctor._satisfies(have, spec)
        assert row.endswith(" ok" if ok else " DIFFERENT"), row
        status |= not ok
    assert out.returncode == status, out.stderr
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert f"torch: {torch.__version__}," in text and f"GPUs: {gpus} " in text
    assert f"NCCL: {'yes' if torch.distributed.is_nccl_available() else 'no'}" in text
    assert f"launch() from a notebook would run: {plan_ranks(gpus=gpus).describe()}" in lines


def test_doctor_flags_a_missing_or_different_pin(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("# a comment\ntorch==2.13.0\nnumpy==0.0.1  # too old\nno-such-package-xyz==1.0\n\n")
    versions = {"torch": "2.13.0+cpu", "numpy": "2.4.6"}

    def installed(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    lines, status = doctor.report(req, installed=installed)
    rows = {line.split()[0]: line for line in lines if line.startswith("  ")}
    assert rows["torch"].endswith(" ok")  # the local label (+cpu) satisfies ==2.13.0, as for pip
    assert rows["numpy"].endswith(" DIFFERENT") and "have 2.4.6" in rows["numpy"]
    assert rows["no-such-package-xyz"].endswith(" MISSING")
    assert status == 1 and "not as pinned: numpy, no-such-package-xyz" in lines[-2]


def test_doctor_without_torch_says_so():
    code = ("import sys; sys.modules['torch'] = None\n"  # import torch now raises ImportError
            "from helpers import doctor; lines, status = doctor.report(installed=lambda n: '0'); "
            "print('\\n'.join(lines))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert "torch: cannot be imported: ModuleNotFoundError" in out.stdout and "GPUs:" not in out.stdout


def test_torchrun_backend_choice_and_no_options():
    from helpers.launcher.torchrun_main import pick_backend

    assert pick_backend(0, 1) == "gloo" and pick_backend(8, 8) == "nccl" and pick_backend(4, 8) == "gloo"
    with pytest.raises(SystemExit) as exc:
        doctor.main(["--verbose"])  # the doctor has no options: anything given is refused
    assert exc.value.code == 2


# ---- platforms -----------------------------------------------------------------------------------

@pytest.mark.parametrize("system, notice", [("Linux", False), ("Darwin", True), ("MINGW64_NT-10.0", True)])
def test_workbook_names_the_platforms_it_is_not_tested_on(tmp_path, system, notice):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uname").write_text(f"#!/bin/sh\necho {system}\n")
    (fake / "uname").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    out = subprocess.run([str(ROOT / "workbook"), "no-such-command"], capture_output=True, text=True,
                         timeout=30, env=env)
    assert out.returncode == 2 and "usage: ./workbook" in out.stderr  # nothing set up for a bad command
    first = out.stderr.splitlines()[0]
    if notice:
        assert first == (f'note: the workbook is tested on Linux only; on {system} see README.md, '
                         '"Platforms" (Windows: use WSL)')
    else:
        assert first.startswith("usage:")
    readme = (ROOT / "README.md").read_text()
    part = readme.split("\n## Platforms\n", 1)[1].split("\n## ", 1)[0]
    assert "**Linux**: tested" in part and "**macOS**" in part and "WSL" in part
