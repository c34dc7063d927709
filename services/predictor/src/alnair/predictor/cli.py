"""`alnair predictor ...`: the predictor's command line.

`evaluate` runs the held-out evaluation (see `evaluation`) on the packaged Gavel data, or on
Gavel's own throughputs.json given with --data, and prints the figures as a table or, with
--json, as one JSON object (the form CI and the notes quote). `serve` runs the service, as
`python -m alnair.predictor` does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alnair.predictor.datasets import load_gavel
from alnair.predictor.evaluation import MODEL_KINDS, evaluate


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="alnair predictor", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    ev = commands.add_parser("evaluate", help="held-out evaluation of every model")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.add_argument("--data", type=Path, help="Gavel throughputs.json (default: packaged copy)")
    ev.add_argument(
        "--model",
        choices=[k for k in MODEL_KINDS if k != "baseline"],
        default="ratio",
        help="the model the service uses, reported as `chosen` (ratio: rf for co-location)",
    )
    ev.add_argument("--level", type=float, default=0.9, help="nominal interval coverage")
    ev.add_argument("--workers", type=int, help="processes (default: CPU cores, at most 4)")
    commands.add_parser("serve", help="run the predictor service (settings from environment)")
    return parser


def _table(result: dict[str, Any]) -> str:
    lines = [f"interval level {result['interval_level']}"]
    for question in ("a", "a_single_pair", "a_trial", "b"):
        lines.append(f"({question}) {result[question]['question']}")
        lines.append(f"    {'model':<9}{'MAPE':>8}{'median':>8}{'cover':>8}{'n':>6}")
        for kind, f in result[question]["models"].items():
            lines.append(
                f"    {kind:<9}{f['mape']:>8.1%}{f['median_ape']:>8.1%}"
                f"{f['coverage']:>8.1%}{f['n']:>6}"
            )
    lines.append(f"chosen: {result['chosen']['model']}; took {result['elapsed_s']} s")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if args.command == "serve":
        import asyncio

        from alnair.predictor.app import serve
        from alnair.predictor.settings import PredictorSettings

        return asyncio.run(serve(PredictorSettings()))
    if not 0.0 < args.level < 1.0:
        print(f"alnair predictor: --level must be in (0, 1), got {args.level}", file=sys.stderr)
        return 2
    if args.data is not None and not args.data.is_file():
        print(f"alnair predictor: --data {str(args.data)!r} is not a file", file=sys.stderr)
        return 2
    result = evaluate(load_gavel(args.data), args.model, args.level, workers=args.workers)
    print(json.dumps(result, indent=2) if args.json else _table(result))
    return 0
