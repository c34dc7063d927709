"""The job simulator: Gavel's Philly-derived arrivals replayed through the queueing policies.

`workload` turns the shipped trace and throughputs into jobs (true runtimes, memory, teams,
predictions), `engine` is the event-driven replay that calls a `alnair.scheduler.queueing`
policy on every arrival and completion, `cli` is `alnair simulate-jobs`; `bench/job_queue.py`
(`make bench-queue`) runs every policy through it.
"""
