"""`python -m alnair.scheduler.dispatcher`: run the job dispatcher."""

from alnair.scheduler.dispatcher.app import main

raise SystemExit(main())
