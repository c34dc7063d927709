"""What the README promises a user can run: every `make` target it names exists, and no script
folder that runs as `python bench/x.py` holds a file named like a standard-library module.

A script's own folder comes first on `sys.path`, so `bench/queue.py` once shadowed the
standard library's `queue` and broke every benchmark that imports redis or a process pool
(`make bench-predictor`, `make bench-elastic`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT_FOLDERS = ("bench", "tests", "hack")


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
