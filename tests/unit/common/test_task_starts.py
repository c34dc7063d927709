"""Every task a service starts goes through `alnair.common.tasks` (`spawn` for long-lived
ones, `in_flight` for short ones): named, referenced until it ends, its failure logged. A bare
`create_task` or `ensure_future` can die without a word, or be collected while it runs."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from alnair.common.tasks import in_flight

ROOT = Path(__file__).resolve().parents[3]
SOURCES = [ROOT / "libs" / "common" / "src", *sorted((ROOT / "services").glob("*/src"))]
ALLOWED = {Path("alnair/common/tasks.py")}
BARE = {"create_task", "ensure_future"}


def bare_starts(path: Path, root: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in BARE:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return found


def test_no_service_starts_a_task_outside_the_guard() -> None:
    found = []
    for src in SOURCES:
        for path in sorted(src.rglob("*.py")):
            if path.relative_to(src) not in ALLOWED:
                found += bare_starts(path, src)
    assert SOURCES and not found, "start tasks with spawn or in_flight:\n" + "\n".join(found)


def test_the_check_finds_both_spellings(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import asyncio\n"
        "from asyncio import ensure_future\n"
        "async def f(coro):\n"
        "    asyncio.get_running_loop().create_task(coro)\n"
        "    ensure_future(coro)\n"
    )
    assert bare_starts(module, tmp_path) == ["m.py:4: create_task", "m.py:5: ensure_future"]


async def test_in_flight_holds_the_task_until_it_ends_and_names_its_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    held: set[asyncio.Task[Any]] = set()
    gate = asyncio.Event()

    async def work() -> None:
        await gate.wait()
        raise RuntimeError("the write was refused")

    task = in_flight(work(), name="test.write", into=held)
    await asyncio.sleep(0)
    assert held == {task}
    gate.set()
    with pytest.raises(RuntimeError):
        await task
    await asyncio.sleep(0)  # (done callbacks run on the next turn)
    assert not held
    failed = [r for r in caplog.records if r.getMessage() == "task failed"]
    assert [getattr(r, "task", None) for r in failed] == ["test.write"]
    assert "the write was refused" in str(failed[0].exc_info[1])
