"""`alnair scheduler ...`: run the live scheduler, or list the placement policies."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="alnair scheduler")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run", help="run the live scheduler (settings from ALNAIR_* variables)")
    sub.add_parser("policies", help="list the placement policies")
    args = parser.parse_args(list(argv))
    if args.cmd == "policies":
        from alnair.scheduler.plugins.registry import POLICIES

        for p in POLICIES:
            print(f"{p.name:14} {p.summary}")
        return 0
    from alnair.scheduler.app import main as run

    return run()
