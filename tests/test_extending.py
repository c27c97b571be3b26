"""Adding a family or a vLLM release touches its own folder and a few named files, and works.

docs/architecture.md has the two recipes ("Adding an engine family", "Adding a vLLM release").
Each test follows one on a copy of the source tree (cli/, replay/, traces/ and pyproject.toml,
installed nowhere: the copy is imported from PYTHONPATH, ahead of the editable install), runs
the result through the real CLI in a fresh process, and counts the files outside the new folder
whose bytes changed. If an addition needs an edit the recipe does not list, the run fails; if the
recipe grows, the count does: both are what the architecture promises (issue 42: at most 6 files
for a family, at most 2 for a release, the environment script among them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "replay", "traces")


def copy_tree(tmp: Path) -> Path:
    """The source as `specreplay.*` under tmp/src (and pyproject.toml beside it): the root of the copy."""
    src = tmp / "src"
    for name in PACKAGES:
        shutil.copytree(ROOT / name, src / "specreplay" / name, ignore=shutil.ignore_patterns("__pycache__", "corpus"))
    shutil.copy(ROOT / "pyproject.toml", src / "pyproject.toml")
    return src


def edit(path: Path, anchor: str, new: str) -> None:
    """Insert `new` after `anchor` (which must be there once: the recipe's place for it)."""
    text = path.read_text()
    assert text.count(anchor) == 1, f"{path}: the recipe's anchor moved: {anchor!r}"
    path.write_text(text.replace(anchor, anchor + new))


def touched_outside(src: Path, own: str) -> list[str]:
    """The files of the copy, outside `own` (a folder of the copy), that differ from the original
    or are new: what the addition had to touch elsewhere."""
    out = []
    for path in sorted(src.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(src)
        inside = rel.as_posix().removeprefix("specreplay/")
        if inside.startswith(own):
            continue
        original = ROOT / inside
        if not original.exists() or original.read_bytes() != path.read_bytes():
            out.append(inside)
    return sorted(out)


def specreplay(src: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [sys.executable, "-c", "from specreplay.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=src.parent,  # what a command writes lands beside the copy, not in it
    )


def test_the_copy_is_what_runs(tmp_path):
    """The copy, not the editable install, is imported (else the tests below prove nothing)."""
    src = copy_tree(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(src)}
    where = subprocess.run(
        [sys.executable, "-c", "import specreplay.replay.engines.registry as r; print(r.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(src)), where


def test_a_vllm_release_is_one_module_and_its_version(tmp_path):
    src = copy_tree(tmp_path)
    pkg = src / "specreplay"
    # 1. The release module: what changed from the release before it (here: nothing, a toy).
    (pkg / "replay/families/vllm/releases/v0_99.py").write_text(
        '"""vLLM 0.99.0: a toy release, 0.33.0\'s behaviour under a new number."""\n\n'
        "import dataclasses\n\n"
        "from specreplay.replay.families.vllm.releases.v0_33 import RELEASE as BEFORE\n\n"
        'RELEASE = dataclasses.replace(BEFORE, version="0.99.0")\n'
    )
    # 2. Its version among the modelled ones.
    edit(pkg / "replay/workloads/config.py", 'MODELLED_VERSIONS = ("0.32.0", "0.33.0", "0.34.0"', ', "0.99.0"')
    # 3. Its environment (the real wheel's install, scripts/vllm-X.Y.sh): outside the package.
    (src / "scripts").mkdir()
    (src / "scripts/vllm-0.99.sh").write_text("#!/bin/sh\n# the 0.99.0 wheel's environment (toy: none)\n")

    for version in ("0.99.0", "0.33.0"):
        ran = specreplay(src, "record", "--scenario", "reentry", "--vllm-version", version, "-o", f"{version}.parquet")
        assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    toy, before = (pq.read_table(tmp_path / f"{v}.parquet") for v in ("0.99.0", "0.33.0"))
    assert toy.equals(before)  # the same behaviour, row for row
    assert (
        json.loads(pq.read_schema(tmp_path / "0.99.0.parquet").metadata[b"specreplay.config"])["vllm_version"]
        == "0.99.0"
    )

    touched = touched_outside(src, "replay/families/vllm/releases/")
    print(f"a vLLM release touched {len(touched)} files outside its folder: {touched}")
    assert touched == ["replay/workloads/config.py", "scripts/vllm-0.99.sh"]


TOY_RUNNER = '''"""A toy runner family: V1's reference runner under another name (tests/test_extending.py)."""

from specreplay.replay.families.vllm.v1.runner import GPUModelRunner


class ToyRunner(GPUModelRunner):
    """The toy family's reference model."""
'''


def test_an_engine_family_is_its_folder_and_four_registrations(tmp_path):
    src = copy_tree(tmp_path)
    pkg = src / "specreplay"
    # 1. Its folder: the reference model (here V1's, renamed) and whatever else it needs.
    toy = pkg / "replay/families/toy"
    toy.mkdir()
    (toy / "__init__.py").write_text('"""toy: a fourth runner family (tests/test_extending.py)."""\n')
    (toy / "runner.py").write_text(TOY_RUNNER)
    # 2. What its traces' readers ask: its line and how its worker view is drawn.
    edit(
        pkg / "traces/families.py",
        '        FamilyTraits("v1", EngineLine.VLLM, WorkerView.PERSISTENT_BATCH, "vLLM\'s V1 GPUModelRunner"),\n',
        '        FamilyTraits("toy", EngineLine.VLLM, WorkerView.PERSISTENT_BATCH, "a toy runner", " on the toy"),\n',
    )
    # 3. Its registry entry: the reference, the class it models, its observers.
    edit(
        pkg / "replay/engines/registry.py",
        "RUNNERS: dict[str, RunnerFamily] = {\n    family.name: family\n    for family in (\n",
        "        RunnerFamily(\n"
        '            "toy",\n'
        '            "a toy runner",\n'
        '            reference="specreplay.replay.families.toy.runner:ToyRunner",\n'
        '            real="toy.runner:ToyRunner",\n'
        "            observe=None,\n"
        '            env="",\n'
        "        ),\n",
    )
    # 4. The checker's codes that are about it (here: V1's, as its runner is V1's).
    edit(pkg / "replay/check/catalogue.py", 'V1 = ("v1",', ' "toy",')
    edit(pkg / "replay/check/catalogue.py", 'ALL = ("v1", "v2", "sglang"', ', "toy"')
    # 5. Its packages, installed.
    edit(
        pkg.parent / "pyproject.toml",
        '            "specreplay.replay.families.sglang",\n',
        '            "specreplay.replay.families.toy",\n',
    )

    ran = specreplay(src, "record", "--scenario", "reentry", "--runner", "toy", "-o", "toy.parquet")
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    v1 = specreplay(src, "record", "--scenario", "reentry", "--runner", "v1", "-o", "v1.parquet")
    assert v1.returncode == 0, v1.stderr
    toy_trace, v1_trace = (pq.read_table(tmp_path / f"{name}.parquet") for name in ("toy", "v1"))
    assert toy_trace.equals(v1_trace)  # V1's runner under another name: the same rows
    assert json.loads(pq.read_schema(tmp_path / "toy.parquet").metadata[b"specreplay.impl"])["runner_family"] == "toy"
    # Its findings are V1's: the checker ran V1's codes on it.
    diff = specreplay(src, "diff", "toy.parquet")
    assert "S5-draft-provenance" in diff.stdout and "Traceback" not in diff.stderr, diff.stdout + diff.stderr
    shown = specreplay(src, "show", "toy.parquet", "--request", "10")
    assert shown.returncode == 0 and "on the toy" in shown.stdout, shown.stdout + shown.stderr

    touched = touched_outside(src, "replay/families/toy/")
    print(f"an engine family touched {len(touched)} files outside its folder: {touched}")
    assert touched == [
        "pyproject.toml",
        "replay/check/catalogue.py",
        "replay/engines/registry.py",
        "traces/families.py",
    ]
