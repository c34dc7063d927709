"""What the README promises a user can run: every `make` target it names exists, and no script
folder that runs as `python bench/x.py` holds a file named like a standard-library module.

A script's own folder comes first on `sys.path`, so `bench/queue.py` once shadowed the
standard library's `queue` and broke every benchmark that imports redis or a process pool
(`make bench-predictor`, `make bench-elastic`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT_FOLDERS = ("bench", "tests", "hack")
BENCH_SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([a-z][a-z0-9-]*):", text, re.MULTILINE)}


def test_no_script_shadows_the_standard_library() -> None:
    shadowing = [
        str(p.relative_to(ROOT))
        for folder in SCRIPT_FOLDERS
        for p in (ROOT / folder).glob("*.py")
        if p.stem in sys.stdlib_module_names
    ]
    assert shadowing == [], f"these scripts shadow standard-library modules: {shadowing}"


def test_every_make_target_the_readme_names_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`make ([a-z][a-z0-9-]*)", readme))
    named |= set(re.findall(r"^make ([a-z][a-z0-9-]*)", readme, re.MULTILINE))
    assert {"demo", "test", "bench-elastic", "bench-predictor"} <= named
    missing = named - _make_targets()
    assert missing == set(), f"the README names make targets the Makefile lacks: {missing}"


@pytest.mark.parametrize("script", BENCH_SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_script_imports_as_make_runs_it(script: Path) -> None:
    """Everything a benchmark imports exists (a helper moved elsewhere once broke
    `make bench-elastic`): the script's module level runs as `python bench/x.py` runs it, its
    folder first on the path, without its `__main__` block."""
    check = (
        "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
        "runpy.run_path(sys.argv[2], run_name='import_check')"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, str(script.parent), str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{script.name} does not import:\n{done.stderr[-2000:]}"
