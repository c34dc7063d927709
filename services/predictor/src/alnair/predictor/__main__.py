"""`python -m alnair.predictor`: run the predictor service (settings from the environment)."""

from __future__ import annotations

import asyncio

from alnair.predictor.app import serve
from alnair.predictor.settings import PredictorSettings

if __name__ == "__main__":
    raise SystemExit(asyncio.run(serve(PredictorSettings())))
