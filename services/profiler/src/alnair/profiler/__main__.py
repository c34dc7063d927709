"""`python -m alnair.profiler [agent|aggregator]`: run one profiler process.

Without an argument the role comes from ALNAIR_PROFILER_ROLE.
"""

from __future__ import annotations

import sys

from alnair.profiler.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["run", *sys.argv[1:]]))
