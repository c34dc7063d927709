"""`python -m alnair.scheduler`: run the live scheduler service."""

from alnair.scheduler.app import main

raise SystemExit(main())
