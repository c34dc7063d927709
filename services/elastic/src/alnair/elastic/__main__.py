"""`python -m alnair.elastic`: run the ElasticJob controller (settings from the environment)."""

from __future__ import annotations

import asyncio

from alnair.elastic.app import serve
from alnair.elastic.settings import ElasticSettings

if __name__ == "__main__":
    raise SystemExit(asyncio.run(serve(ElasticSettings())))
