"""Both log formats carry a call's structured fields: JSON as keys, text as key=value."""

from __future__ import annotations

import json
import logging
import sys

from alnair.common.logs import JsonFormatter, TextFormatter


def _record(exc: bool = False) -> logging.LogRecord:
    try:
        if exc:
            raise ValueError("boom")
    except ValueError:
        info = sys.exc_info()
    else:
        info = None
    record = logging.LogRecord(
        "alnair.x", logging.WARNING, "f.py", 1, "reconcile failed", None, info
    )
    record.job = "ns/a"
    record.error = "409 Conflict: the object has been modified"
    return record


def test_text_lines_say_what_went_wrong() -> None:
    line = TextFormatter().format(_record())
    assert line.endswith(
        'WARNING alnair.x: reconcile failed job="ns/a" '
        'error="409 Conflict: the object has been modified"'
    ), line


def test_a_traceback_stays_below_the_line_with_its_fields() -> None:
    first, *rest = TextFormatter().format(_record(exc=True)).splitlines()
    assert first.endswith('error="409 Conflict: the object has been modified"')
    assert rest[0].startswith("Traceback") and rest[-1] == "ValueError: boom"


def test_json_lines_carry_the_same_fields() -> None:
    doc = json.loads(JsonFormatter().format(_record()))
    assert (doc["msg"], doc["job"], doc["level"]) == ("reconcile failed", "ns/a", "warning")
