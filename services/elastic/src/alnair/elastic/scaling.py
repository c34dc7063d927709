"""A request to resize an ElasticJob (from the dispatcher over the bus, or a user through the
`scale` endpoint) and what the controller did with it: the size now, or why it refused.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScaleRequest:
    replicas: int
    reason: str = ""
    event_id: str = ""


@dataclass(frozen=True)
class Outcome:
    """What a pass did for a scale request: the size now, or why it was refused."""

    replicas: int | None
    previous: int | None
    refused: str = ""
    reason: str = ""
