"""The `alnair` command: one entry point whose subcommands the installed services provide.

Each service registers its subcommands in the `alnair.cli` entry-point group (for example the
scheduler registers `simulate`), so this module never imports a service and the command only
offers what is installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {ep.name: ep for ep in entry_points(group="alnair.cli")}
    if not args or args[0] in {"-h", "--help"}:
        print("usage: alnair <command> [args...]\n\ncommands:")
        for name in sorted(commands):
            print(f"  {name}")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in commands:
        known = ", ".join(sorted(commands)) or "none installed"
        print(f"alnair: unknown command {name!r} (known: {known})", file=sys.stderr)
        return 2
    run: Callable[[Sequence[str]], int] = commands[name].load()
    return int(run(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
