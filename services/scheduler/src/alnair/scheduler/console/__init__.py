"""The console: a read-only web view of GPUs, queues and jobs, served by the scheduler's query
server (`routes.py`), its static files in `static/`, its live updates in `feed.py`."""
