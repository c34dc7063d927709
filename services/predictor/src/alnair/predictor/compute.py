"""One place that decides how many threads model fitting may use.

The predictor's fits are small (hundreds to a few thousand rows) and run beside a serving event
loop on shared nodes. scikit-learn's histogram boosting starts an OpenMP thread per core; on a
busy two-core machine those threads spin against each other and a 0.7 s fit took 40 s. Fitting
single-threaded is both faster here and fair to the neighbours.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]


@contextmanager
def single_threaded() -> Iterator[None]:
    """Limit native thread pools (OpenMP, BLAS) to one thread inside the block."""
    with threadpool_limits(limits=1):
        yield
