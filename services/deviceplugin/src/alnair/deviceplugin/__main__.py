"""`python -m alnair.deviceplugin [run|devices|region]`: run the plugin (default) or a tool."""

from __future__ import annotations

import sys

from alnair.deviceplugin.cli import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or ["run"]))
