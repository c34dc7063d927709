"""Typed errors, split by what the caller should do about them.

`PermanentError`: retrying cannot help (bad input, a schema violation); the bus sends the message
to the dead-letter subject and the API answers with a problem response. `TemporaryError`: the same
work may succeed later (a dependency is down); the bus naks with `delay_s` so JetStream redelivers.
Every error carries structured fields so logs, Events and problem responses can name the bad value.
"""

from __future__ import annotations

from typing import Any


class AlnairError(Exception):
    """Base of every error this project raises on purpose."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

    def __str__(self) -> str:
        if not self.fields:
            return self.message
        details = ", ".join(f"{k}={v!r}" for k, v in sorted(self.fields.items()))
        return f"{self.message} ({details})"


class PermanentError(AlnairError):
    """Retrying will not help: the input itself is wrong."""


class TemporaryError(AlnairError):
    """The work may succeed if retried after `delay_s` seconds."""

    def __init__(self, message: str, delay_s: float = 1.0, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.delay_s = delay_s


class InvalidValueError(PermanentError):
    """A named field holds a value outside what is accepted."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        super().__init__(f"invalid {field}={value!r}: {reason}", field=field, value=value)
        self.field = field
        self.value = value
        self.reason = reason


class ConfigError(PermanentError):
    """Configuration that cannot work (a missing file, a contradictory setting)."""
